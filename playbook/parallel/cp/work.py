"""Measure ring attention's work per rank: which blocks each rank computes, and how long it takes.

The prediction is ``playbook.theory.cp.ring_schedule`` / ``ring_blocks_per_rank`` /
``ring_work_per_rank`` (causal attention over contiguous or zig-zag shards: Liu et al. 2023,
arXiv:2310.01889; zig-zag: Llama 3, Dubey et al. 2024, arXiv:2407.21783, §3.3.2); this runs the
kernel alone on random data and reads the kernel's own log of the blocks it computed.
"""

from __future__ import annotations

import torch

from playbook.dims import ParallelDims
from playbook.parallel.cp.ring_attention import VARIANTS


def ring_work_on_rank(
    ctx,
    *,
    seq_len: int,
    zigzag: bool,
    causal: bool = True,
    batch: int = 1,
    heads: int = 4,
    kv_heads: int = 4,
    head_dim: int = 32,
    repeats: int = 3,
    warmup: int = 1,
) -> dict:
    """Rank function: ring attention alone, forward + backward on random data. Returns the blocks
    this rank computed in one forward (the kernel's own log), their score elements, and per pass
    (mean of ``repeats`` after ``warmup`` untimed passes, forward + backward) the seconds inside ring
    blocks: ``seconds`` wall time (from the tracer's spans), ``cpu_seconds`` this rank's CPU time,
    which does not count time the OS gave to other ranks (n ranks on fewer cores)."""
    gen = torch.Generator().manual_seed(ctx.rank)
    shard = seq_len // ctx.world_size
    q = torch.randn(batch, heads, shard, head_dim, generator=gen).to(ctx.device).requires_grad_()  # [b, a, s/n, d]
    k = torch.randn(batch, kv_heads, shard, head_dim, generator=gen).to(ctx.device).requires_grad_()  # [b, g, s/n, d]
    v = torch.randn(batch, kv_heads, shard, head_dim, generator=gen).to(ctx.device).requires_grad_()  # [b, g, s/n, d]
    group = ctx.mesh_for(ParallelDims(cp=ctx.world_size)).group("cp")
    log: list[dict] = []
    for i in range(warmup + repeats):
        if i == warmup:
            log.clear()
            first_timed = len(ctx.tracer.spans)
        VARIANTS["ring"](q, k, v, group, zigzag=zigzag, causal=causal, log=log).sum().backward()
    spans = [s for s in ctx.tracer.spans[first_timed:] if s.name.startswith("ring block")]
    forward = [b for b in log if b["pass_"] == "forward"][: len(log) // (2 * repeats)]
    return {
        "blocks": forward,
        "elements": sum(b["rows"] * b["cols"] for b in forward),
        "seconds": sum(s.duration for s in spans) / repeats,
        "cpu_seconds": sum(b["cpu_seconds"] for b in log) / repeats,
    }
