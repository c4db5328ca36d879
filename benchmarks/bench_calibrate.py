"""``playbook calibrate``, timed end to end (goal: under 60 s on 2 cores).

    python benchmarks/bench_calibrate.py [--ranks 2] [--quick] [--json]

Runs the command as a user would, in a fresh interpreter (importing torch, starting the ranks,
timing every collective and the matmuls, writing the profile), and reports the wall time beside
the time the calibration itself counted, with the load average before and after. The goal lives
here, never in a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 60.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "profile.json"
        cmd = [sys.executable, "-m", "playbook.cli", "calibrate", "--ranks", str(args.ranks), "--out", str(out)]
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        subprocess.run(cmd + (["--quick"] if args.quick else []), check=True, capture_output=True)
        wall = time.perf_counter() - start
        profile = json.loads(out.read_text())
    result = {
        "ranks": args.ranks,
        "quick": args.quick,
        "wall_s": wall,
        "calibration_s": profile["calibration_seconds"],
        "goal_s": GOAL_S,
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    verdict = "meets" if wall < GOAL_S else "misses"
    print(
        f"playbook calibrate --ranks {args.ranks}{' --quick' if args.quick else ''}: {wall:.1f} s wall "
        f"({profile['calibration_seconds']:.1f} s measuring, the rest starting Python, torch and the ranks), "
        f"{verdict} the {GOAL_S:g} s goal; load average {load_before:.2f} -> {result['load_average_1min']['after']:.2f} "
        f"on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
