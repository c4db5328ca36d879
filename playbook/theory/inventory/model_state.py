"""Model state per rank: weights, gradients and Adam's state, sharded by ZeRO; the byte units and
the validation the memory models share.

Rajbhandari et al. 2019, *ZeRO: Memory Optimizations Toward Training Trillion Parameter Models*,
arXiv:1910.02054, §3.1 (16Ψ for mixed-precision Adam) and §5 (the three stages). Pure arithmetic,
no torch; every function returns bytes (floats: sharding divides exactly). ``theory.hybrid.memory`` adds
activations and serving on top and re-exports these names.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from playbook.config import require_positive

# Bytes per element of each storage type (int4 packs two values per byte).
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}

ZERO_STAGES = (0, 1, 2, 3)

# Bytes per parameter: (weights, gradients, optimizer states), before any sharding.
#   mixed: bf16/fp16 weights and grads; fp32 master copy + Adam momentum + variance = K = 12 (ZeRO §3.1)
#   fp32:  fp32 weights and grads; Adam momentum + variance = 8
_STATE_BYTES = {"mixed": (2, 2, 12), "fp32": (4, 4, 8)}


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes per rank by category (for the most loaded rank)."""

    params: float
    grads: float
    optimizer: float
    activations: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


# ---- units -------------------------------------------------------------------------------------
def bytes_to_gb(x: float) -> float:
    """Bytes to decimal gigabytes (1 GB = 1e9 bytes), the unit of vendor datasheets and the ZeRO paper."""
    return x / 1e9


def bytes_to_gib(x: float) -> float:
    """Bytes to binary gibibytes (1 GiB = 2**30 bytes), the unit of ``torch.cuda`` and ``nvidia-smi`` (MiB)."""
    return x / 2**30


# ---- validation helpers ------------------------------------------------------------------------
def _choice(name: str, value, valid) -> None:
    if isinstance(value, bool) or type(value) is not type(valid[0]) or value not in valid:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, valid))}; got {value!r}")


def _dtype_bytes(dtype: str) -> float:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(map(repr, DTYPE_BYTES))}; got {dtype!r}")
    return DTYPE_BYTES[dtype]


def _require_count(name: str, value) -> None:
    """A positive, finite number (Ψ may be written 7.5e9, as in the ZeRO paper)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")


GRAD_ACCUM = {  # fp32 gradient accumulation: gradient bytes per parameter in mixed precision, by convention
    "main_grad": 4,  # Megatron-LM's main_grad replaces the 16-bit gradient: 2 + 4 + 12 = 18 in all
    "both": 6,  # the 16-bit gradient kept beside the fp32 buffer (Ultra-Scale Playbook): 2 + 6 + 12 = 20
}


def _grad_accum_name(fp32_grad_accum) -> str | None:
    """``False`` -> None; ``True`` -> ``"both"`` (what True always meant here); a name of ``GRAD_ACCUM``."""
    if fp32_grad_accum is False:
        return None
    if fp32_grad_accum is True:
        return "both"
    if fp32_grad_accum in GRAD_ACCUM:
        return fp32_grad_accum
    raise ValueError(
        f"fp32_grad_accum must be False, True (= 'both') or one of {', '.join(map(repr, GRAD_ACCUM))}, "
        f"got {fp32_grad_accum!r}"
    )


def _check_grad_accum(fp32_grad_accum, precision: str) -> None:
    if _grad_accum_name(fp32_grad_accum) and precision != "mixed":
        raise ValueError(
            f"fp32_grad_accum needs precision='mixed': with precision={precision!r} the gradients already are fp32"
        )


# ---- model state (ZeRO) ------------------------------------------------------------------------
def model_state_bytes(
    num_params: float,
    *,
    dp: int = 1,
    zero: int = 0,
    precision: str = "mixed",
    n_tensors: int = 0,
    fp32_grad_accum: bool | str = False,
) -> TrainingMemory:
    """Bytes of weights, gradients and Adam optimizer states held by one data-parallel rank.

    ZeRO (Rajbhandari et al. 2019, arXiv:1910.02054), §3.1 and §5, with Ψ = ``num_params`` and
    Nd = ``dp``:

    ========  ==============  ==============  =====================
    stage     params          grads           optimizer
    ========  ==============  ==============  =====================
    0 (DDP)   2Ψ              2Ψ              KΨ
    1 (Pos)   2Ψ              2Ψ              KΨ / Nd
    2 (+g)    2Ψ              2Ψ / Nd         KΨ / Nd
    3 (+p)    2Ψ / Nd         2Ψ / Nd         KΨ / Nd
    ========  ==============  ==============  =====================

    ``precision="mixed"``: 16-bit weights and gradients, K = 12 (fp32 master weights, Adam momentum
    and variance, 4 bytes each), 16Ψ in all. ``precision="fp32"``: weights 4Ψ, gradients 4Ψ, Adam
    8Ψ. The divisions are exact (floats), as in the paper, so Ψ = 7.5e9 and Nd = 64 give the
    paper's Figure 1: 120 GB, 31.4 GB, 16.6 GB and 1.9 GB. A real partition rounds each shard up
    to whole elements (and often pads for alignment), a few bytes more on some ranks.

    ``fp32_grad_accum`` (mixed precision only): gradients accumulated over micro-batches in fp32,
    counted with the gradients and sharded like them (÷Nd from stage 2 on). Two conventions, by name:

    - ``"main_grad"``: the fp32 buffer *replaces* the 16-bit gradient, 4Ψ of gradients, 18Ψ in all
      unsharded. Megatron-LM's ``main_grad`` (the backward adds into it; Megatron-Core's
      distributed-optimizer table, "float16 param, fp32 grads": 2 + 4 + 12 = 18 bytes).
    - ``"both"`` (also ``True``): the 16-bit gradient *and* the fp32 buffer, 6Ψ of gradients, 20Ψ in
      all: the "BF16 w/ FP32 grad acc" column of the Ultra-Scale Playbook (Tazi et al. 2025, Hugging
      Face, its memory-usage section), for code that casts each micro-batch's bf16 gradient into an
      fp32 sum.

    In ``"fp32"`` precision the gradients already are fp32, so the option is refused there. Not
    counted: temporary buffers and allocator fragmentation.

    ``n_tensors``: PyTorch's ``Adam``/``AdamW`` also keeps a scalar fp32 ``step`` tensor for every
    parameter tensor, 4 bytes each. ``n_tensors=0`` reproduces the paper; ``n_tensors=
    len(list(model.parameters()))`` gives the bytes ``torch.optim.AdamW`` actually allocates. These
    4·n_tensors bytes are added to the optimizer **unsharded**: when every tensor is split across
    the ranks (ZeRO's flat partition, FSDP's per-parameter shards) each rank keeps a step counter
    for every tensor it holds a slice of. Schemes that hand out whole tensors keep fewer; the
    difference is a few kilobytes.

    Returns a :class:`TrainingMemory` in bytes with ``activations=0``.
    """
    _require_count("num_params", num_params)
    require_positive(dp=dp)
    _choice("zero", zero, ZERO_STAGES)
    _choice("precision", precision, tuple(_STATE_BYTES))
    if isinstance(n_tensors, bool) or not isinstance(n_tensors, int) or n_tensors < 0:
        raise ValueError(
            f"n_tensors must be a non-negative integer (the number of parameter tensors), got {n_tensors!r}"
        )
    _check_grad_accum(fp32_grad_accum, precision)

    p, g, o = (b * num_params for b in _STATE_BYTES[precision])
    accum = _grad_accum_name(fp32_grad_accum)
    if accum:
        g = GRAD_ACCUM[accum] * num_params
    if zero >= 1:
        o /= dp
    if zero >= 2:
        g /= dp
    if zero >= 3:
        p /= dp
    return TrainingMemory(params=float(p), grads=float(g), optimizer=float(o + 4 * n_tensors))
