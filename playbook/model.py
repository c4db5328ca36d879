"""The small GPT every chapter trains: a Llama-style decoder, written to be split.

    tokens [batch, seq]
      -> embedding                                  [batch, seq, hidden]
      -> n_layers x Block:  x + Attention(RMSNorm(x))
                            x + SwiGLU(RMSNorm(x))  [batch, seq, hidden]
      -> RMSNorm -> lm_head                         [batch, seq, vocab]

Pieces and where they come from:
- RMSNorm: Zhang & Sennrich 2019, "Root Mean Square Layer Normalization" (arXiv:1910.07467).
- Rotary position embedding (RoPE): Su et al. 2021, "RoFormer" (arXiv:2104.09864).
- Grouped-query attention: Ainslie et al. 2023, "GQA" (arXiv:2305.13245).
- SwiGLU MLP: Shazeer 2020, "GLU Variants Improve Transformer" (arXiv:2002.05202).
- Pre-norm residual blocks and the 1/sqrt(2 * n_layers) init of residual projections: GPT-2
  (Radford et al. 2019).

Written for the later chapters, which cut this model apart:
- tensor parallel splits heads (``Attention`` keeps the per-head reshape explicit) and the MLP's
  ``ffn_hidden`` (``SwiGLU``);
- context parallel replaces ``Attention.core`` (``causal_attention``: plain matmul + softmax, so every tensor autograd
  saves is visible and countable: ``playbook.theory.activations`` counts them op by op);
- pipeline parallel cuts ``GPT.blocks`` into stages and reuses ``GPT.embed``, ``GPT.head`` and
  ``lm_loss``.

No biases, no dropout. With ``cfg.n_experts > 0`` the MLP of every layer after the first
``cfg.n_dense_layers`` is a mixture of experts (``playbook.moe.MoEMLP``), and the loss returned with
targets includes the experts' load-balancing loss (``GPT.aux_loss``).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from playbook.config import ModelConfig
from playbook.mlp import SwiGLU
from playbook.moe import AUX_ALPHA, MoEMLP, configure, replay_context

INIT_STD = 0.02  # GPT-2's initial weight scale
RECOMPUTE_MODES = ("none", "selective", "full")


class RMSNorm(nn.Module):
    """x / rms(x) * weight, with rms(x) = sqrt(mean(x^2) + eps) over the last dim (Zhang & Sennrich 2019).

    Written out op by op (not ``F.rms_norm``) so that what autograd saves is plain to see: the input
    ``x``, the per-row ``1/rms`` and the normalised ``x / rms``.
    """

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # [batch, seq, 1]
        return (x * inv_rms) * self.weight  # [batch, seq, dim]


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


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, moe: bool = False):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        if moe:
            self.mlp = MoEMLP(cfg)
        else:
            self.mlp = SwiGLU(cfg.hidden, cfg.ffn_hidden)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), positions)  # [batch, seq, hidden]
        return x + self.mlp(self.mlp_norm(x))  # [batch, seq, hidden]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, over: int | None = None) -> torch.Tensor:
    """Next-token cross-entropy in nats: the mean over these tokens, or (``over``) their sum divided
    by ``over`` tokens, a parallel rank's share of the global batch's mean (``parallel.hybrid.pipeline``).
    logits [batch, seq, vocab], targets [batch, seq] int64."""
    flat = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)  # [tokens, vocab], [tokens]
    if over is None:
        return F.cross_entropy(*flat)
    return F.cross_entropy(*flat, reduction="sum") / over


class GPT(nn.Module):
    """The GPT. ``GPT(cfg, seed)`` builds it with weights drawn from ``seed`` alone.

    ``model(tokens)`` returns logits [batch, seq, vocab];
    ``model(tokens, targets)`` returns ``(logits, loss)``, loss the mean cross-entropy (``lm_loss``),
    plus, for a mixture of experts, ``self.aux_loss()``: the sum of the MoE layers' load-balancing
    losses of this forward (``playbook.moe``; 0 for a dense model, whose loss is ``lm_loss`` alone).
    Layers ``n_dense_layers..n_layers-1`` of an MoE config get a ``MoEMLP``; the router and the
    experts are initialised like the other weights (experts' ``down_proj`` as residual projections).

    Init (GPT-2): every weight matrix ~ N(0, 0.02²), except the projections that write into the
    residual stream (``o_proj``, ``down_proj``), whose std is 0.02 / sqrt(2 * n_layers) so the
    residual stream's variance does not grow with depth; norm weights are ones. Weights come from a
    private ``torch.Generator`` on the CPU, so the same seed gives the same model on any device,
    whatever the global RNG state, and building a model leaves the global RNG untouched.

    ``recompute`` ("none", "selective", "full"; see ``set_recompute``) trades backward-time compute
    for activation memory; ``playbook.theory.activations`` predicts the bytes saved in each mode.
    """

    def __init__(self, cfg: ModelConfig, seed: int = 0, *, recompute: str = "none"):
        super().__init__()
        if cfg.attention != "gqa":
            raise NotImplementedError(f"attention={cfg.attention!r} is for counting only; our torch model is 'gqa'")
        if cfg.qkv_bias:
            raise NotImplementedError("qkv_bias (Qwen2's q/k/v biases) is for counting only; our projections have none")
        self.cfg = cfg
        with torch.random.fork_rng(devices=[]):  # nn.Linear draws a default init from the global RNG: undo that
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.hidden)
            self.blocks = nn.ModuleList(
                Block(cfg, moe=cfg.is_moe and i >= cfg.n_dense_layers) for i in range(cfg.n_layers)
            )
            self.norm = RMSNorm(cfg.hidden, cfg.norm_eps)
            self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight  # one tensor, [vocab, hidden], used twice
        self.init_weights(seed)
        self.set_recompute(recompute)

    def set_recompute(self, mode: str) -> None:
        """Activation recomputation (Chen et al. 2016, arXiv:1604.06174; Korthikanti et al. 2022):
        "none" keeps everything autograd saves; "selective" keeps each attention's q, k, v and
        recomputes ``causal_attention`` (its [seq, seq] tensors) in backward; "full" keeps only
        each block's input and reruns the whole block in backward. Uses
        ``torch.utils.checkpoint`` (non-reentrant)."""
        if mode not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {mode!r}")
        self.recompute = mode
        for block in self.blocks:
            block.attn.recompute_core = mode == "selective"

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Redraw every weight from ``seed`` (see the class docstring)."""
        gen = torch.Generator().manual_seed(seed)
        residual_std = INIT_STD / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():  # a fixed order; a tied weight appears once
            if p.ndim == 1:  # RMSNorm weights
                p.fill_(1.0)
                continue
            std = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else INIT_STD
            p.copy_(torch.randn(p.shape, generator=gen) * std)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [batch, seq] int64 -> [batch, seq, hidden]; checks seq <= max_seq_len."""
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [batch, seq], got shape {tuple(tokens.shape)}")
        if tokens.shape[1] > self.cfg.max_seq_len:
            raise ValueError(
                f"sequence length {tokens.shape[1]} exceeds max_seq_len={self.cfg.max_seq_len} "
                f"(the RoPE table's size); use seq_len <= {self.cfg.max_seq_len} or a config with a "
                "larger max_seq_len"
            )
        return self.tok_emb(tokens)  # [batch, seq, hidden]

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and output projection: [batch, seq, hidden] -> logits [batch, seq, vocab]."""
        return self.lm_head(self.norm(x))  # [batch, seq, vocab]

    def forward(
        self,
        tokens: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """tokens [batch, seq] int64 -> logits [batch, seq, vocab], or (logits, loss) given targets.

        ``positions`` ([seq] int64, default 0..seq-1) are the RoPE positions, for a chapter that
        feeds a shard of a longer sequence.
        """
        if positions is not None and int(positions.max()) >= self.cfg.max_seq_len:
            raise ValueError(f"position {int(positions.max())} >= max_seq_len={self.cfg.max_seq_len}")
        x = self.embed(tokens)  # [batch, seq, hidden]
        for block in self.blocks:
            if self.recompute == "full" and torch.is_grad_enabled():
                # an MoE block's replay routes as its forward did (``moe.replay_context``)
                x = checkpoint(block, x, positions, use_reentrant=False, context_fn=lambda: replay_context(block))
            else:
                x = block(x, positions)  # [batch, seq, hidden]
        logits = self.head(x)  # [batch, seq, vocab]
        if targets is None:
            return logits
        return logits, self.loss(logits, targets)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, over: int | None = None) -> torch.Tensor:
        """The training loss of a forward's logits: ``lm_loss`` (``over``: see there), plus the
        experts' balancing loss."""
        if self.cfg.is_moe:
            return lm_loss(logits, targets, over) + self.aux_loss()
        return lm_loss(logits, targets, over)

    def aux_loss(self) -> torch.Tensor | float:
        """Sum of the MoE layers' load-balancing losses from the last forward (0.0 if dense)."""
        losses = [b.mlp.aux_loss for b in self.blocks if getattr(b.mlp, "aux_loss", None) is not None]
        return sum(losses[1:], losses[0]) if losses else 0.0


def build_moe(
    cfg: ModelConfig,
    seed: int = 0,
    *,
    capacity_factor: float | None = None,
    aux_alpha: float = AUX_ALPHA,
    bias_rate: float = 0.0,
) -> GPT:
    """``GPT(cfg, seed)`` with every MoE layer configured (``moe.configure``): the single-process
    reference model of expert parallelism."""
    if not cfg.is_moe:
        raise ValueError(f"{cfg.name} is dense (n_experts=0); use an MoE preset such as gpt-tiny-moe")
    return configure(GPT(cfg, seed), capacity_factor=capacity_factor, aux_alpha=aux_alpha, bias_rate=bias_rate)
