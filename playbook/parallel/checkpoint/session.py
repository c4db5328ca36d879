"""Checkpointing inside a hybrid run: resume before the first step, save after every K-th.

``train_hybrid(..., checkpoint=CheckpointPlan(...))`` builds a :class:`Session` once the layout is
built (model cut, ZeRO units laid out, AdamW ready): ``resume()`` reads the checkpoint into this
rank's pieces and returns the step to start from; ``after_step`` wraps the loop's progress hook
and saves after step k when k is a multiple of ``every`` or the last. A checkpoint folder is
written as ``<dir>/step-<k>.tmp`` and renamed ``step-<k>`` by rank 0 once every rank has written
(with ``playbook.json``: model, layout, step, losses so far; ``latest`` names it), so a rank killed
mid-save leaves the last whole checkpoint in place (Check-N-Run, Eisenman et al. 2022, §4: the
previous checkpoint stays valid until the next is complete).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from playbook.theory.checkpoint.pieces import Piece
from playbook.theory.checkpoint.writes import step_writers, writers
from playbook.parallel.checkpoint import dcp_io
from playbook.parallel.checkpoint.state import RankState, keep_only

META = "playbook.json"
LATEST = "latest"
EVENTS = "events.jsonl"
HOLD = "PLAYBOOK_DRILL_HOLD_AFTER"  # set by parallel.checkpoint.drill: the first attempt waits after this step


@dataclass(frozen=True)
class CheckpointPlan:
    """``save``: the folder checkpoints go to (None: none); ``every``: save after every K-th step
    (None: after the last only); ``resume``: a checkpoint folder, or a folder with ``latest``, to start
    from; ``async_save``: write with ``dcp.async_save`` while the next steps run."""

    save: str | None = None
    every: int | None = None
    resume: str | None = None
    async_save: bool = False


def resolve(path: str | Path) -> Path:
    """The checkpoint a folder names: itself if it holds ``playbook.json``, else the one its ``latest`` names."""
    path = Path(path)
    if (path / META).exists():
        return path
    if (path / LATEST).exists():
        return path / (path / LATEST).read_text().strip()
    raise FileNotFoundError(f"{path} holds no checkpoint (no {META}, no {LATEST})")


def read_meta(path: str | Path) -> dict:
    return json.loads((resolve(path) / META).read_text())


_groups: dict = {}


def _save_group(world: int):
    """One gloo group for DCP's own collectives (an async save's thread must not share training's)."""
    if world not in _groups:
        _groups[world] = dist.new_group(list(range(world)), backend="gloo")
    return _groups[world]


class Session:
    def __init__(self, ck: CheckpointPlan, ctx, setup, plan, model, optimizer, split: dict, loader=None):
        self.ck, self.ctx, self.setup, self.plan = ck, ctx, setup, plan
        self.loader = loader  # this rank's ``parallel.loader.RankLoader``, if it has one: its position is saved
        mesh = ctx.mesh_for(plan.dims)
        cfg = setup.config()
        self.state = RankState(
            model, optimizer, split=split, tp=plan.dims.tp, tp_rank=mesh.coords["tp"], tied=cfg.tie_embeddings
        )
        self.group = _save_group(ctx.world_size)
        self.losses: list[float] = []
        self.log: list[dict] = []  # one row per save or load: step, seconds, bytes
        self.pending = None  # (future, tmp folder, final folder, step) of an async save in flight
        self.start = 0
        self.event("start", attempt=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))

    def event(self, what: str, **fields) -> None:
        """Rank 0 appends one line to ``<save>/events.jsonl`` (wall-clock time): the failure drill
        reads when each attempt started, loaded, finished a step and saved (``checkpoint.drill``)."""
        if self.ctx.rank == 0 and self.ck.save:
            Path(self.ck.save).mkdir(parents=True, exist_ok=True)
            with open(Path(self.ck.save) / EVENTS, "a") as f:
                f.write(json.dumps({"event": what, "t": time.time(), **fields}) + "\n")

    # ---- resume ----
    def resume(self) -> int:
        if not self.ck.resume:
            return 0
        path = resolve(self.ck.resume)
        meta = json.loads((path / META).read_text())
        rank, world = self.ctx.rank, self.ctx.world_size
        data = torch.zeros(2, dtype=torch.int64)
        rng = torch.zeros(dcp_io_rng_bytes(), dtype=torch.uint8)
        row = torch.zeros(3, dtype=torch.int64)  # the saving rank's loader: (next step, workers, prefetch)
        state = self.state.state(
            reading=True, world=meta["world"], rank=rank % meta["world"], data=data, rng=rng, loader=row
        )
        mark = len(self.ctx.tracer.spans)
        seconds, counts = dcp_io.read(state, path, self.group)
        self._label(mark)
        if meta["world"] == world:  # the same ranks: each its own generator back
            torch.set_rng_state(rng)
        self.start = int(data[0])
        if self.loader is not None:  # the position the saving rank's loader had: its workers start from there
            self.loader.load_state_dict({"next_step": int(row[0])})
        self.losses = list(meta["losses"])
        self.log.append(
            {
                "what": "load",
                "step": self.start,
                "seconds": seconds,
                "path": str(path),
                "bytes": counts,
                "loader": row.tolist(),
            }
        )
        self.event("loaded", step=self.start, seconds=seconds)
        return self.start

    # ---- save ----
    def wrap_loss(self, sync_loss):
        def wrapped(loss):
            out = sync_loss(loss)
            self.losses.append(float(out))
            return out

        return wrapped

    def after_step(self, progress):
        every, steps = self.ck.every, self.setup.steps

        def wrapped(done, total):
            if progress is not None:
                progress(done, total)
            self.event("step", step=done)
            if self.ck.save and (done == steps or (every and done % every == 0)):
                self.save(done)
            if os.environ.get(HOLD) == str(done) and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
                time.sleep(60)  # the failure drill kills a rank here, at a known step, however loaded the machine

        return wrapped

    def _pieces(self) -> tuple[set, set]:
        """(the (name, offsets) pieces this rank writes, the parameter names whose step it writes):
        every rank's descriptors gathered (metadata only), then the one rule of ``theory.checkpoint``."""
        mine = [Piece(*d) for d in self.state.descriptors()]
        everyone = [None] * self.ctx.world_size
        dist.all_gather_object(everyone, mine, group=self.group)
        rank = self.ctx.rank
        written = {(p.name, p.offsets) for p in writers(everyone)[rank]}
        return written, set(step_writers(everyone)[rank])

    def _label(self, mark: int) -> None:
        """The collectives DCP issued since span ``mark`` (on its own group, unlabelled) are the
        checkpoint's, not the step's: axis "checkpoint", which the step's accounting leaves out."""
        for span in self.ctx.tracer.spans[mark:]:
            if not span.axis:
                span.axis = "checkpoint"

    def save(self, step: int) -> None:
        self.finish()  # the previous async save first: one in flight at a time
        self.mark = len(self.ctx.tracer.spans)
        rank, world = self.ctx.rank, self.ctx.world_size
        data = torch.tensor([step, step * self.setup.global_batch], dtype=torch.int64)
        full = self.state.state(
            reading=False, world=world, rank=rank, data=data, rng=torch.get_rng_state(), loader=self._loader_row(step)
        )
        state = keep_only(full, *self._pieces(), rank)
        final = Path(self.ck.save) / f"step-{step}"
        tmp = final.with_name(final.name + ".tmp")
        if self.ck.async_save:
            future, blocked = dcp_io.write_async(state, tmp, self.group)
            self.pending = (future, tmp, final, step, blocked, time.perf_counter())
            return
        seconds = dcp_io.write(state, tmp, self.group)
        self._commit(tmp, final, step, {"seconds": seconds})

    def _loader_row(self, step: int) -> torch.Tensor:
        """(next step, workers, prefetch) of this rank's loader; (step, −1, 0) where batches are made inline."""
        if self.loader is None:
            return torch.tensor([step, -1, 0], dtype=torch.int64)
        s = self.loader.state_dict()
        return torch.tensor([s["next_step"], s["workers"], s["prefetch"] or 0], dtype=torch.int64)

    def finish(self) -> None:
        """Wait for an async save in flight, then commit it."""
        if self.pending is None:
            return
        future, tmp, final, step, blocked, t0 = self.pending
        self.pending = None
        future.result()
        self._commit(tmp, final, step, {"seconds": blocked, "async_total_seconds": blocked + time.perf_counter() - t0})

    def _commit(self, tmp: Path, final: Path, step: int, times: dict) -> None:
        dist.barrier(group=self.group)  # every rank's file is written
        if self.ctx.rank == 0:
            meta = {
                "model": self.setup.model,
                "world": self.ctx.world_size,
                "layout": {**asdict(self.plan.dims), **self.plan.as_dict()},
                "setup": self.setup.as_dict(),
                "step": step,
                "losses": self.losses[:step],
            }
            (tmp / META).write_text(json.dumps(meta, indent=1))
            if final.exists():
                import shutil

                shutil.rmtree(final)
            os.replace(tmp, final)
            latest = final.parent / LATEST
            (final.parent / (LATEST + ".tmp")).write_text(final.name)
            os.replace(final.parent / (LATEST + ".tmp"), latest)
        dist.barrier(group=self.group)
        self._label(self.mark)
        self.log.append({"what": "save", "step": step, "path": str(final), **times})
        self.event("saved", step=step, **times)

    def report(self) -> dict:
        self.finish()
        out = {"start": self.start, "log": self.log, "losses": self.losses}
        if self.loader is not None:
            out["loader"] = {**self.loader.state_dict(), "repositions": self.loader.repositions}
        return out


def dcp_io_rng_bytes() -> int:
    return torch.get_rng_state().numel()
