"""Prefix caching per serving layout, measured on real ranks at a shrunk scale.

The claim of the chapter: a lower tensor-parallel degree leaves less memory per replica for the KV
cache, and that hurts prefix caching. ``theory.serving.prefix_cache.prefix_layouts`` predicts hit rates at
scale (Llama-3.1-70B on 8 H100s); ``shrunk_blocks`` turns its KV blocks per replica into a laptop
budget that keeps the ratios between layouts (the budget knob: ``kv_scale`` of the tokens, in
blocks of ``block_size``), and ``measure`` serves the shrunk trace with those budgets on real ranks,
each replica with its own ``PrefixKVCache`` behind the router.
"""

from __future__ import annotations

import os

from playbook.dims import ParallelDims


def shrunk_blocks(rows: list[dict], *, scale_block: int, block_size: int, kv_scale: float, cap: int) -> dict:
    """Per layout: ``blocks_per_replica`` × ``scale_block`` tokens × ``kv_scale``, in blocks of
    ``block_size``, at most ``cap`` (the trace's whole size: more blocks than that change nothing)."""
    return {r["layout"]: min(cap, int(r["blocks_per_replica"] * scale_block * kv_scale // block_size)) for r in rows}


def measure(ranks, cfg, trace, *, layouts, blocks: dict, block_size: int, router: str, seed: int = 0) -> list[dict]:
    """For each ``(name, tp, dp)`` of ``layouts`` on ``ranks`` (a ``Ranks`` of tp·dp): prompt tokens
    found cached, hit rate, evictions, and each request's tokens (to hold against the reference)."""
    from playbook.serve.ranks import serve_on_rank
    from playbook.serve.batching import Request
    from playbook.theory.serving.router import route

    reqs = [Request(i, t.prompt, t.max_new, i) for i, t in enumerate(trace)]
    rows = []
    for name, tp, dp in layouts:
        where = route([r.prompt for r in reqs], dp=dp, block_size=block_size, policy=router)
        answers = ranks.run(
            serve_on_rank,
            cfg=cfg,
            seed=seed,
            dims=ParallelDims(dp=dp, tp=tp),
            requests=reqs,
            n_blocks=blocks[name],
            block_size=block_size,
            max_batch=4,
            prefix_cache=True,
            assign=where,
        )
        leads = [a for a in answers if a["coords"]["tp"] == 0]
        cached = sum(sum(a["cached"].values()) for a in leads)
        rows.append(
            {
                "layout": name,
                "ran as": f"tp{tp}×dp{dp}",
                "blocks_per_replica": blocks[name],
                "hit_rate": cached / sum(len(r.prompt) for r in reqs),
                "evictions": sum(a["evictions"] for a in leads),
                "tokens": {i: t for a in answers for i, t in a["tokens"].items()},
                "load": os.getloadavg()[0],
            }
        )
    return rows
