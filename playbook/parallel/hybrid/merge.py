"""What the ranks of a hybrid run return, put back together: the one reassembly of whole tensors
for parity against the single process (``merge``), and per rank the bytes per axis and memory by
category beside ``theory.hybrid.hybrid``'s prediction (``comm_table``). Read by ``run hybrid``, the native
comparison, the planner's replays, chapter 8 and the tests."""

from __future__ import annotations

from collections import defaultdict

import torch

from playbook.cluster.trace.spans import bytes_by_axis
from playbook.theory.hybrid.plan import Plan
from playbook.parallel.training import TrainResult, TrainSetup
from playbook.theory.hybrid.hybrid import comm_per_axis, memory_per_rank


def merge(answers: list[dict], tp: int) -> TrainResult:
    """One TrainResult with whole tensors: for each name, the copy of the first rank that holds it
    at each tp index (replicas over dp, cp and the other stages hold the same), and tensor-parallel
    shards concatenated along their dim in tp order."""
    dims: dict = {}
    by_tp: dict[int, dict] = defaultdict(lambda: {"grads": {}, "params": {}})
    for a in sorted(answers, key=lambda a: a["rank"]):
        dims |= a["shard_dims"]
        for kind in ("grads", "params"):
            for name, t in getattr(a["result"], kind).items():
                by_tp[a["coords"]["tp"]][kind].setdefault(name, t)
    out = {}
    for kind in ("grads", "params"):
        names = by_tp[0][kind]
        out[kind] = {
            n: names[n]
            if tp == 1 or dims.get(n) is None
            else torch.cat([by_tp[i][kind][n] for i in range(tp)], dims[n])
            for n in names
        }
    first = min(answers, key=lambda a: a["rank"])["result"]
    return TrainResult(first.losses, out["grads"], out["params"], first.memory, first.grad_norms)


OUTSIDE_THE_STEP = ("report", "checkpoint")  # the loss report, checkpoint reads and writes


def comm_table(answers: list[dict], setup: TrainSetup, plan: Plan) -> list[dict]:
    """Per rank: bytes sent per step on each axis, and memory by category, predicted and measured
    (the loss report and checkpoints excluded)."""
    rows = []
    for a in sorted(answers, key=lambda a: a["rank"]):
        routing = a.get("routing")  # [step][forward] of this rank's MoE layers (its stage's)
        measured = bytes_by_axis([s for s in a["spans"] if s["axis"] not in OUTSIDE_THE_STEP], per=setup.steps)
        layout = dict(
            rank=a["rank"],
            global_batch=setup.global_batch,
            seq_len=setup.seq_len,
            schedule=plan.played_schedule,
            sequence_parallel=plan.sequence_parallel,
            cp_variant=plan.cp_variant,
            microbatches=plan.m,
            virtual_stages=plan.v,
            recompute=plan.recompute,
        )
        predicted = comm_per_axis(
            setup.config(), plan.dims, zero=plan.zero, routing=routing, max_norm=plan.max_norm, **layout
        )
        memory = memory_per_rank(
            setup.config(), plan.dims, routing=routing[0] if routing else None, zero=plan.zero, **layout
        )
        measured_memory = {k: a["result"].memory.get(k) for k in memory}
        rows.append(
            {
                "rank": a["rank"],
                "coords": a["coords"],
                "predicted": predicted,
                "measured": measured,
                "memory": {"predicted": memory, "measured": measured_memory},
            }
        )
    return rows
