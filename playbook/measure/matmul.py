"""Measure how fast one rank's share of a tensor-parallel matmul runs: "when TP stops paying".

Splitting a layer over t ranks makes each rank's matmul t times thinner; below some width the
hardware no longer reaches its peak FLOP/s, so TP's compute does not shrink as 1/t.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F


def matmul_throughput(
    tokens: int,
    hidden: int,
    ffn: int,
    tps=(1, 2, 4, 8),
    *,
    repeats: int = 10,
    dtype=torch.float32,
    device="cpu",
    threads: int | None = 1,
) -> list[dict]:
    """Time one rank's column-parallel matmul [tokens, h] @ [h, f/t]ᵀ for each t (median of
    ``repeats``) and return ``[{tp, shape, seconds, min_seconds, flops_per_s}, ...]``; FLOPs = 2·tokens·h·f/t.
    ``threads``: CPU threads while timing (1, like one rank on this machine; None leaves it)."""
    saved = torch.get_num_threads()
    if threads and torch.device(device).type == "cpu":
        torch.set_num_threads(threads)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    out = []
    try:
        x = torch.randn(tokens, hidden, dtype=dtype, device=device)  # [tokens, h]
        for t in tps:
            w = torch.randn(ffn // t, hidden, dtype=dtype, device=device)  # [f/t, h], this rank's slice
            for _ in range(2):
                F.linear(x, w)  # warm up
            times = []
            for _ in range(repeats):
                sync()
                t0 = time.perf_counter()
                F.linear(x, w)  # [tokens, f/t]
                sync()
                times.append(time.perf_counter() - t0)
            seconds = sorted(times)[len(times) // 2]
            out.append(
                {
                    "tp": t,
                    "shape": (tokens, hidden, ffn // t),
                    "seconds": seconds,
                    "min_seconds": min(times),
                    "flops_per_s": 2 * tokens * hidden * (ffn // t) / seconds,
                }
            )
    finally:
        torch.set_num_threads(saved)
    return out
