"""Data-parallel scaling on real ranks: the same training on the first 1, 2, 4 ranks of the world
(strong: the global batch fixed; weak: fixed per rank), and the table of throughput, speedup and
efficiency against the smallest run.
"""

from __future__ import annotations

from dataclasses import replace

import torch.distributed as dist

from playbook.parallel.dp.run import DEFAULT_BUCKET_MB
from playbook.parallel.dp.train import median_after_first, train_dp
from playbook.parallel.training import TrainSetup
from playbook.theory.dp.buckets import bucket_cap_bytes


def scaling_on_rank(
    ctx,
    setup: TrainSetup,
    *,
    sizes=(1, 2, 4),
    weak: bool = False,
    variant: str = "bucketed",
    bucket_mb: float = DEFAULT_BUCKET_MB,
) -> list[dict]:
    """Train on the first n ranks of this world for each n in ``sizes`` (a subgroup each; the other
    ranks wait at a barrier). Strong scaling: ``setup.global_batch`` fixed. Weak (``weak=True``):
    ``setup.global_batch`` rows *per rank*. Rank 0 returns one row per n; the others []."""
    if max(sizes) > ctx.world_size:
        raise ValueError(f"sizes {sizes} exceed the {ctx.world_size} ranks running; use ranks({max(sizes)})")
    world, rows = ctx.mesh.group("dp"), []
    for n in sizes:
        # The first n ranks of the world: no layout of this world is that group (a layout covers every
        # rank), so it is made here, per call and by every rank, outside the timed steps.
        group = dist.new_group(list(range(n)))
        if ctx.rank < n:
            run = replace(setup, global_batch=setup.global_batch * n) if weak else setup
            r = train_dp(
                run,
                variant=variant,
                group=group,
                device=ctx.device,
                cap_bytes=bucket_cap_bytes(bucket_mb),
                tracer=ctx.tracer,
            )
            compute = [
                sum(
                    s["end"] - s["start"]
                    for s in r.spans
                    if s["name"] in ("forward", "backward") and a <= s["start"] <= b
                )
                for a, b in r.windows
            ]
            rows.append(
                {
                    "ranks": n,
                    "global_batch": run.global_batch,
                    "per_rank_batch": run.global_batch // n,
                    "step_s": median_after_first(r.step_seconds),
                    "compute_s": median_after_first(compute),
                }
            )
        dist.barrier(group=world)
    return rows if ctx.rank == 0 else []


def scaling_table(rows: list[dict], seq_len: int, weak: bool = False) -> list[dict]:
    """Add throughput (tokens/s of the global batch) and efficiency against the first row.
    Strong: speedup = T₁/Tₙ, efficiency = speedup/n. Weak: efficiency = T₁/Tₙ (same work per rank)."""
    base = rows[0]
    out = []
    for r in rows:
        speedup = base["step_s"] / r["step_s"]
        scale = r["ranks"] / base["ranks"]
        out.append(
            {
                **r,
                "tokens_per_s": r["global_batch"] * seq_len / r["step_s"],
                "speedup": speedup * (scale if weak else 1),
                "efficiency": speedup if weak else speedup / scale,
                "compute_vs_base": r["compute_s"] / base["compute_s"],
            }
        )
    return out
