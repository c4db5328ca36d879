"""Quantized serving, predicted: what 8-bit weights and an 8-bit KV cache buy in room and in speed.

Bytes: a KV block of b tokens in dtype x holds ``b · kv_bytes_per_token(x)`` plus, when x is 8-bit,
one fp32 scale per layer per K and V per KV head (``serving.kv_block_bytes``); so the capacity
ratio against 16 bits is 2·data / (data + scales), a little under 2 (gpt-tiny's block of 16:
4,096 / 2,080 = 1.97; Llama 3.1 70B's: 1.998). Weights: each block linear in one byte plus one fp32
scale per output channel (``theory.serving.weights``).

At scale (vLLM's sizing, ``serving.kv_capacity``): halving the weights frees memory for the cache
*and* halving the cache doubles what that memory holds, so sequences that fit grow by more than
2× when the weights filled much of the GPU (Llama 3.1 70B on tp8 H100: weights 17.6 → 9.1 GB per
GPU). Decode time comes from the roofline the serving theory already uses (Pope et al. 2022,
arXiv:2211.05102, §3.1: a step reads this GPU's weights and the batch's KV once): with 8-bit bytes
a step at the same batch reads about half, so it is about twice as fast while memory-bound, and the
larger batch that now fits is served at about the old step time. FLOPs stay priced at the bf16
peak (a dequantizing kernel; FP8 tensor cores would double it): decode is memory-bound here anyway.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.serving.serving import BLOCK_SIZE, decode, kv_block_bytes, kv_capacity

KV_DTYPES = ("fp32", "bf16", "fp16", "int8", "fp8")


def capacity_ratio(
    cfg: ModelConfig, *, tp: int = 1, dtype: str = "int8", against: str = "bf16", block_size: int = BLOCK_SIZE
) -> float:
    """Blocks of ``dtype`` that fit in the bytes of one block of ``against`` (the scale term included)."""
    return kv_block_bytes(cfg, tp=tp, dtype=against, block_size=block_size) / kv_block_bytes(
        cfg, tp=tp, dtype=dtype, block_size=block_size
    )


def blocks_in(budget: float, cfg: ModelConfig, *, tp: int = 1, block_size: int = 4, dtypes=KV_DTYPES) -> list[dict]:
    """Per KV dtype: bytes of a block on one of ``tp`` ranks, and how many fit in ``budget`` bytes."""
    rows = []
    for d in dtypes:
        block = kv_block_bytes(cfg, tp=tp, dtype=d, block_size=block_size)
        rows.append({"kv_dtype": d, "block_bytes": block, "blocks": int(budget // block)})
    return rows


def at_scale(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    context: int,
    tp: int,
    formats=(("bf16", None, "bf16"), ("bf16", None, "fp8"), ("bf16", "fp8", "bf16"), ("bf16", "fp8", "fp8")),
    batch: int = 32,
    **rates,
) -> list[dict]:
    """For each (dtype, weight quantization, KV dtype): weights and KV budget per GPU, block bytes,
    sequences of ``context`` that fit, the decode step at ``batch`` and at the most that fit, and
    tokens/s per GPU there (the roofline, ``serving.decode``)."""
    rows = []
    for dtype, quantize, kv in formats:
        cap = kv_capacity(cfg, hw, context=context, tp=tp, dtype=dtype, kv_dtype=kv, quantize=quantize)
        fmt = dict(context=context, tp=tp, dtype=dtype, kv_dtype=kv, quantize=quantize, **rates)
        small = decode(cfg, hw, batch=batch, **fmt)
        full = decode(cfg, hw, batch=cap["max_seqs"], **fmt)
        rows.append(
            {
                "weights": quantize or dtype,
                "kv": kv,
                "weights_gb": cap["weights"] / 1e9,
                "kv_budget_gb": cap["kv_budget"] / 1e9,
                "block_bytes": cap["block_bytes"],
                "max_seqs": cap["max_seqs"],
                f"tpot_ms_at_{batch}": small.seconds * 1e3,
                "tpot_ms_at_max": full.seconds * 1e3,
                "tokens_per_s_per_gpu": cap["max_seqs"] / full.seconds / tp,
                "bound": full.bound,
            }
        )
    return rows
