"""Tensor parallelism (Megatron-LM) and sequence parallelism, from scratch: ``playbook run tp``.

The idea (Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, §3). Split a weight by columns and
each rank computes its own slice of the output, with no communication: Y_i = X A_i (column
parallel). Feed that slice to a weight split by rows and each rank has a partial sum of the result:
Z = Σ_i Y_i B_i, one all-reduce (row parallel). A transformer layer is two such pairs: attention
(q, k, v column parallel by heads, o row parallel) and the SwiGLU MLP (gate, up column, down row).
Two conjugate operators mark each parallel region:

    f: identity forward, all-reduce backward   (enters a region: the input's gradient is partial)
    g: all-reduce forward, identity backward   (leaves a region: the output is partial)

so a layer costs 2 all-reduces of the [b, s, h] activation forward and 2 backward,
8bsh(t−1)/t bytes per rank per direction in 16-bit (``playbook.theory.tp.tp``).

Sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198, §4.2.2): an all-reduce is a
reduce-scatter followed by an all-gather. Keep the residual stream and the norms on sequence shards
[b, s/t, h], all-gather where a region starts and reduce-scatter where it ends (and the reverse in
backward): the same bytes, and the activations outside the regions are divided by t. The gathered
input of a region is still saved whole for the weight gradients, unless ``regather=True`` saves
its shard and all-gathers it again in backward, as Megatron-LM does (one more all-gather per
region in backward; then every saved tensor of a block is divided by t).

The vocabulary is split too: the embedding by rows (a rank looks up the tokens it owns, zeros the
rest, and g sums), the output head by columns, and the cross-entropy is computed from the logit
shards with two small all-reduces, so the [b, s, V] logits never exist on one rank.

Layout of this file: collectives, the conjugate operators, a ``Region`` (how one attention or MLP
block is entered and left), the parallel layers, the model sliced from the reference, training on
real ranks and ``playbook run tp``, and a matmul-throughput probe for "when TP stops paying".

Every collective is a traced ``torch.distributed`` call inside our own ``autograd.Function``
(``torch.distributed.nn.functional.all_gather`` returns wrong gradients on gloo for a
non-contiguous incoming gradient: the appendix's case 4), and sends ``.contiguous()`` buffers. Each runs inside a labelled span
(``tp:<region>:<phase>``) so the chapter can attribute the traced collectives to layers.
PyTorch's own DTensor version is in ``playbook/parallel/tp/native.py``.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from playbook.model.attention import Attention
from playbook.model.gpt import GPT
from playbook.theory.inventory.inventory import RECOMPUTE_MODES
from playbook.parallel.comm import all_reduce
from playbook.parallel.tp.layers import (
    ColumnParallelLinear,
    Region,
    RowParallelLinear,
    VocabParallelCrossEntropy,
    VocabParallelEmbedding,
    shard,
)
from playbook.theory.tp.layout import check_tp
from playbook.parallel.grads import shard_dims


# ---- the model, cut from the reference GPT ------------------------------------------------------
class TPAttention(Attention):
    """Heads split over ranks: a/t query heads and g/t key/value heads each (t must divide g).
    The reference ``Attention.forward`` runs unchanged on the local head counts; only ``project``
    differs: q, k and v enter the parallel region once."""

    def __init__(self, ref, rank, t, region: Region):
        nn.Module.__init__(self)
        self.n_heads, self.kv_heads, self.head_dim, self.region = (
            ref.n_heads // t,
            ref.kv_heads // t,
            ref.head_dim,
            region,
        )
        self.q_proj = ColumnParallelLinear(shard(ref.q_proj.weight, 0, rank, t))  # [a/t*d, h]
        self.k_proj = ColumnParallelLinear(shard(ref.k_proj.weight, 0, rank, t))  # [g/t*d, h]
        self.v_proj = ColumnParallelLinear(shard(ref.v_proj.weight, 0, rank, t))  # [g/t*d, h]
        self.o_proj = RowParallelLinear(shard(ref.o_proj.weight, 1, rank, t), region)  # [h, a/t*d]
        self.rope = copy.deepcopy(ref.rope)
        self.recompute_core, self.core = False, ref.core

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.region.columns(x, self.q_proj, self.k_proj, self.v_proj)  # [b, s, (a or g)/t*d]
        return q, k, v


class TPSwiGLU(nn.Module):
    """gate and up split by ffn channel (column), down by the same channels (row)."""

    def __init__(self, ref, rank, t, region: Region):
        super().__init__()
        self.region = region
        self.gate_proj = ColumnParallelLinear(shard(ref.gate_proj.weight, 0, rank, t))  # [f/t, h]
        self.up_proj = ColumnParallelLinear(shard(ref.up_proj.weight, 0, rank, t))  # [f/t, h]
        self.down_proj = RowParallelLinear(shard(ref.down_proj.weight, 1, rank, t), region)  # [h, f/t]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.region.columns(x, self.gate_proj, self.up_proj)  # [b, s, f/t] each
        return self.down_proj(F.silu(gate) * up)  # [b, s or s/t, h]


class TPBlock(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x)); x is [b, s, h] (TP) or [b, s/t, h] (SP). Each of
    attn and mlp is one parallel region: it enters on its column layers and leaves on its row layer."""

    def __init__(self, ref, rank, t, i, **mode):
        super().__init__()
        self.attn_norm, self.mlp_norm = copy.deepcopy(ref.attn_norm), copy.deepcopy(ref.mlp_norm)
        self.attn = TPAttention(ref.attn, rank, t, Region(label=f"layer{i}.attn", **mode))
        if hasattr(ref.mlp, "router"):  # MoE: replicated; the hybrid splits its tokens over tp (``parallel.tp.moe``)
            self.mlp = ref.mlp
        else:
            self.mlp = TPSwiGLU(ref.mlp, rank, t, Region(label=f"layer{i}.mlp", **mode))

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), positions)
        return x + self.mlp(self.mlp_norm(x))


class TPGPT(nn.Module):
    """Our GPT cut into t tensor-parallel shards, this rank's shard built by slicing ``ref``'s weights.

    Parameter names equal the reference's (``blocks.0.attn.q_proj.weight`` ...), each holding this
    rank's slice along ``shard_dims(model)[name]`` (None: replicated). ``model(tokens, targets)``
    returns (logit shard [b, s, V/t], loss), every rank the same loss. ``sequence_parallel``: norms
    and residual stream on sequence shards; ``regather`` (with SP): Megatron-LM's memory saving,
    see :class:`LinearsWithSequenceParallelRegather`.
    """

    def __init__(
        self, ref: GPT, group, *, sequence_parallel: bool = False, regather: bool = False, recompute: str = "none"
    ):
        super().__init__()
        if recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
        cfg, rank, t = ref.cfg, dist.get_rank(group), dist.get_world_size(group)
        if regather and not sequence_parallel:
            raise ValueError("regather saves sequence shards, so it needs sequence_parallel=True")
        check_tp(cfg, t)
        self.cfg, self.group, self.sp, self.vocab_start = cfg, group, sequence_parallel, rank * cfg.vocab_size // t
        mode = dict(group=group, sequence_parallel=sequence_parallel, regather=regather)
        self.tok_emb = VocabParallelEmbedding(
            shard(ref.tok_emb.weight, 0, rank, t), self.vocab_start, Region(label="embedding", **mode)
        )
        self.blocks = nn.ModuleList(TPBlock(b, rank, t, i, **mode) for i, b in enumerate(ref.blocks))
        self.norm = copy.deepcopy(ref.norm)
        self.lm_head = ColumnParallelLinear(shard(ref.lm_head.weight, 0, rank, t))  # [V/t, h]
        self.head_region = Region(label="head", **mode)
        self.recompute = recompute  # "full": each block's forward, collectives included, reruns in backward
        for block in self.blocks:
            block.attn.recompute_core = recompute == "selective"
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight  # both split by vocabulary rows: tying still holds

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [b, s] -> [b, s, h] (TP) or [b, s/t, h] (SP)."""
        check_tp(self.cfg, dist.get_world_size(self.group), seq_len=tokens.shape[1], sequence_parallel=self.sp)
        return self.tok_emb(tokens)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and the column-parallel head: logit shard [b, s, V/t]."""
        (logits,) = self.head_region.columns(self.norm(x), self.lm_head)  # [b, s, V/t]
        return logits

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, global_tokens: int | None = None) -> torch.Tensor:
        """Cross-entropy from the logit shards (vocab-parallel; Σ / ``global_tokens``: ``lm_loss``): the
        same on every rank; plus, for a mixture of experts, this rank's share of the aux loss (``GPT.aux_loss``)."""
        loss = VocabParallelCrossEntropy.apply(logits, targets, self.vocab_start, self.group, global_tokens)
        return loss + GPT.aux_loss(self) if self.cfg.is_moe else loss

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None, *, positions=None):
        x = self.embed(tokens)  # [b, s, h] (TP) or [b, s/t, h] (SP)
        for block in self.blocks:
            if self.recompute == "full" and torch.is_grad_enabled():
                x = checkpoint(block, x, positions, use_reentrant=False)  # same shape
            else:
                x = block(x, positions)  # same shape
        logits = self.head(x)  # [b, s, V/t]
        if targets is None:
            return logits
        return logits, self.loss(logits, targets)


def sync_replicated_grads(model: nn.Module, group) -> None:
    """SP only: each rank's norm weights saw s/t of the tokens; sum their gradients in one all-reduce."""
    dims = shard_dims(model)
    grads = [p.grad for n, p in model.named_parameters() if dims[n] is None and ".mlp." not in n]  # MoE: tp_moe
    flat = all_reduce(torch.cat([x.reshape(-1) for x in grads]), group, "grad sync", "step")
    for x, y in zip(grads, flat.split([x.numel() for x in grads])):
        x.copy_(y.view_as(x))


def unshard(per_rank: list[dict[str, torch.Tensor]], dims: dict[str, int | None]) -> dict[str, torch.Tensor]:
    """Full tensors from every rank's slices (concatenated in rank order along their dim)."""
    return {n: per_rank[0][n] if d is None else torch.cat([r[n] for r in per_rank], d) for n, d in dims.items()}
