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
Attention (RoPE, GQA, the causal core) lives in ``playbook.model.attention``, the MLP in ``playbook.model.mlp``.

Written for the later chapters, which cut this model apart:
- tensor parallel splits heads (``Attention`` keeps the per-head reshape explicit) and the MLP's
  ``ffn_hidden`` (``SwiGLU``);
- context parallel replaces ``Attention.core`` (``causal_attention``: plain matmul + softmax, so every tensor autograd
  saves is visible and countable: ``playbook.theory.inventory.activations`` counts them op by op);
- pipeline parallel cuts ``GPT.blocks`` into stages and reuses ``GPT.embed``, ``GPT.head`` and
  ``lm_loss``.

No biases, no dropout. With ``cfg.n_experts > 0`` the MLP of every layer after the first
``cfg.n_dense_layers`` is a mixture of experts (``playbook.model.moe.MoEMLP``), and the loss returned with
targets includes the experts' load-balancing loss (``GPT.aux_loss``).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from playbook.model.attention import Attention
from playbook.config import ModelConfig
from playbook.model.mlp import SwiGLU
from playbook.model.moe import AUX_ALPHA, MoEMLP, configure, replay_context
from playbook.theory.inventory.inventory import RECOMPUTE_MODES

INIT_STD = 0.02  # GPT-2's initial weight scale


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


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, global_tokens: int | None = None) -> torch.Tensor:
    """Next-token cross-entropy in nats, the package's one convention: the sum of these tokens' losses
    divided by the global batch's token count ``global_tokens`` (default: these tokens, one process
    reading the whole batch). Every parallel rank's loss is then its share of the global mean, and
    every gradient reduction is a sum (torchtitan's convention). logits [batch, seq, vocab], targets
    [batch, seq] int64."""
    flat = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)  # [tokens, vocab], [tokens]
    return F.cross_entropy(*flat, reduction="sum") / (global_tokens or targets.numel())


class GPT(nn.Module):
    """The GPT. ``GPT(cfg, seed)`` builds it with weights drawn from ``seed`` alone.

    ``model(tokens)`` returns logits [batch, seq, vocab];
    ``model(tokens, targets)`` returns ``(logits, loss)``, loss the mean cross-entropy (``lm_loss``),
    plus, for a mixture of experts, ``self.aux_loss()``: the sum of the MoE layers' load-balancing
    losses of this forward (``playbook.model.moe``; 0 for a dense model, whose loss is ``lm_loss`` alone).
    Layers ``n_dense_layers..n_layers-1`` of an MoE config get a ``MoEMLP``; the router and the
    experts are initialised like the other weights (experts' ``down_proj`` as residual projections).

    Init (GPT-2): every weight matrix ~ N(0, 0.02²), except the projections that write into the
    residual stream (``o_proj``, ``down_proj``), whose std is 0.02 / sqrt(2 * n_layers) so the
    residual stream's variance does not grow with depth; norm weights are ones. Weights come from a
    private ``torch.Generator`` on the CPU, so the same seed gives the same model on any device,
    whatever the global RNG state, and building a model leaves the global RNG untouched.

    ``recompute`` ("none", "selective", "full"; see ``set_recompute``) trades backward-time compute
    for activation memory; ``playbook.theory.inventory.activations`` predicts the bytes saved in each mode.
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
        global_tokens: int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """tokens [batch, seq] int64 -> logits [batch, seq, vocab], or (logits, loss) given targets.

        ``positions`` ([seq] int64, default 0..seq-1) are the RoPE positions, for a chapter that
        feeds a shard of a longer sequence; ``global_tokens``: the loss's divisor (``lm_loss``).
        """
        if positions is not None and int(positions.max()) >= self.cfg.max_seq_len:
            raise ValueError(f"position {int(positions.max())} >= max_seq_len={self.cfg.max_seq_len}")
        x = self.embed(tokens)  # [batch, seq, hidden]
        for block in self.blocks:
            if self.recompute == "full" and torch.is_grad_enabled():
                # an MoE block's replay routes as its forward did (``model.moe.replay_context``)
                x = checkpoint(block, x, positions, use_reentrant=False, context_fn=lambda: replay_context(block))
            else:
                x = block(x, positions)  # [batch, seq, hidden]
        logits = self.head(x)  # [batch, seq, vocab]
        if targets is None:
            return logits
        return logits, self.loss(logits, targets, global_tokens)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, global_tokens: int | None = None) -> torch.Tensor:
        """The training loss of a forward's logits: ``lm_loss`` (Σ / ``global_tokens``: see there), plus
        the experts' balancing loss."""
        if self.cfg.is_moe:
            return lm_loss(logits, targets, global_tokens) + self.aux_loss()
        return lm_loss(logits, targets, global_tokens)

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
    """``GPT(cfg, seed)`` with every MoE layer configured (``model.moe.configure``): the single-process
    reference model of expert parallelism."""
    if not cfg.is_moe:
        raise ValueError(f"{cfg.name} is dense (n_experts=0); use an MoE preset such as gpt-tiny-moe")
    return configure(GPT(cfg, seed), capacity_factor=capacity_factor, aux_alpha=aux_alpha, bias_rate=bias_rate)
