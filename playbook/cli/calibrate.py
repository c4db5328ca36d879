"""``playbook calibrate``: measure this machine and write a hardware profile.

playbook calibrate --ranks 2 --out calibrated.json
playbook plan --hardware calibrated.json ...   (any command that takes --hardware reads the file)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from pathlib import Path

from playbook.cli.checks import BadInput
from playbook.validate import check_output_path, write_output

_Formatter = argparse.ArgumentDefaultsHelpFormatter


def cmd_calibrate(args) -> int:
    """Time matmuls and every collective on ``--ranks`` gloo ranks, fit α and β, write the profile."""
    from playbook.cluster import max_local_ranks
    from playbook.measure.calibrate import calibrate

    limit = min(8, max_local_ranks())
    if not 2 <= args.ranks <= limit:
        raise BadInput(f"--ranks must be between 2 and {limit} local ranks, got {args.ranks}; try --ranks 2")
    beside = (f"{Path(args.out).stem}-step-time.json",) if args.step_time else ()
    out = check_output_path("--out", args.out, "calibrated.json", suffix=".json", also=beside)
    if args.step_time:
        _max_seq(args.model)  # an unknown preset is refused before anything is measured
    profile = calibrate(args.ranks, quick=args.quick)
    _write_or_keep(out, json.dumps(profile, indent=2) + "\n")
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
    if args.step_time:
        rows = step_time(profile_path=out, model=args.model)
        table = out.with_name(f"{out.stem}-step-time.json")
        write_output("--out", table, json.dumps(rows, indent=2) + "\n")
        print(f"wrote {table}")
    return 0


def _write_or_keep(out: Path, text: str) -> None:
    """Write the profile; if that still fails (the disk filled, the folder went away), keep the
    measurement in a temporary file and say where, rather than lose seconds of measuring."""
    try:
        out.write_text(text)
    except OSError as e:
        fd, kept = tempfile.mkstemp(prefix="calibrated-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        raise BadInput(
            f"could not write --out {str(out)!r} ({e.strerror or e}); the measurement is kept in {kept}"
        ) from None


def step_time(profile_path: Path, model: str) -> list[dict]:
    """Predicted (from the profile) vs measured step time of every chapter strategy at 2 and 4 ranks."""
    from playbook.hardware import Hardware
    from playbook.parallel.step_time import step_time_table
    from playbook.parallel.training import TrainSetup

    setup = TrainSetup(model=model, global_batch=16, seq_len=min(128, _max_seq(model)), steps=3)
    rows = step_time_table(Hardware.preset(str(profile_path)), setup)
    print(
        f"\nstep time of {model}, global batch {setup.global_batch} × {setup.seq_len} tokens, median of 3 steps after 2"
    )
    print(
        f"  {'strategy':<16} {'ranks':>5} {'predicted':>10} {'compute':>8} {'comm':>7} {'bubble':>7} "
        f"{'measured':>9} {'fastest':>8} {'1 alone':>8} {'error':>7} {'load':>5}  why (|error| > 25%)"
    )
    for r in rows:
        if "skipped" in r:
            print(f"  {r['strategy']:<16} {r['ranks']:>5}  not run: {r['skipped']}")
            continue
        print(
            f"  {r['strategy']:<16} {r['ranks']:>5} {r['predicted_ms']:>8.1f}ms {r['compute_ms']:>6.1f}ms "
            f"{r['comm_ms']:>5.1f}ms {r['bubble_ms']:>5.1f}ms {r['measured_ms']:>7.1f}ms {r['fastest_ms']:>6.1f}ms {r['alone_ms']:>6.1f}ms "
            f"{r['error']:>+7.0%} {r['load']:>5.2f}  {r['reason']}"
        )
    return rows


def _max_seq(model: str) -> int:
    from playbook.config import ModelConfig

    return ModelConfig.preset(model).max_seq_len


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
    p.add_argument(
        "--step-time", action="store_true", help="then predict and measure a step of every strategy (2 and 4 ranks)"
    )
    p.add_argument("--model", default="gpt-small", help="with --step-time: the model preset to train")
    p.set_defaults(func=cmd_calibrate)
