"""A run cut in two: ``k`` steps under one layout, saved; the rest under another, resumed from the
checkpoint; put back together as one result for the parity gate against the run that never stopped.

The merged result has the second part's losses (the saved ones, then its own) and final parameters
(``hybrid.merge``), and the first part's first-step gradients (its own; the second part starts
later). Beside it, per rank of the first layout, the bytes written predicted
(``theory.checkpoint.bytes_per_rank``) and measured (``dcp_io.written_bytes``), and the seconds of
every save and load.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from playbook.parallel.training import TrainResult, TrainSetup
from playbook.parallel.hybrid.merge import merge
from playbook.parallel.hybrid.parallelize import train_hybrid
from playbook.parallel.checkpoint.dcp_io import file_bytes, written_bytes
from playbook.parallel.checkpoint.session import CheckpointPlan, read_meta
from playbook.dims import ParallelDims
from playbook.theory.checkpoint.reads import read_bytes
from playbook.theory.checkpoint.writes import bytes_per_rank
from playbook.theory.hybrid.plan import Plan


@dataclasses.dataclass
class Resumed:
    """``result``: the whole run as one TrainResult; ``predicted`` and ``measured``: tensor bytes each
    rank of the first layout wrote; ``files``: its files' sizes on disk; ``saves``/``loads``: seconds;
    ``read_predicted``/``read_measured``: per rank of the second layout, the bytes its load asked for
    and read (``theory.checkpoint.reads``; ``dcp_io.CountingReader``)."""

    result: TrainResult
    predicted: list[int]
    measured: list[int]
    files: list[int]
    save_seconds: float
    load_seconds: float
    read_predicted: list[dict] = dataclasses.field(default_factory=list)  # per rank of b: asked, read, items
    read_measured: list[dict] = dataclasses.field(default_factory=list)  # the same, from DCP's load

    @property
    def bytes_exact(self) -> bool:
        return self.predicted == self.measured


def predicted_bytes(setup: TrainSetup, plan: Plan) -> list[int]:
    """Tensor bytes each rank of ``plan`` writes (``theory.checkpoint``)."""
    rows = bytes_per_rank(setup.config(), plan.dims, zero=plan.zero, schedule=plan.played_schedule, v=plan.v)
    return [r["total"] for r in rows]


def saved_plan(path: str | Path) -> Plan:
    """The layout a checkpoint was saved under, from its ``playbook.json``."""
    layout = read_meta(path)["layout"]
    fields = {f.name for f in dataclasses.fields(Plan)} - {"dims"}
    return Plan(ParallelDims(**layout["dims"]), **{k: v for k, v in layout.items() if k in fields})


def predicted_reads(setup: TrainSetup, saved: Plan, loading: Plan) -> list[dict]:
    """Per rank of ``loading``: the bytes it asks for and reads of a checkpoint saved under ``saved``
    (``theory.checkpoint.reads``)."""

    def kw(p: Plan) -> dict:
        return {"dims": p.dims, "zero": p.zero, "schedule": p.played_schedule, "v": p.v}

    return read_bytes(setup.config(), kw(saved), kw(loading))


def _measured_reads(answers: list[dict]) -> list[dict]:
    """Per rank, what its load read (``dcp_io.CountingReader``), from the first load of its log."""
    rows = sorted(answers, key=lambda a: a["rank"])
    return [next(x["bytes"] for x in a["checkpoint"]["log"] if x["what"] == "load") for a in rows]


def save_then_resume(run_a, run_b, setup: TrainSetup, a: Plan, b: Plan, k: int, folder: str | Path) -> Resumed:
    """``k`` steps of ``setup`` under ``a`` on ``run_a`` (a ``Ranks.run`` or a launch of a.dims.world
    ranks), saved to ``folder``; then steps k .. setup.steps − 1 under ``b`` on ``run_b``, resumed."""
    first = run_a(train_hybrid, dataclasses.replace(setup, steps=k), a, checkpoint=CheckpointPlan(save=str(folder)))
    second = run_b(train_hybrid, setup, b, checkpoint=CheckpointPlan(resume=str(folder)))
    path = Path(folder) / f"step-{k}"
    measured = written_bytes(path)
    on_disk = file_bytes(path)
    whole = merge(second, b.dims.tp)
    ck = second[0]["checkpoint"]
    grads = merge(first, a.dims.tp).grads
    return Resumed(
        result=TrainResult(ck["losses"], grads, whole.params),
        predicted=predicted_bytes(setup, a),
        measured=[measured.get(r, 0) for r in range(a.dims.world)],
        files=[on_disk.get(r, 0) for r in range(a.dims.world)],
        save_seconds=max(x["checkpoint"]["log"][-1]["seconds"] for x in first),
        load_seconds=max(x["checkpoint"]["log"][0]["seconds"] for x in second),
        read_predicted=predicted_reads(setup, a, b),
        read_measured=_measured_reads(second),
    )


def checkpoint_report(answers: list[dict], ours: TrainResult, single: TrainResult, setup: TrainSetup, plan: Plan):
    """For ``run hybrid --save/--resume``: (ours, the reference, the report's checkpoint part). A resumed
    run is compared on its losses (the saved ones, then its own) and final parameters; its first-step
    gradients belong to the run that saved. Every save: seconds (the slowest rank), tensor bytes per
    rank predicted and measured, file bytes; every load: seconds."""
    logs = [a["checkpoint"]["log"] for a in sorted(answers, key=lambda a: a["rank"])]
    ck = answers[0]["checkpoint"]
    if ck["start"] > 0:
        ours = TrainResult(ck["losses"], {}, ours.params, ours.memory, ours.grad_norms)
        single = TrainResult(single.losses, {}, single.params)
    predicted = predicted_bytes(setup, plan)
    saves, loads = [], []
    for i, row in enumerate(logs[0]):
        slowest = {k: max(log[i].get(k, 0.0) for log in logs) for k in ("seconds", "async_total_seconds")}
        entry = {"step": row["step"], "path": row["path"], **slowest}
        if row["what"] == "load":
            measured = _measured_reads(answers)
            entry |= {
                "read_predicted": [r["read"] for r in predicted_reads(setup, saved_plan(row["path"]), plan)],
                "read_measured": [r["read"] for r in measured],
                "asked": [r["asked"] for r in measured],
            }
            loads.append(entry)
            continue
        path = Path(row["path"])
        if path.exists():  # a later save of the same step replaced nothing here; measure what is on disk
            measured, files = written_bytes(path), file_bytes(path)
            entry |= {
                "predicted": predicted,
                "measured": [measured.get(r, 0) for r in range(plan.dims.world)],
                "files": [files.get(r, 0) for r in range(plan.dims.world)],
            }
        saves.append(entry)
    return ours, single, {"start": ck["start"], "saves": saves, "loads": loads}


def checkpoint_lines(ck: dict) -> list[str]:
    """The summary's lines for the checkpoints of a run."""
    lines = []
    for row in ck["loads"]:
        lines.append(f"  resumed from {row['path']} (after step {row['step']}): read in {row['seconds']:.3f} s")
        if "read_measured" in row:
            cells = ", ".join(
                f"r{r} {p:,} / {m:,}" for r, (p, m) in enumerate(zip(row["read_predicted"], row["read_measured"]))
            )
            lines.append(f"    tensor bytes read per rank, predicted / measured: {cells}")
    for row in ck["saves"]:
        kind = (
            f"async, blocked {row['seconds']:.3f} s, done in {row['async_total_seconds']:.3f} s"
            if row.get("async_total_seconds")
            else f"{row['seconds']:.3f} s"
        )
        lines.append(f"  saved {row['path']} after step {row['step']} ({kind})")
        if "measured" in row:
            cells = ", ".join(f"r{r} {p:,} / {m:,}" for r, (p, m) in enumerate(zip(row["predicted"], row["measured"])))
            lines.append(f"    tensor bytes written per rank, predicted / measured: {cells}")
    return lines
