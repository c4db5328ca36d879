"""``playbook calibrate``: measure this machine and write a hardware profile.

playbook calibrate --ranks 2 --out calibrated.json
playbook plan --hardware calibrated.json ...   (any command that takes --hardware reads the file)
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from playbook.cli import BadInput

_Formatter = argparse.ArgumentDefaultsHelpFormatter


def cmd_calibrate(args) -> int:
    """Time matmuls and every collective on ``--ranks`` gloo ranks, fit α and β, write the profile."""
    from playbook.cluster import max_local_ranks
    from playbook.measure.calibrate import calibrate

    limit = min(8, max_local_ranks())
    if not 2 <= args.ranks <= limit:
        raise BadInput(f"--ranks must be between 2 and {limit} local ranks, got {args.ranks}; try --ranks 2")
    out = Path(args.out)
    if out.suffix != ".json":
        raise BadInput(f"--out must name a .json file (Hardware.preset reads it by path), got {args.out!r}")
    if not out.parent.exists():
        raise BadInput(f"--out {args.out!r}: folder {str(out.parent)!r} does not exist; create it or pick another")
    profile = calibrate(args.ranks, quick=args.quick)
    out.write_text(json.dumps(profile, indent=2) + "\n")
    if args.json:
        print(json.dumps(profile, indent=2))
        return 0
    load = profile["load_average"]
    print(
        f"calibrated {args.ranks} gloo ranks in {profile['calibration_seconds']:.1f} s "
        f"(load average {load['before'][0]:.2f} before, {load['after'][0]:.2f} after, on {_cores()} cores)"
    )
    print(f"  {'collective':<15} {'alpha (us)':>10} {'bandwidth (GB/s)':>17} {'rms rel. residual':>18}")
    for op, f in profile["collectives"].items():
        bw = f"{f['bandwidth'] / 1e9:>17.2f}" if math.isfinite(f["bandwidth"]) else f"{'inf':>17}"
        pinned = f"  ({f['pinned']} pinned to 0)" if f["pinned"] else ""
        print(f"  {op:<15} {f['alpha'] * 1e6:>10.1f} {bw} {f['rms_rel_residual']:>17.0%}{pinned}")
    print(
        "  matmul (one thread): "
        + ", ".join(f"{r['size']}³ {r['flops_per_s'] / 1e9:.1f}" for r in profile["matmul"])
        + " GFLOP/s"
    )
    print(f"wrote {out}  (use it as --hardware {out})")
    return 0


def _cores() -> int:
    import os

    return os.cpu_count() or 1


def add_calibrate(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="measure this machine (matmul FLOP/s, α–β per collective) and write a hardware profile",
        formatter_class=_Formatter,
    )
    p.add_argument("--ranks", type=int, default=2, help="local gloo ranks to time the collectives on")
    p.add_argument("--out", default="calibrated.json", help="where to write the profile (.json)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (seconds; for tests)")
    p.add_argument("--json", action="store_true", help="print the profile instead of a summary")
    p.set_defaults(func=cmd_calibrate)
