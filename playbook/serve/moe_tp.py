"""TP attention with expert-parallel experts, for serving a MoE model on t ranks (one replica).

Cut from the single-process MoE GPT (``model.gpt.build_moe``, no capacity limit) as vLLM serves a
MoE with ``--tensor-parallel-size t --enable-expert-parallel``:

- attention split by heads (Megatron, Shoeybi et al. 2019, arXiv:1909.08053, §3): a rank holds a/t
  query heads and the KV heads they read, ``max(g/t, 1)`` of the g. When t > g each KV head is
  projected and cached on t/g ranks, as vLLM replicates it (``theory.serving.moe_layouts``); the
  o projection is row-parallel and its partial sums meet in one all-reduce;
- every token on every rank, so every rank routes all of them the same way; each runs only its
  E/t experts on the rows routed to them, the other rows stay zero, and one all-reduce sums the
  experts' outputs (no all-to-all: the tokens are already everywhere);
- embedding, norms, router and head whole on every rank (a vocab-parallel head would add an
  all-gather of the logits and change nothing here).

``serve.generate.greedy`` decodes this model unchanged: it asks each block's attention for
``project``, its head counts, ``rope`` and ``o_proj``, and the model for ``embed`` and ``head``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from playbook.config import ModelConfig
from playbook.model.moe import MoEMLP
from playbook.parallel.comm import all_reduce
from playbook.theory.hybrid.memory import _kv_heads_per_rank


def _linear(weight: torch.Tensor) -> nn.Linear:
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    out.weight = nn.Parameter(weight.detach().clone())
    return out


class RowParallelOut(nn.Module):
    """o_proj on this rank's heads: y [.., a/t·d] @ W[:, cols]ᵀ, partial sums all-reduced -> [.., h]."""

    def __init__(self, weight: torch.Tensor, group, label: str):
        super().__init__()
        self.weight, self.group, self.label = nn.Parameter(weight.detach().clone()), group, label  # [h, a/t*d]

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return all_reduce(y @ self.weight.T, self.group, self.label, "forward")  # [.., h]


class HeadShardAttention(nn.Module):
    """This rank's a/t query heads and the max(g/t, 1) KV heads they read (replicated when t > g)."""

    def __init__(self, ref, rank: int, t: int, group, label: str):
        super().__init__()
        a, g, d = ref.n_heads, ref.kv_heads, ref.head_dim
        self.n_heads, self.head_dim = a // t, d
        self.kv_heads = int(max(g // t, 1))
        first_kv = rank * g // t if t <= g else rank // (t // g)  # query head j reads KV head j // (a/g)
        q = slice(rank * self.n_heads * d, (rank + 1) * self.n_heads * d)
        kv = slice(first_kv * d, (first_kv + self.kv_heads) * d)
        self.q_proj = _linear(ref.q_proj.weight[q])  # [a/t*d, h]
        self.k_proj = _linear(ref.k_proj.weight[kv])  # [kv*d, h]
        self.v_proj = _linear(ref.v_proj.weight[kv])  # [kv*d, h]
        self.o_proj = RowParallelOut(ref.o_proj.weight[:, q], group, label)  # [h, a/t*d]
        self.rope = ref.rope

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)  # [b, s, a/t*d], [b, s, kv*d] x2


class ReplicatedTokenExperts(MoEMLP):
    """A :class:`MoEMLP` whose tokens are on every rank: the same routing everywhere, this rank's
    E/t experts computed, the rest left zero, outputs summed by one all-reduce."""

    def __init__(self, moe: MoEMLP, rank: int, t: int, group, label: str):
        nn.Module.__init__(self)
        self.hidden, self.n_experts, self.top_k = moe.hidden, moe.n_experts, moe.top_k
        self.capacity_factor, self.aux_alpha, self.bias_rate = moe.capacity_factor, moe.aux_alpha, moe.bias_rate
        self.register_buffer("route_bias", moe.route_bias, persistent=False)
        self.per_rank = moe.n_experts // t
        self.first, self.group, self.label = rank * self.per_rank, group, label
        self.router, self.shared_experts = moe.router, moe.shared_experts
        self.experts = nn.ModuleDict({str(e): moe.experts[e] for e in range(self.first, self.first + self.per_rank)})
        self.aux_loss, self.stats = None, None

    def run_experts(self, xs: torch.Tensor, kept_by_rank: torch.Tensor) -> torch.Tensor:
        sizes = kept_by_rank[0].tolist()  # [E] rows per expert, xs grouped by expert
        outs = [
            self.experts[str(e)](chunk) if str(e) in self.experts else torch.zeros_like(chunk)
            for e, chunk in enumerate(xs.split(sizes))
        ]
        return torch.cat(outs) if outs else xs[:0]  # [S, h], zero where another rank's expert

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape  # [b, s, h]
        flat = x.reshape(-1, self.hidden)  # [T, h]
        y = all_reduce(self.routed(flat), self.group, self.label, "forward")  # [T, h] every rank's experts
        for shared in self.shared_experts:
            y = y + shared(flat)
        return y.view(shape)


class TPAttentionBlock(nn.Module):
    def __init__(self, ref, rank: int, t: int, group, i: int):
        super().__init__()
        self.attn_norm, self.mlp_norm = ref.attn_norm, ref.mlp_norm
        self.attn = HeadShardAttention(ref.attn, rank, t, group, f"layer{i}.attn")
        self.mlp = ReplicatedTokenExperts(ref.mlp, rank, t, group, f"layer{i}.experts")


class TPAttentionMoE(nn.Module):
    """The MoE GPT on this rank of a t-rank TP-attention replica (experts over the same t ranks)."""

    def __init__(self, ref, group, rank: int, t: int):
        super().__init__()
        cfg: ModelConfig = ref.cfg
        _kv_heads_per_rank(cfg, t)  # raises one line unless t divides, or is a multiple of, the KV heads
        self.cfg, self.tok_emb, self.norm, self.lm_head = cfg, ref.tok_emb, ref.norm, ref.lm_head
        self.blocks = nn.ModuleList(TPAttentionBlock(b, rank, t, group, i) for i, b in enumerate(ref.blocks))

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok_emb(tokens)  # [b, s, h]

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x))  # [b, s, V]
