"""The attention of our GPT: grouped-query self-attention (Ainslie et al. 2023, arXiv:2305.13245) with
rotary position embedding (Su et al. 2021, arXiv:2104.09864) and a plain causal softmax core
(Vaswani et al. 2017), on its own as the MLP is (``playbook.model.mlp``).

Written to be cut apart: tensor parallelism splits the heads (``Attention.project``), context
parallelism swaps ``Attention.core`` (``causal_attention`` here: matmul + softmax, so every tensor
autograd saves is visible and countable, ``playbook.theory.inventory.activations``).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from playbook.config import ModelConfig


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021), "rotate-half" form as in Llama.

    Channel pairs (i, i + head_dim/2) of every query and key are rotated by the angle
    ``position * theta^(-2i/head_dim)``, so that q·k depends only on the distance between positions.
    cos and sin are precomputed for ``max_seq_len`` positions as non-persistent buffers (part of
    the model, not of its checkpoint).
    """

    def __init__(self, head_dim: int, max_seq_len: int, theta: float = 10_000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE rotates channel pairs, so head_dim must be even, got {head_dim}")
        inv_freq = theta ** -(torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # [head_dim/2]
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)  # [max_seq, head_dim/2]
        angles = torch.cat([angles, angles], dim=-1)  # [max_seq, head_dim]
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x: [batch, heads, seq, head_dim]; positions: [seq] int64, default 0..seq-1."""
        seq = x.shape[-2]
        if positions is None:  # a slice: a view of the buffer, nothing new for autograd to save
            cos, sin = self.cos[:seq], self.sin[:seq]  # [seq, head_dim]
        else:
            cos, sin = self.cos[positions], self.sin[positions]  # [seq, head_dim]
        x1, x2 = x.chunk(2, dim=-1)  # [batch, heads, seq, head_dim/2] each
        rotated = torch.cat([-x2, x1], dim=-1)  # [batch, heads, seq, head_dim]
        return x * cos + rotated * sin  # [batch, heads, seq, head_dim]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d) + causal mask) v, the attention core (Vaswani et al. 2017).

    q: [batch, heads, seq, head_dim]; k, v: [batch, kv_heads, seq, head_dim], kv_heads dividing
    heads (grouped-query attention, Ainslie et al. 2023: query head j reads key/value head
    j // (heads / kv_heads)). Returns [batch, heads, seq, head_dim].

    Plain matmul + softmax on purpose (not ``F.scaled_dot_product_attention``): the [seq, seq]
    probabilities are a real tensor that autograd saves, which is what the memory chapter counts
    and what ring attention (the context-parallel chapter, which replaces this function) avoids.
    """
    batch, heads, seq, head_dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    # repeat each key/value head for the `group` query heads that share it (a copy: autograd saves
    # these full-size copies, so GQA saves no activation memory here, only parameters and KV cache)
    k = k[:, :, None].expand(batch, kv_heads, group, seq, head_dim).reshape(batch, heads, seq, head_dim)
    v = v[:, :, None].expand(batch, kv_heads, group, seq, head_dim).reshape(batch, heads, seq, head_dim)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))  # [batch, heads, seq, seq]
    future = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)  # [seq, seq], True above diagonal
    scores = scores.masked_fill(future, float("-inf"))  # [batch, heads, seq, seq]
    probs = scores.softmax(dim=-1)  # [batch, heads, seq, seq]
    return probs @ v  # [batch, heads, seq, head_dim]


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE; no biases.

    q_proj: hidden -> heads*head_dim; k_proj, v_proj: hidden -> kv_heads*head_dim;
    o_proj: heads*head_dim -> hidden. Tensor parallelism splits the heads: q/k/v column-wise, o row-wise.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.dim_head
        self.q_proj = nn.Linear(cfg.hidden, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden, bias=False)
        self.rope = RotaryEmbedding(self.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.recompute_core = False  # selective recomputation: keep q, k, v, redo the attention core in backward
        self.core = causal_attention  # (q, k, v) -> [b, heads, s, d]; context parallelism swaps in a ring

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [b, s, heads*head_dim], k and v [b, s, kv_heads*head_dim]. Tensor parallelism replaces
        this with column-parallel shards entered once (``playbook.parallel.tp.model``)."""
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = self.project(x)  # [batch, seq, (heads or kv_heads)*head_dim]
        batch, seq = q.shape[:2]  # (with sequence parallelism x holds s/t tokens and q all s)
        # heads read their own slice of the projection's output channels; [b, s, a*d] -> [b, a, s, d]
        q = q.view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)  # [batch, heads, seq, head_dim]
        k = k.view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)  # [batch, kv_heads, seq, head_dim]
        v = v.view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)  # [batch, kv_heads, seq, head_dim]
        q, k = self.rope(q, positions), self.rope(k, positions)
        if self.recompute_core and torch.is_grad_enabled():
            y = checkpoint(self.core, q, k, v, use_reentrant=False)  # [batch, heads, seq, head_dim]
        else:
            y = self.core(q, k, v)  # [batch, heads, seq, head_dim]
        y = y.transpose(1, 2).reshape(batch, seq, self.n_heads * self.head_dim)  # [batch, seq, heads*head_dim]
        return self.o_proj(y)  # [batch, seq, hidden]
