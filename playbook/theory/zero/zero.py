"""Predict ZeRO exactly for our flat, padded buffers: bytes per rank by category, and bytes sent per step.

The ZeRO paper (Rajbhandari et al. 2019, arXiv:1910.02054, §5 and §7) counts model state per rank
with Ψ parameters over Nd data-parallel ranks (``playbook.theory.hybrid.memory.model_state_bytes``):
stage 1 shards the optimizer states (KΨ/Nd), stage 2 the gradients too, stage 3 the parameters too;
stages 1-2 send as much as data parallelism's all-reduce (a reduce-scatter of the gradients and an
all-gather of the parameters, Ψ each), stage 3 1.5× as much (the parameters are gathered twice,
before the forward and again before the backward).

Our implementation (``playbook/parallel/zero/zero.py``) flattens the model into *units*: the embedding,
each transformer block, and the head (final norm + output projection). Each unit's flat buffer of
``numel`` elements is padded with zeros to ``padded = ceil(numel / N) · N`` so that every rank owns an
equal slice of ``shard = padded / N`` elements. So, per rank, with b bytes per element and U units:

==========  ==================  ==================  ================================
stage       params              grads               optimizer (AdamW, fp32 states)
==========  ==================  ==================  ================================
0 (DP)      b·Σ padded          b·Σ padded          8·Σ padded + 4·U
1           b·Σ padded          b·Σ padded          8·Σ shard + 4·U
2           b·Σ padded          b·Σ shard           8·Σ shard + 4·U
3           b·Σ shard           b·Σ shard           8·Σ shard + 4·U
==========  ==================  ==================  ================================

(+4·U: AdamW keeps one 4-byte ``step`` counter per tensor it updates, and each rank updates one flat
shard per unit.) Stage 3 also holds, for a moment, whole units: :func:`zero3_gathered_peak`.
Bytes sent per step follow the ring formulas of ``playbook.theory.cost.comm`` on S = b·Σ padded.

Pure arithmetic, no torch: the calculators run without starting a rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from playbook.config import ModelConfig, require_positive
from playbook.theory.cost.comm import collective_seconds, sent_bytes

STAGES = (0, 1, 2, 3)
# bytes per element: (weights, gradients, optimizer states) — ZeRO §3.1; "fp32" is what runs on CPU here
STATE_BYTES = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}
STEP_COUNTER_BYTES = 4  # AdamW's scalar fp32 ``step`` per tensor it updates


def check_stage(stage) -> None:
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in STAGES:
        raise ValueError(
            f"ZeRO stage must be 0, 1, 2 or 3 (0 = plain data parallelism, 1 = optimizer states sharded, "
            f"2 = + gradients, 3 = + parameters); got {stage!r}"
        )


def _check_precision(precision: str) -> tuple[int, int, int]:
    if precision not in STATE_BYTES:
        raise ValueError(f"precision must be one of {', '.join(map(repr, STATE_BYTES))}; got {precision!r}")
    return STATE_BYTES[precision]


# ---- units and padding -------------------------------------------------------------------------
def zero_units(cfg: ModelConfig) -> list[tuple[str, int]]:
    """Our model cut into units, in forward order, as (name, numel): the embedding, each block, the head.

    Each unit is one flat buffer: all-gathered together, reduce-scattered together. Their sum is
    ``cfg.num_params()``. A tied output head shares the embedding's weight, which would put one
    tensor in two units, so tied configs are refused.
    """
    check_untied(cfg)
    if cfg.is_moe:
        raise NotImplementedError(f"{cfg.name} is a mixture of experts; ZeRO units here are for the dense GPT")
    return [
        ("embed", cfg.vocab_size * cfg.hidden),
        *[(f"block{i}", cfg.layer_params()) for i in range(cfg.n_layers)],
        ("head", cfg.hidden + cfg.vocab_size * cfg.hidden),
    ]


def check_untied(cfg: ModelConfig) -> None:
    if cfg.tie_embeddings:
        raise ValueError(
            f"{cfg.name}: tie_embeddings=True puts one weight in both the embedding and the head unit; "
            "our flat ZeRO units need each weight in one unit: use a config with tie_embeddings=False"
        )


def padded(numel: int, n: int) -> int:
    """The flat buffer's length once padded so that n ranks own equal slices: ceil(numel / n) · n."""
    require_positive(numel=numel, n=n)
    return -(-numel // n) * n


def padding_elements(cfg: ModelConfig, n: int) -> dict[str, int]:
    """Zeros added to each unit's flat buffer at n ranks (0 where n divides the unit's numel)."""
    return {name: padded(k, n) - k for name, k in zero_units(cfg)}


# ---- memory per rank ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ZeroMemory:
    """Bytes one rank holds by category, for our flat padded buffers (steady state, after the step)."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def as_dict(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer, "total": self.total}


def zero_state_bytes(cfg: ModelConfig, *, stage: int, world_size: int, precision: str = "fp32") -> ZeroMemory:
    """Exact bytes per rank of parameters, gradients and AdamW states (see the module's table).

    Gradients are those held after backward and after the step (for stage 0 and 1, a persistent
    flat gradient buffer per unit, as DDP and DeepSpeed keep; for 2 and 3 only this rank's slice).
    Every rank holds the same bytes: the padding sits in the last rank's slice but every slice has
    the same length.
    """
    check_stage(stage)
    require_positive(world_size=world_size)
    w, g, o = _check_precision(precision)
    units = zero_units(cfg)
    full = sum(padded(k, world_size) for _, k in units)
    shard = full // world_size
    return ZeroMemory(
        params=w * (shard if stage >= 3 else full),
        grads=g * (shard if stage >= 2 else full),
        optimizer=o * (shard if stage >= 1 else full) + STEP_COUNTER_BYTES * len(units),
    )


def zero_memory_by_moment(cfg: ModelConfig, *, stage: int, world_size: int, precision: str = "fp32") -> dict:
    """Bytes by category at three moments of a steady-state step (optimizer state already exists).

    after forward: stages 2 and 3 hold no gradients yet (the last step's slices were dropped by
    ``zero_grad``); stages 0 and 1 keep their zeroed flat gradient buffers. After backward (with the
    gradient synchronisation) and after the optimizer step: :func:`zero_state_bytes`.
    """
    steady = zero_state_bytes(cfg, stage=stage, world_size=world_size, precision=precision).as_dict()
    steady.pop("total")
    after_forward = {**steady, "grads": steady["grads"] if stage <= 1 else 0}
    return {"after forward": after_forward, "after backward": dict(steady), "after step": dict(steady)}


def zero3_gathered_peak(cfg: ModelConfig, *, world_size: int, prefetch: bool, precision: str = "fp32") -> dict:
    """Most bytes of whole (gathered) units that ZeRO-3 holds at once, in forward and in backward.

    Forward: unit k is gathered for its compute; with prefetch, unit k+1's gather is already in
    flight into its own buffer: max_k b·(P_k + P_{k+1}), else max_k b·P_k.
    Backward: when unit k's flat gradient arrives its gathered parameters are still there (b·P_k),
    the flat gradient too (b·P_k), and with prefetch unit k-1's gathered parameters:
    max_k b·(2P_k + P_{k-1}), else max_k 2b·P_k. P_k is the padded length of unit k.
    """
    require_positive(world_size=world_size)
    w, g, _ = _check_precision(precision)
    sizes = [padded(k, world_size) for _, k in zero_units(cfg)]
    nxt = [sizes[k + 1] if prefetch and k + 1 < len(sizes) else 0 for k in range(len(sizes))]
    prv = [sizes[k - 1] if prefetch and k > 0 else 0 for k in range(len(sizes))]
    forward = max(w * (p + q) for p, q in zip(sizes, nxt))
    backward = max(w * (p + q) + g * p for p, q in zip(sizes, prv))
    return {"forward": forward, "backward": backward}


def zero3_backward_by_unit(cfg: ModelConfig, *, world_size: int, prefetch: bool, precision: str = "fp32") -> dict:
    """Bytes of whole units ZeRO-3 holds during each unit's backward, by unit name (the terms whose
    maximum is ``zero3_gathered_peak(...)["backward"]``): b·(P_k + P_{k−1}) gathered plus b·P_k of
    flat gradient. Lets a peak be added to what exists in the *same* phase (a block's recompute
    working set exists in that block's backward, not in the head's)."""
    require_positive(world_size=world_size)
    w, g, _ = _check_precision(precision)
    units = zero_units(cfg)
    sizes = [padded(k, world_size) for _, k in units]
    prv = [sizes[k - 1] if prefetch and k > 0 else 0 for k in range(len(sizes))]
    return {name: w * (p + q) + g * p for (name, _), p, q in zip(units, sizes, prv)}


# ---- communication per step --------------------------------------------------------------------
def zero_comm_per_step(
    cfg: ModelConfig, *, stage: int, world_size: int, precision: str = "fp32", loss_bytes: int = 4
) -> dict[str, float]:
    """Bytes one rank sends per training step, by collective (ring algorithms; ``theory.cost.comm``).

    With S = b·Σ padded (all gradient or weight bytes, padding included) and n ranks:
    stage 0: all-reduce of the gradients, 2S(n-1)/n; stages 1 and 2: reduce-scatter of the
    gradients + all-gather of the updated parameters, S(n-1)/n each (2S(n-1)/n in all, as DP);
    stage 3: all-gather twice (forward and backward) + reduce-scatter, 3S(n-1)/n (ZeRO §7: 1.5×).
    ``loss_bytes`` > 0 adds the all-reduce of the loss that every strategy here uses for reporting.
    """
    check_stage(stage)
    w, g, _ = _check_precision(precision)
    total = sum(padded(k, world_size) for _, k in zero_units(cfg))
    grads, weights = g * total, w * total
    out: dict[str, float] = {}
    if stage == 0:
        out["all_reduce"] = sent_bytes("all_reduce", grads, world_size)
    else:
        gathers = 2 if stage == 3 else 1
        out["reduce_scatter"] = sent_bytes("reduce_scatter", grads, world_size)
        out["all_gather"] = gathers * sent_bytes("all_gather", weights, world_size)
    if loss_bytes:
        out["all_reduce"] = out.get("all_reduce", 0.0) + sent_bytes("all_reduce", loss_bytes, world_size)
    return out


def zero_collectives_per_step(cfg: ModelConfig, *, stage: int) -> dict[str, int]:
    """How many collectives of each kind one step issues: one per unit and pass (plus the loss)."""
    check_stage(stage)
    u = len(zero_units(cfg))
    if stage == 0:
        return {"all_reduce": u + 1}
    return {"reduce_scatter": u, "all_gather": (2 if stage == 3 else 1) * u, "all_reduce": 1}


def zero_comm_seconds(
    cfg: ModelConfig, *, stage: int, world_size: int, bandwidth: float, latency: float = 5e-6, precision: str = "mixed"
) -> float:
    """Communication time per step if nothing overlaps (alpha-beta model, one collective per unit)."""
    check_stage(stage)
    w, g, _ = _check_precision(precision)
    total = 0.0
    for _, k in zero_units(cfg):
        size = padded(k, world_size)
        if stage == 0:
            total += collective_seconds("all_reduce", g * size, world_size, bandwidth, latency)
        else:
            total += collective_seconds("reduce_scatter", g * size, world_size, bandwidth, latency)
            total += (2 if stage == 3 else 1) * collective_seconds(
                "all_gather", w * size, world_size, bandwidth, latency
            )
    return total


def fsdp2_state_bytes(cfg: ModelConfig, *, world_size: int, n_tensors: int | None = None) -> ZeroMemory:
    """FSDP2 (``fully_shard``) in fp32: every parameter tensor is split on dim 0 over the ranks.

    When n divides every tensor's first dimension (true for our presets at n in 1, 2, 4, 8) each rank
    holds 4Ψ/n of weights, 4Ψ/n of gradients and 8Ψ/n of AdamW states, plus a 4-byte ``step`` per
    parameter *tensor* (FSDP2 keeps each tensor separate: ``cfg.num_param_tensors()`` counters, where
    our flat units need one per unit). Uneven splits are refused rather than guessed.
    """
    require_positive(world_size=world_size)
    dims = {cfg.vocab_size, cfg.hidden, cfg.ffn_hidden, cfg.n_heads * cfg.dim_head, cfg.kv_heads * cfg.dim_head}
    bad = sorted(d for d in dims if d % world_size)
    if bad:
        raise ValueError(
            f"world_size={world_size} does not divide the first dimension(s) {bad} of some weights; FSDP2 would pad "
            f"them unevenly and this prediction assumes an even split: use a world size dividing {min(dims)}"
        )
    psi = cfg.num_params()
    tensors = cfg.num_param_tensors() if n_tensors is None else n_tensors
    return ZeroMemory(
        params=4 * psi // world_size,
        grads=4 * psi // world_size,
        optimizer=8 * psi // world_size + STEP_COUNTER_BYTES * tensors,
    )


__all__ = [
    "STAGES",
    "ZeroMemory",
    "check_stage",
    "fsdp2_state_bytes",
    "padded",
    "padding_elements",
    "zero3_gathered_peak",
    "zero_collectives_per_step",
    "zero_comm_per_step",
    "zero_comm_seconds",
    "zero_memory_by_moment",
    "zero_state_bytes",
    "zero_units",
]
