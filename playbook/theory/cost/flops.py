"""Predict: the arithmetic of a training step, and how long a step takes on a hardware profile.

FLOPs per token (a multiply-add counts as 2 FLOPs), for a decoder with N parameters that a token
is multiplied by, L layers, H query heads of dimension Q, and sequence length T:

    training:  6·N + 12·L·H·Q·T     (Chowdhery et al. 2022, "PaLM", arXiv:2204.02311, Appendix B)
    forward:   2·N +  4·L·H·Q·T     (the same count without the backward pass: one third)

The 6N is forward (2N) plus backward (4N: gradients for the activations and for the weights);
the second term is attention's two [T, T] matmuls, which no weight counts: per token and layer,
q·kᵀ is H·T·Q multiply-adds (2·H·Q·T FLOPs) and probs·v as many again, 4·H·Q·T forward, three
times that for training. This is PaLM's convention, and the one this module follows.

Kaplan et al. 2020 (arXiv:2001.08361, §2.1, Table 1) write C_forward ≈ 2N + 2·n_layer·n_ctx·d_attn
(d_attn = H·Q): their attention term is **half** of ours. Their table has a single attention row of
2·n_layer·n_ctx·d_attn, one [T, T] matmul's worth over the full context (or equally both matmuls
over the n_ctx/2 positions a causal token sees on average). We count both matmuls over the full T
because our ``causal_attention`` computes the full [T, T] scores and then masks them, so the full T
is what it really executes (a fused causal kernel would do about half), and because PaLM's count
is the one model-FLOPs-utilisation (MFU) figures are usually reported with.

Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, §2.1; DeepSeek-V3 arXiv:2412.19437)
uses different head sizes for the two matmuls: q·kᵀ over ``qk_nope_head_dim + qk_rope_head_dim``
(128 + 64 = 192 for DeepSeek-V3) and probs·v over ``v_head_dim`` (128), not hidden / heads (56).
Writing Q_qk and Q_v for the two, the term is 6·L·H·T·(Q_qk + Q_v) for training and
2·L·H·T·(Q_qk + Q_v) forward, which is 12·L·H·Q·T and 4·L·H·Q·T when Q_qk = Q_v = Q.

N here is :func:`matmul_params`: every weight a token meets in a matmul, so the input embedding
(a table lookup, no arithmetic) is left out unless it is tied to the output head; MoE configs count
only the active experts. Norm weights are included (elementwise, negligible).

A step's predicted time is compute + the communication that is not hidden behind it:

    compute  = FLOPs / (peak FLOP/s × MFU)                          (MFU: model FLOP utilisation)
    comm     = Σ collective_seconds(op, bytes, n, link bandwidth)    (``playbook.theory.cost.comm``)
    step     = compute + comm − hidden,  hidden <= the part of compute that can overlap

Units: FLOPs, seconds, bytes, FLOP/s and bytes/s (decimal, as vendors quote). Pure arithmetic:
no torch, no processes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from playbook.config import ModelConfig, require_positive
from playbook.hardware import Hardware
from playbook.theory.cost.comm import collective_seconds

BACKWARD_SHARE = 2 / 3  # backward is 4N of the 6N per token: the compute a gradient all-reduce can hide behind


def matmul_params(cfg: ModelConfig) -> int:
    """N for the FLOP count: the (active) parameters a token is multiplied by. The input embedding
    is a lookup, so an untied embedding table is not counted; a tied one is, as the output head."""
    lookup = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.hidden
    return cfg.active_params() - lookup


def attention_head_dims(cfg: ModelConfig) -> tuple[int, int]:
    """(Q_qk, Q_v): the head size of q·kᵀ and of probs·v. GQA/MHA: both ``cfg.dim_head``; MLA
    (DeepSeek-V2 §2.1): ``qk_nope_head_dim + qk_rope_head_dim`` and ``v_head_dim``."""
    if cfg.attention == "mla":
        return cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.v_head_dim
    return cfg.dim_head, cfg.dim_head


def attention_flops_per_token(cfg: ModelConfig, seq_len: int, *, training: bool = True) -> float:
    """PaLM's attention term (Appendix B): 6·L·H·T·(Q_qk + Q_v) for training (= 12·L·H·Q·T when
    both head sizes are Q), a third of it, 2·L·H·T·(Q_qk + Q_v), for a forward: q·kᵀ and probs·v
    over all T positions. Twice Kaplan et al.'s 2·n_layer·n_ctx·d_attn (module docstring)."""
    require_positive(seq_len=seq_len)
    qk, v = attention_head_dims(cfg)
    return (6 if training else 2) * cfg.n_layers * cfg.n_heads * seq_len * (qk + v)


def flops_per_token(cfg: ModelConfig, seq_len: int, *, training: bool = True) -> float:
    """6N + 12·L·H·Q·T for a training step (forward + backward), 2N + 4·L·H·Q·T for a forward."""
    return (6 if training else 2) * matmul_params(cfg) + attention_flops_per_token(cfg, seq_len, training=training)


def step_flops(cfg: ModelConfig, *, tokens: int, seq_len: int, training: bool = True) -> float:
    """FLOPs of one step over ``tokens`` tokens (batch × seq_len) in sequences of ``seq_len``."""
    require_positive(tokens=tokens)
    return tokens * flops_per_token(cfg, seq_len, training=training)


def compute_seconds(flops: float, peak_flops: float, mfu: float = 1.0) -> float:
    """flops / (peak × mfu). ``mfu`` = 1 is the unreachable ideal; large runs report 0.3–0.6."""
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be > 0 FLOP/s, got {peak_flops}")
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}; try 0.4 for a well-tuned GPU run")
    return flops / (peak_flops * mfu)


def achieved_mfu(cfg: ModelConfig, *, tokens_per_second: float, seq_len: int, peak_flops: float) -> float:
    """Model FLOP utilisation of a measured run: (tokens/s × training FLOPs per token) / peak."""
    return tokens_per_second * flops_per_token(cfg, seq_len) / peak_flops


def link_bandwidth(hw: Hardware, world_size: int) -> float:
    """Bytes/s per device of the slowest link a ring over ``world_size`` devices crosses: the
    intra-node link while the ring fits in one node, the network card beyond."""
    require_positive(world_size=world_size)
    return hw.intra_node_bandwidth if world_size <= hw.devices_per_node else hw.inter_node_bandwidth


@dataclass(frozen=True)
class StepTime:
    """Predicted seconds of one training step on one rank."""

    compute: float  # forward + backward at peak × MFU
    comm: float  # every collective, one after another, if none were hidden
    hidden: float = 0.0  # communication that runs while compute does

    @property
    def exposed_comm(self) -> float:
        return self.comm - self.hidden

    @property
    def total(self) -> float:
        return self.compute + self.exposed_comm

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "exposed_comm": self.exposed_comm, "total": self.total}


def predict_step_time(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    tokens: int,
    seq_len: int,
    collectives: Iterable[tuple[str, float, int]] = (),
    mfu: float = 1.0,
    overlap: bool = False,
    latency: float = 5e-6,
) -> StepTime:
    """Compute for ``tokens`` tokens on this rank, plus ``collectives`` ((op, buffer bytes, group
    size) per step) over :func:`link_bandwidth`. ``overlap=True`` hides communication behind the
    backward pass (at most :data:`BACKWARD_SHARE` of the compute): an upper bound on overlap; the
    bucket schedule in ``playbook.theory.dp.buckets`` says how much a real bucket plan achieves."""
    compute = compute_seconds(step_flops(cfg, tokens=tokens, seq_len=seq_len), hw.peak_bf16_flops, mfu)
    comm = sum(collective_seconds(op, size, n, link_bandwidth(hw, n), latency) for op, size, n in collectives)
    hidden = min(comm, BACKWARD_SHARE * compute) if overlap else 0.0
    return StepTime(compute=compute, comm=comm, hidden=hidden)


__all__ = [
    "BACKWARD_SHARE",
    "StepTime",
    "achieved_mfu",
    "attention_flops_per_token",
    "attention_head_dims",
    "compute_seconds",
    "flops_per_token",
    "link_bandwidth",
    "matmul_params",
    "predict_step_time",
    "step_flops",
]
