"""The mesh spine's speed on this machine: 8 ranks up, one hybrid step, the composition matrix.

    python benchmarks/bench_mesh.py [--steps 5] [--matrix]

Reports (issue: "8 gloo ranks start in under 6 s, one dp2×tp2×pp2 step of gpt-tiny takes under
2 s, and the composition matrix adds under 90 s to CI"):
- ``start_s``: 8 gloo ranks started and joined (cold forkserver);
- ``mesh_s``: the first call that builds the dp2×tp2×pp2 mesh's groups, and ``mesh_again_s`` a
  call that finds them cached;
- ``step_s``: median seconds of one training step of gpt-tiny on dp2×tp2×pp2 (steps after the first);
- with ``--matrix``: the wall time of ``pytest tests/parallel/hybrid/test_hybrid.py``.
Every figure comes with the 1-minute load average it was measured under: on a busy 2-core machine
the numbers mean little (os.getloadavg() above ~2 means other work was competing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def build(ctx, dims):
    return ctx.mesh_for(dims).coords


def timed_steps(ctx, setup, plan):
    import time

    from playbook.parallel.hybrid.parallelize import train_hybrid

    t0 = time.perf_counter()
    out = train_hybrid(ctx, setup, plan)
    spans = [s for s in ctx.tracer.spans if s.kind == "compute" and s.name.startswith("step ")]
    return {"total_s": time.perf_counter() - t0, "steps_s": [s.end - s.start for s in spans], "rank": out["rank"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--matrix", action="store_true", help="also time the composition-matrix tests")
    args = parser.parse_args()
    from playbook.cluster import Ranks
    from playbook.dims import ParallelDims
    from playbook.theory.hybrid.plan import Plan
    from playbook.parallel.training import TrainSetup

    out = {"load_before": os.getloadavg()[0]}
    t0 = time.perf_counter()
    ranks = Ranks(8, backend="gloo").start()
    out["start_s"] = time.perf_counter() - t0
    dims = ParallelDims(dp=2, tp=2, pp=2)
    t0 = time.perf_counter()
    ranks.run(build, dims, progress=False)
    out["mesh_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ranks.run(build, dims, progress=False)
    out["mesh_again_s"] = time.perf_counter() - t0
    res = ranks.run(timed_steps, TrainSetup(steps=args.steps), Plan(dims), progress=False)
    per_step = [max(r["steps_s"][i] for r in res) for i in range(1, args.steps)]  # the slowest rank sets the step
    out["step_s"] = statistics.median(per_step)
    out["step_s_all"] = per_step
    ranks.stop()
    if args.matrix:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/parallel/hybrid/test_hybrid.py"], check=True)
        out["matrix_s"] = time.perf_counter() - t0
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
