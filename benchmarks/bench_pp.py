"""Our pipeline executor vs torch.distributed.pipelining: step time per schedule, on real gloo ranks.

    python benchmarks/bench_pp.py                 # p=2, gpt-tiny with 4 layers, m=8, 6 steps
    python benchmarks/bench_pp.py --p 4 --layers 8 --m 8 --global-batch 32

Both run the same chunks (``playbook.parallel.pp_executor.Chunk``) on the same data; the step time is the
median over the steps after the first (which pays one-off costs: torch's shape inference,
allocator warm-up), averaged over ranks. Also prints each of ours' predicted and measured bubble.
On a shared 2-core machine expect ±30% noise: run it twice.
"""

from __future__ import annotations

import argparse
import statistics

from playbook.cluster import Ranks
from playbook.measure.pipeline import compare_bubble
from playbook.parallel.pp import PipelineSetup, native_on_rank, on_rank
from playbook.theory.schedules import make_schedule


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p", type=int, default=2)
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--v", type=int, default=2, help="chunks per rank for interleaved")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    setup = PipelineSetup(
        model="gpt-tiny", steps=args.steps, global_batch=args.global_batch, seq_len=args.seq_len, n_layers=args.layers
    )
    print(
        f"p={args.p}, m={args.m}, gpt-tiny with {args.layers} layers, global batch {args.global_batch} × {args.seq_len}"
    )
    print(
        f"{'schedule':<12}{'ours (ms)':>11}{'native (ms)':>13}{'ours/native':>13}{'bubble pred':>13}{'bubble meas':>13}"
    )
    with Ranks(args.p, backend="gloo", timeout=300) as ranks:
        for name in ("gpipe", "1f1b", "interleaved", "zb-h1"):
            v = args.v if name == "interleaved" else 1
            ours = ranks.run(on_rank, setup, schedule=name, m=args.m, v=v, progress=False)
            native = ranks.run(native_on_rank, setup, schedule=name, m=args.m, v=v, progress=False)

            def step(results):
                return statistics.mean(statistics.median(r["step_s"][1:]) for r in results) * 1e3

            bubble = compare_bubble(ours, make_schedule(name, args.p, args.m, v))
            a, b = step(ours), step(native)
            print(
                f"{name:<12}{a:>11.1f}{b:>13.1f}{a / b:>13.2f}"
                f"{bubble['bubble_predicted']['idle_over_total']:>13.1%}{bubble['bubble_measured']['idle_over_total']:>13.1%}"
            )
    print(
        "bubble: idle / total time (GPipe's definition); predicted by simulating the schedule with this run's measured costs"
    )


if __name__ == "__main__":
    main()
