"""The four-axis layout's speed on this machine: one step of gpt-tiny in dp2×tp2×pp2×cp2 on 16 gloo ranks.

    python benchmarks/bench_hybrid16.py [--schedule 1f1b|interleaved] [--steps 4]

Reports (issue: "one step of gpt-tiny in dp2×tp2×pp2×cp2 on 16 gloo ranks, median of 3 with the
load shown, under 3 s on 2 cores"):
- ``start_s``: 16 gloo ranks started and joined (cold forkserver), and ``rss_mib`` / ``pss_mib``:
  their resident memory once started, summed over the 16 processes (PSS shares the pages they
  have in common, so it is what they cost the machine together);
- ``first_call_s``: the first training call, which builds the mesh's process groups;
- ``step_s``: the median over the steps after the first of one training step (the slowest rank
  sets it), with ZeRO-1 over dp×cp and sequence parallelism, as tests/parallel/hybrid/test_hybrid16.py runs it;
- ``loadavg_before`` / ``loadavg_after``: /proc/loadavg. Above ~2 on 2 cores other work was
  competing for them and the figures say more about the load than about the code.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench_mesh import timed_steps  # the same rank function: train_hybrid with each step's time


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


def resident_mib(pid: int) -> tuple[float, float]:
    """(RSS, PSS) of ``pid`` in MiB, from /proc (PSS: 0 where smaps_rollup is not readable)."""
    fields = {}
    for path in (f"/proc/{pid}/status", f"/proc/{pid}/smaps_rollup"):
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in ("VmRSS", "Pss"):
                        fields[key] = int(value.split()[0]) / 1024  # kB -> MiB
        except OSError:
            pass
    return fields.get("VmRSS", 0.0), fields.get("Pss", 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", default="1f1b", choices=["1f1b", "interleaved"])
    parser.add_argument("--steps", type=int, default=4, help="steps per call; the first is left out of the median")
    args = parser.parse_args()
    from playbook.cluster import Ranks
    from playbook.dims import ParallelDims
    from playbook.theory.hybrid.plan import Plan
    from playbook.parallel.training import TrainSetup

    setup = TrainSetup(steps=args.steps)
    plan = Plan(ParallelDims(dp=2, tp=2, pp=2, cp=2), zero=1, sequence_parallel=True, schedule=args.schedule)
    plan.check(setup)
    out = {"layout": f"{plan.dims} zero=1 sp schedule={args.schedule} v={plan.v}", "loadavg_before": loadavg()}
    t0 = time.perf_counter()
    ranks = Ranks(16, backend="gloo").start()
    out["start_s"] = time.perf_counter() - t0
    try:
        memory = [resident_mib(p.pid) for p in ranks.processes]
        out["rss_mib"], out["pss_mib"] = sum(m[0] for m in memory), sum(m[1] for m in memory)
        t0 = time.perf_counter()
        res = ranks.run(timed_steps, setup, plan, progress=False)
        out["first_call_s"] = time.perf_counter() - t0
        per_step = [max(r["steps_s"][i] for r in res) for i in range(1, args.steps)]  # the slowest rank
        out["step_s"], out["step_s_all"] = statistics.median(per_step), per_step
        memory = [resident_mib(p.pid) for p in ranks.processes]
        out["rss_mib_after"], out["pss_mib_after"] = sum(m[0] for m in memory), sum(m[1] for m in memory)
    finally:
        ranks.stop()
    out["loadavg_after"] = loadavg()
    print(json.dumps(out, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
