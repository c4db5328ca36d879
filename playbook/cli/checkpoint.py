"""``playbook checkpoint inspect DIR``: a distributed checkpoint's tensors, global shapes, shards per rank, bytes.

playbook checkpoint inspect runs/ckpt            # its latest checkpoint, or DIR itself
playbook checkpoint inspect runs/ckpt --json
"""

from __future__ import annotations

import json
from pathlib import Path


def cmd_inspect(args) -> int:
    from playbook.parallel.checkpoint.inspect import inspect, table

    path = Path(args.dir)
    if not path.is_dir():
        raise ValueError(
            f"checkpoint inspect {args.dir}: no such folder; name a folder written by playbook run hybrid --save"
        )
    try:
        info = inspect(path)
    except FileNotFoundError:
        raise ValueError(f"checkpoint inspect {args.dir}: no checkpoint there (no playbook.json, no latest)") from None
    print(json.dumps(info, indent=1, default=list) if args.json else table(info, all_steps=args.all_steps))
    return 0


def add_checkpoint(sub) -> None:
    p = sub.add_parser("checkpoint", help="inspect a distributed checkpoint written by run hybrid --save")
    what = p.add_subparsers(dest="checkpoint_command", required=True)
    q = what.add_parser("inspect", help="tensors, global shapes, shards per rank, bytes")
    q.add_argument("dir", help="a checkpoint folder, or a --save folder (its latest checkpoint)")
    q.add_argument("--all-steps", action="store_true", help="list AdamW's step of every parameter, not one row")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_inspect)
