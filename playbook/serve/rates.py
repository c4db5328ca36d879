"""Measure prefill and decode on real ranks, and the rates that turn the roofline into a prediction.

A roofline needs three rates of the machine it predicts: achievable FLOP/s (a prefill-sized matmul),
achievable memory bandwidth (a decode-sized matrix-vector product, which reads its whole weight
matrix for one row of output) and the latency of one all-reduce. ``calibrate_on_rank`` measures all
three on the ranks themselves, every rank at once, so that ranks sharing a memory bus or a core are
measured sharing it; ``local_hardware`` turns them into a ``Hardware`` for ``theory.serving.serving``.

``phases_on_rank`` times what the roofline predicts: prefill of one prompt at several lengths (time
to first token) and one decode step at several batch sizes (time per output token), on one
process or over a tensor-parallel group. Each time is the median of ``repeats``, and carries the
load average it was measured under (``os.getloadavg``): on a shared machine it is part of the number.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.dims import ParallelDims
from playbook.serve.generate import contiguous_store, forward_step
from playbook.serve.kv import KVCache


def bench_config() -> ModelConfig:
    """A GPT big enough that reading its weights (25.6M fp32 parameters, 102 MB) outweighs Python's
    per-layer overhead on a CPU, small enough to decode in milliseconds: hidden 768, 4 layers,
    12 heads (4 KV heads: tp up to 4), ffn 2048, a 256-token vocabulary."""
    return ModelConfig(
        vocab_size=256,
        hidden=768,
        n_layers=4,
        n_heads=12,
        n_kv_heads=4,
        ffn_hidden=2048,
        max_seq_len=256,
        name="gpt-serve-bench",
    )


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.no_grad()
def calibrate_on_rank(
    ctx, *, hidden: int = 768, ffn: int = 2048, weight_bytes: float = 100e6, tokens: int = 128, repeats: int = 3
) -> dict:
    """This rank's achievable FLOP/s ([tokens, h] @ [h, 4f] matmul), bandwidth ([1, h] @ [h, n] with
    a ``weight_bytes`` matrix, as large as the weights a decode step reads, so that it does not sit
    in the CPU's cache: a matrix-vector product's time is its weight's bytes) and one small
    all-reduce's seconds over the world, measured while every rank does the same."""
    w = torch.randn(4 * ffn, hidden)  # [4f, h]
    big = torch.randn(int(weight_bytes / 4 / hidden), hidden)  # [n, h] fp32, weight_bytes in all
    x, row = torch.randn(tokens, hidden), torch.randn(1, hidden)  # [tokens, h], [1, h]
    dist.barrier()
    matmul = _median_seconds(lambda: F.linear(x, w), repeats)
    dist.barrier()
    gemv = _median_seconds(lambda: F.linear(row, big), repeats)
    small = torch.zeros(hidden)
    dist.barrier()
    allreduce = _median_seconds(lambda: dist.all_reduce(small), repeats) if ctx.world_size > 1 else 0.0
    return {
        "rank": ctx.rank,
        "flops_per_s": 2 * tokens * hidden * 4 * ffn / matmul,
        "bytes_per_s": big.numel() * big.element_size() / gemv,
        "allreduce_seconds": allreduce,
        "load": os.getloadavg()[0],
    }


def local_hardware(calibration: list[dict], name: str = "this machine") -> tuple[Hardware, float]:
    """(a ``Hardware`` whose peak FLOP/s and bandwidth are the slowest rank's measured ones, the
    latency per ring step of an all-reduce): use with mfu = mbu = 1 in ``theory.serving.serving``."""
    n = len(calibration)
    flops = min(c["flops_per_s"] for c in calibration)
    bw = min(c["bytes_per_s"] for c in calibration)
    allreduce = max(c["allreduce_seconds"] for c in calibration)
    latency = allreduce / (2 * (n - 1)) if n > 1 else 0.0
    return Hardware(
        name=name,
        memory_bytes=16e9,
        peak_bf16_flops=flops,
        memory_bandwidth=bw,
        intra_node_bandwidth=10e9,
        inter_node_bandwidth=1e9,
        devices_per_node=max(n, 1),
    ), latency


@torch.no_grad()
def phases_on_rank(
    ctx,
    *,
    cfg: ModelConfig,
    seed: int = 0,
    tp: int | None = None,
    prompts=(16, 32, 64),
    batches=(1, 4, 16),
    context: int = 64,
    repeats: int = 3,
) -> dict:
    """Time prefill of one prompt of each length in ``prompts`` and one decode step of each batch in
    ``batches`` with ``context`` tokens already cached, over ``tp`` ranks (default: the world)."""
    from playbook.serve.ranks import build

    tp = tp or ctx.world_size
    model, _ = build(ctx, cfg, seed, ParallelDims(tp=tp, dp=ctx.world_size // tp))
    gen = torch.Generator().manual_seed(seed)
    layers = range(len(model.blocks))
    prefill = []
    for p in prompts:
        tokens = torch.randint(0, cfg.vocab_size, (1, p), generator=gen)  # [1, p]

        def run():
            cache = KVCache(len(model.blocks), 1)
            forward_step(model, tokens, [0], lambda i: contiguous_store(cache, i))

        prefill.append({"prompt": p, "seconds": _median_seconds(run, repeats), "load": os.getloadavg()[0]})
    one = KVCache(len(model.blocks), 1)  # one `context`-token prefill, copied into every row below:
    forward_step(  # a decode step's time does not depend on what its cache holds, only on its size
        model, torch.randint(0, cfg.vocab_size, (1, context), generator=gen), [0], lambda i: contiguous_store(one, i)
    )
    decode = []
    for b in batches:
        cache = KVCache(len(model.blocks), b)
        saved = [[[one.k[i][0].clone() for _ in range(b)], [one.v[i][0].clone() for _ in range(b)]] for i in layers]
        last = torch.randint(0, cfg.vocab_size, (b, 1), generator=gen)  # [b, 1]

        def step():
            for i in layers:  # back to `context` tokens, so every repeat decodes the same position
                cache.k[i], cache.v[i] = list(saved[i][0]), list(saved[i][1])
            forward_step(model, last, [context] * b, lambda i: contiguous_store(cache, i))

        decode.append(
            {"batch": b, "context": context, "seconds": _median_seconds(step, repeats), "load": os.getloadavg()[0]}
        )
    return {"rank": ctx.rank, "tp": tp, "prefill": prefill, "decode": decode}


def layout_on_rank(
    ctx,
    *,
    cfg: ModelConfig,
    dims: ParallelDims,
    prompts: torch.Tensor,
    new_tokens: int,
    seed: int = 0,
    calibrate: bool = True,
) -> dict:
    """One serving layout on these ranks: calibrate if asked (every rank at once, the gemv as large
    as this rank's weights; the rates are the machine's, so one calibration can serve several
    layouts), then each replica greedy-decodes its rows of ``prompts`` (``serve.ranks.greedy_on_rank``)."""
    from playbook.serve.ranks import greedy_on_rank

    cal = None
    if calibrate:
        cal = calibrate_on_rank(ctx, hidden=cfg.hidden, ffn=cfg.ffn_hidden, weight_bytes=cfg.num_params() * 4 / dims.tp)
    out = greedy_on_rank(ctx, cfg=cfg, seed=seed, dims=dims, prompts=prompts, new_tokens=new_tokens)
    return {**out, "calibration": cal, "load": os.getloadavg()[0]}


def measured_layout(answers: list[dict], dims: ParallelDims) -> dict:
    """Per layout, from ``layout_on_rank``'s answers: the median decode step (time per output token),
    tokens decoded per second by all replicas (each replica's decode time, the slowest counting),
    and the load average."""
    first = [a for a in answers if a["coords"]["tp"] == 0]
    steps = [s for a in first for s in a["step_seconds"]]
    slowest = max(sum(a["step_seconds"]) for a in first)
    return {
        "layout": f"tp{dims.tp}×dp{dims.dp}",
        "tpot": statistics.median(steps),
        "tokens_per_s": sum(a["decoded"] for a in first) / slowest,
        "load": max(a["load"] for a in answers),
    }
