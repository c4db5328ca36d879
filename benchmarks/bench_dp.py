"""Data parallelism, timed: our bucketed DP against DDP, and strong/weak scaling over 1, 2, 4 ranks.

    python benchmarks/bench_dp.py [--world-size 4] [--repeats 5] [--model gpt-small] [--json]

1. Step time of each variant (naive, bucketed, ddp) on the same ranks, model, data and bucket
   size, ``--repeats`` runs each in interleaved order (so that a burst of load on a shared machine
   hits every variant alike); per run the median step after the first, then the median over runs.
   Reported: bucketed / DDP and naive / bucketed step-time ratios, with the spread over repeats.
2. Scaling on the first 1, 2, 4 of those ranks (process subgroups): strong (global batch fixed)
   and weak (batch per rank fixed), as throughput with its baseline and efficiency, next to the
   compute time per rank, which shows when ranks outnumber the CPU cores.

Timings depend on the machine and on what else runs on it: state both when quoting them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import replace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--bucket-mb", type=float, default=0.5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from playbook.cluster import Ranks
    from playbook.parallel import TrainSetup
    from playbook.parallel.dp.run import on_rank
    from playbook.parallel.dp.scaling import scaling_on_rank, scaling_table

    setup = TrainSetup(model=args.model, steps=args.steps, global_batch=args.global_batch, seq_len=args.seq_len)
    n = args.world_size
    step = {"naive": [], "bucketed": [], "ddp": []}
    with Ranks(n, backend="gloo", timeout=600) as ranks:
        for _ in range(args.repeats):
            for variant in step:
                r = ranks.run(on_rank, setup, variant=variant, bucket_mb=args.bucket_mb, progress=False)[0]
                step[variant].append(statistics.median(r.step_seconds[1:]))
        sizes = tuple(k for k in (1, 2, 4, 8) if k <= n)
        strong = scaling_table(ranks.run(scaling_on_rank, setup, sizes=sizes, progress=False)[0], setup.seq_len)
        per_rank = replace(setup, global_batch=max(1, setup.global_batch // n))
        weak = scaling_table(
            ranks.run(scaling_on_rank, per_rank, sizes=sizes, weak=True, progress=False)[0], setup.seq_len, weak=True
        )

    med = {v: statistics.median(t) for v, t in step.items()}
    ratios = {
        "bucketed/ddp": [b / d for b, d in zip(step["bucketed"], step["ddp"])],
        "naive/bucketed": [a / b for a, b in zip(step["naive"], step["bucketed"])],
    }
    out = {
        "setup": {
            **setup.as_dict(),
            "world_size": n,
            "bucket_mb": args.bucket_mb,
            "repeats": args.repeats,
            "cpu_cores": len(os.sched_getaffinity(0)),
            "load_average": os.getloadavg(),
        },
        "step_seconds_median": med,
        "step_seconds_runs": step,
        "ratios_median": {k: statistics.median(v) for k, v in ratios.items()},
        "ratios_range": {k: (min(v), max(v)) for k, v in ratios.items()},
        "strong": strong,
        "weak": weak,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    s = out["setup"]
    print(
        f"{args.model}, seq {args.seq_len}, global batch {args.global_batch}, {n} ranks, buckets {args.bucket_mb} MiB, "
        f"{args.repeats} repeats; {s['cpu_cores']} cores, load average {s['load_average'][0]:.1f}"
    )
    for v, t in med.items():
        print(f"  {v:>9}: median step {t * 1e3:8.1f} ms   (runs: {', '.join(f'{x * 1e3:.0f}' for x in step[v])})")
    for k, v in out["ratios_median"].items():
        lo, hi = out["ratios_range"][k]
        print(f"  {k:>15} step-time ratio: {v:.2f} (range over repeats {lo:.2f}-{hi:.2f})")
    for name, rows in (("strong scaling (global batch fixed)", strong), ("weak scaling (batch per rank fixed)", weak)):
        print(f"\n{name}; baseline: 1 rank; efficiency = {'T1/Tn' if rows is weak else 'speedup/n'}")
        print(" ranks  global  per rank  step ms  tokens/s  speedup  efficiency  compute/rank vs 1")
        for r in rows:
            print(
                f"{r['ranks']:>6} {r['global_batch']:>7} {r['per_rank_batch']:>9} {r['step_s'] * 1e3:>8.1f} "
                f"{r['tokens_per_s']:>9,.0f} {r['speedup']:>8.2f} {r['efficiency']:>11.0%} {r['compute_vs_base']:>12.2f}x"
            )


if __name__ == "__main__":
    main()
