"""``playbook run hybrid``'s checkpoint flags, checked before any rank starts: one line each.

    --save DIR [--save-every K] [--overwrite] [--async-save]     write checkpoints of this run to DIR
    --resume DIR                                                 start from DIR's (latest) checkpoint

``--resume`` and ``--save`` naming the same folder continue a run in place, as an elastic job
restarted by ``torchrun --max-restarts`` does with the one command line it has: the last checkpoint
if there is one, else step 0. Anywhere else, a folder with no checkpoint is refused.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from playbook.parallel.checkpoint.session import CheckpointPlan, META, read_meta, resolve


def add_arguments(parser) -> None:
    parser.add_argument("--save", metavar="DIR", help="write distributed checkpoints (DCP) of this run to DIR")
    parser.add_argument(
        "--save-every", type=int, metavar="K", help="with --save: after every K-th step (default: the last)"
    )
    parser.add_argument("--resume", metavar="DIR", help="start from DIR's latest checkpoint, under any layout")
    parser.add_argument("--overwrite", action="store_true", help="with --save: replace what DIR holds")
    parser.add_argument(
        "--async-save", action="store_true", help="with --save: write with dcp.async_save while training goes on"
    )


def _in_place(o: dict) -> bool:
    return bool(o.get("save") and o.get("resume")) and Path(o["save"]).resolve() == Path(o["resume"]).resolve()


def check(o: dict, *, model: str, steps: int, global_batch: int, seq_len: int, torchrun: bool = False) -> None:
    """Refuse bad checkpoint flags (ValueError, one line) before any rank starts."""
    save, every, resume = o.get("save"), o.get("save_every"), o.get("resume")
    for flag, on in (
        ("--save-every", every is not None),
        ("--overwrite", o.get("overwrite")),
        ("--async-save", o.get("async_save")),
    ):
        if on and not save:
            raise ValueError(f"{flag} needs --save DIR (where the checkpoints go)")
    if every is not None and every < 1:
        raise ValueError(f"--save-every must be a positive number of steps, got {every}; try --save-every 1")
    if save:
        path = Path(save)
        if path.exists() and not path.is_dir():
            raise ValueError(f"--save {save}: a file is there, not a folder; name a folder")
        if path.is_dir() and any(path.iterdir()) and not _in_place(o) and not o.get("overwrite"):
            raise ValueError(
                f"--save {save}: the folder is not empty ({len(list(path.iterdir()))} entries); pass --overwrite to "
                "replace it, --resume with the same folder to continue it, or name a new folder"
            )
        if o.get("overwrite") and torchrun:
            raise ValueError(
                "--overwrite under torchrun: every rank would clear the folder; clear it before torchrun starts"
            )
    if not resume:
        return
    path = Path(resume)
    if not path.is_dir():
        if _in_place(o):
            return  # an elastic job's first start: nothing saved yet
        raise ValueError(f"--resume {resume}: no such folder; name a folder written by --save")
    try:
        resolve(path)
    except FileNotFoundError:
        if _in_place(o):
            return
        raise ValueError(
            f"--resume {resume}: no checkpoint there (no {META}); name a folder written by --save"
        ) from None
    meta = read_meta(path)
    if meta["model"] != model:
        raise ValueError(
            f"--resume {resume}: a checkpoint of {meta['model']}, and --model is {model}; pass --model {meta['model']}"
        )
    saved = meta["setup"]
    for flag, key, now in (("--global-batch", "global_batch", global_batch), ("--seq-len", "seq_len", seq_len)):
        if saved[key] != now:
            raise ValueError(
                f"--resume {resume}: saved with {flag} {saved[key]}, and this run has {now}; pass {flag} {saved[key]}"
            )
    if meta["step"] >= steps:
        raise ValueError(
            f"--resume {resume}: saved after step {meta['step']} and --steps is {steps}: nothing left to run; "
            f"pass --steps {meta['step'] + 1} or more"
        )


def plan_of(o: dict) -> CheckpointPlan | None:
    """The run's ``CheckpointPlan`` from the flags (None without --save and --resume); ``--resume``
    of a folder with no checkpoint yet (the first start of a run continued in place) starts at step 0."""
    if not (o.get("save") or o.get("resume")):
        return None
    resume = o.get("resume")
    if resume:
        try:
            resolve(resume)
        except FileNotFoundError:
            resume = None
    return CheckpointPlan(
        save=o.get("save"), every=o.get("save_every"), resume=resume, async_save=bool(o.get("async_save"))
    )


def prepare(o: dict) -> None:
    """With --overwrite, empty the --save folder (once, before any rank starts)."""
    if o.get("save") and o.get("overwrite") and Path(o["save"]).is_dir() and not _in_place(o):
        shutil.rmtree(o["save"])
