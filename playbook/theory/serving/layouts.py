"""Predict: TP against DP replicas for serving on a fixed number of GPUs. Each layout (``dp`` replicas
of ``tp·pp`` GPUs) gets its KV capacity, time to first token, time per output token and tokens/s
from ``playbook.theory.serving.serving``'s roofline (Pope et al. 2022, arXiv:2211.05102, §3: the TP×DP
trade of serving); ``recommend`` picks the one with the most tokens/s and says why.

Units: bytes, seconds, tokens/s. Pure arithmetic, no torch.
"""

from __future__ import annotations

from playbook.config import ModelConfig, divisors, require_positive
from playbook.hardware import MEM_UTIL, Hardware
from playbook.theory.serving.serving import BLOCK_SIZE, RING_STEP, decode, kv_capacity, prefill


def serving_layout(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    tp: int,
    dp: int,
    pp: int = 1,
    context: int,
    mem_util: float = MEM_UTIL,
    block_size: int = BLOCK_SIZE,
    batch: int | None = None,
    dtype: str = "bf16",
    mfu: float = 0.5,
    mbu: float = 0.8,
    latency: float | str = RING_STEP,
) -> dict:
    """One row of the TP-against-DP-replicas comparison: ``dp`` replicas of ``tp·pp`` GPUs each. KV capacity,
    TTFT of a ``context``-token prompt, TPOT with ``batch`` sequences per replica (default as many
    as fit) at ``context`` tokens each, and tokens/s in all and per GPU."""
    cap = kv_capacity(cfg, hw, context=context, tp=tp, pp=pp, mem_util=mem_util, block_size=block_size, dtype=dtype)
    seqs = cap["max_seqs"] if batch is None else batch
    micro = max(seqs // pp, 1)  # with pp > 1, pp micro-batches in flight share the replica's cache
    rates = dict(tp=tp, pp=pp, dtype=dtype, mfu=mfu, mbu=mbu, latency=latency)
    step = decode(cfg, hw, context=context, batch=micro, **rates)
    tokens_per_s = dp * micro * pp / step.seconds
    return {
        "layout": f"tp{tp}×dp{dp}" + (f"×pp{pp}" if pp > 1 else ""),
        "tp": tp,
        "dp": dp,
        "pp": pp,
        "gpus": tp * dp * pp,
        "weights_per_gpu": cap["weights"],
        "kv_per_gpu": cap["kv_budget"],
        "kv_tokens_per_replica": cap["tokens"],
        "seqs_per_replica": seqs,
        "seqs": dp * seqs,
        "ttft": prefill(cfg, hw, prompt=context, **rates).seconds,
        "tpot_batch1": decode(cfg, hw, context=context, batch=1, **rates).seconds,
        "tpot": step.seconds,
        "decode_bound": step.bound,
        "tp_comm_per_token": step.comm,
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_gpu": tokens_per_s / (tp * dp * pp),
    }


def compare_layouts(cfg: ModelConfig, hw: Hardware, *, gpus: int, context: int, **options) -> list[dict]:
    """Every tp × dp = ``gpus`` with tp dividing the heads (and within one node) whose replica fits a
    sequence of ``context`` tokens, smallest tp first."""
    require_positive(gpus=gpus)
    rows = []
    for tp in divisors(gpus):
        if cfg.n_heads % tp or tp > hw.devices_per_node:
            continue
        try:
            rows.append(serving_layout(cfg, hw, tp=tp, dp=gpus // tp, context=context, **options))
        except ValueError:
            continue  # the weights do not fit at this tp
    return rows


def recommend(rows: list[dict]) -> tuple[dict, str]:
    """The layout with the most tokens/s, and why (against the lowest-latency one)."""
    if not rows:
        raise ValueError("no layout fits: add GPUs, shorten the context or quantize the weights")
    best = max(rows, key=lambda r: r["tokens_per_s"])
    fastest = min(rows, key=lambda r: r["tpot_batch1"])
    why = (
        f"{best['layout']} serves the most tokens/s ({best['tokens_per_s']:,.0f}) with {best['seqs']} sequences "
        f"of KV room in all"
    )
    if fastest is not best:
        why += (
            f"; {fastest['layout']} answers one request fastest ({fastest['tpot_batch1'] * 1e3:.1f} ms per token "
            f"vs {best['tpot_batch1'] * 1e3:.1f} ms)"
        )
    else:
        why += f", and it also has the lowest latency per token ({best['tpot_batch1'] * 1e3:.1f} ms at batch 1)"
    return best, why
