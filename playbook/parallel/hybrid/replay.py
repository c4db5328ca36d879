"""Replay a shrunk planner candidate on real ranks: the planner's small-case prediction beside what
every rank measured (bytes sent per step on each axis, bytes held by category), and parity with the
single process.

The layout comes from ``playbook.theory.plan.shrink`` and runs through ``playbook run hybrid``'s own API
(``run_layout`` on fresh ranks, or ``train_hybrid`` on a running ``Ranks`` set); the prediction is
``Shrunk.predict``, made before any rank starts (a mixture of experts' all-to-all bytes and
activations follow from the routing, so for those the run's routing completes it).
"""

from __future__ import annotations

from dataclasses import dataclass

from playbook.theory.hybrid.plan import Plan
from playbook.parallel.hybrid.parallelize import train_hybrid
from playbook.parallel.hybrid.merge import comm_table, merge
from playbook.parallel.hybrid.run import run_layout
from playbook.parallel.training import TrainSetup
from playbook.parallel.parity import against_single
from playbook.theory.plan.shrink import Shrunk


@dataclass
class Replay:
    """Rows ``{rank, what, key, predicted, measured, before_run}`` (what: "bytes sent" or "memory";
    before_run False where the prediction needed the run's routing) and parity."""

    shrunk: Shrunk
    rows: list[dict]
    parity: dict

    @property
    def exact(self) -> bool:
        """Every predicted number equals its measurement to the byte."""
        return all(r["predicted"] == r["measured"] for r in self.rows)

    def table_rows(self) -> list[dict]:
        """One row per rank and quantity, for ``viz.table.table``."""
        return [
            {
                "rank": r["rank"],
                "what": f"{r['what']}: {r['key']}",
                "predicted (bytes)": r["predicted"],
                "measured (bytes)": r["measured"],
                "match": "exact" if r["predicted"] == r["measured"] else "differs",
                "predicted": "before the run" if r["before_run"] else "from the run's routing",
            }
            for r in self.rows
        ]


def setup_and_plan(shrunk: Shrunk, steps: int = 3) -> tuple[TrainSetup, Plan]:
    """The ``TrainSetup`` and hybrid ``Plan`` of ``shrunk``, checked before any rank starts."""
    setup = TrainSetup(model=shrunk.model, steps=steps, global_batch=shrunk.global_batch, seq_len=shrunk.seq_len)
    plan = Plan(
        shrunk.dims,
        zero=shrunk.zero,
        sequence_parallel=shrunk.sequence_parallel,
        microbatches=shrunk.microbatches,
        schedule=shrunk.schedule,
        virtual_stages=shrunk.virtual_stages,
        recompute=shrunk.recompute,
    )
    plan.check(setup)
    return setup, plan


def replay(shrunk: Shrunk, *, cluster=None, steps: int = 3, backend: str = "auto") -> Replay:
    """Run ``shrunk`` on ``shrunk.dims.world`` real ranks (``cluster``: a running ``Ranks`` of that
    size, else fresh ones through ``run_layout``) and put the prediction beside the measurement."""
    setup, plan = setup_and_plan(shrunk, steps)
    if cluster is not None:
        if cluster.world_size != plan.dims.world:
            raise ValueError(
                f"the replay {shrunk.dims} needs {plan.dims.world} ranks, the cluster has {cluster.world_size}; "
                f"pass ranks({plan.dims.world})"
            )
        answers = cluster.run(train_hybrid, setup, plan, progress=False)
        table = comm_table(answers, setup, plan)
        parity = against_single(merge(answers, plan.dims.tp), setup)
    else:
        report = run_layout(setup, plan, backend)
        table, parity = report.per_rank, report.parity
    before = shrunk.predict()  # made without the run; routing-dependent numbers come from comm_table
    rows = []
    for ahead, run in zip(before, table):
        measured, held = run["measured"], run["memory"]
        for axis in sorted(set(ahead["bytes"]) | set(measured) | set(run["predicted"])):
            known = axis in ahead["bytes"]  # else routing-dependent: predicted from the run's routing
            guess = ahead["bytes"][axis] if known else run["predicted"].get(axis)
            rows.append(_row(run["rank"], "bytes sent", axis, guess, measured.get(axis, 0.0), known))
        for cat, guess in ahead["memory"].items():
            known = guess is not None
            guess = guess if known else held["predicted"].get(cat)
            rows.append(_row(run["rank"], "memory", cat, guess, held["measured"].get(cat), known))
    return Replay(shrunk, rows, parity)


def _row(rank: int, what: str, key: str, predicted, measured, before_run: bool) -> dict:
    number = lambda x: None if x is None else int(x) if float(x).is_integer() else float(x)  # noqa: E731
    return {
        "rank": rank,
        "what": what,
        "key": key,
        "predicted": number(predicted),
        "measured": number(measured),
        "before_run": before_run,  # False: a mixture of experts' routing-dependent number, from the run's routing
    }
