"""Our pipeline executor vs torch.distributed.pipelining: step time per schedule, on real gloo ranks.

    python benchmarks/bench_pp.py                 # p=2, gpt-tiny with 4 layers, m=8, 6 steps
    python benchmarks/bench_pp.py --p 4 --layers 8 --m 8 --global-batch 32
    python benchmarks/bench_pp.py --p 4 --layers 8 --m 8 --global-batch 32 --schedules zb-v,dualpipe-v --no-native

Both run the same chunks (``playbook.parallel.pp.executor.Chunk``) on the same data; the step time is the
median over the steps after the first (which pays one-off costs: torch's shape inference,
allocator warm-up), averaged over ranks. Also prints each of ours' predicted and measured bubble and
their ratio (the pipeline issue's goal: within 10% on an idle machine), with the load average before
and after: on a shared 2-core machine expect ±30% noise, and a load above the core count means the
comparison says nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics

from playbook.cluster import Ranks
from playbook.measure.pipeline import compare_bubble
from playbook.parallel.pp.run import PipelineSetup, on_rank
from playbook.parallel.pp.native import native_on_rank
from playbook.theory.pp.schedules import make_schedule


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p", type=int, default=2)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--v", type=int, default=2, help="chunks per rank for interleaved")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--schedules", default="gpipe,1f1b,interleaved,zb-h1,zb-v,dualpipe-v")
    ap.add_argument("--no-native", action="store_true", help="ours only (torch's runs double the time)")
    args = ap.parse_args()
    setup = PipelineSetup(
        model="gpt-tiny", steps=args.steps, global_batch=args.global_batch, seq_len=args.seq_len, n_layers=args.layers
    )
    print(
        f"p={args.p}, m={args.m}, gpt-tiny with {args.layers} layers, global batch {args.global_batch} × {args.seq_len}; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    )
    print(
        f"{'schedule':<12}{'ours (ms)':>11}{'native (ms)':>13}{'ours/native':>13}{'bubble pred':>13}{'bubble meas':>13}{'meas/pred':>11}"
    )
    with Ranks(args.p, backend="gloo", timeout=300) as ranks:
        for name in args.schedules.split(","):
            v = {"interleaved": args.v, "zb-v": 2, "dualpipe-v": 2}.get(name, 1)
            ours = ranks.run(on_rank, setup, schedule=name, m=args.m, v=v, progress=False)
            native = (
                None
                if args.no_native
                else ranks.run(native_on_rank, setup, schedule=name, m=args.m, v=v, progress=False)
            )

            def step(results):
                return statistics.mean(statistics.median(r["step_s"][1:]) for r in results) * 1e3

            bubble = compare_bubble(ours, make_schedule(name, args.p, args.m, v))
            a = step(ours)
            b = step(native) if native else float("nan")
            predicted = bubble["bubble_predicted"]["idle_over_total"]
            measured = bubble["bubble_measured"]["idle_over_total"]
            print(
                f"{name:<12}{a:>11.1f}{b:>13.1f}{a / b:>13.2f}"
                f"{predicted:>13.1%}{measured:>13.1%}{measured / predicted if predicted else float('nan'):>11.2f}"
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(
        "bubble: idle / total time (GPipe's definition); predicted by simulating the schedule with this run's measured costs"
    )


if __name__ == "__main__":
    main()
