"""Measure: what a pipeline run did, beside what the schedule predicts.

From the per-step logs of ``playbook.parallel.pp.run.on_rank`` (``StepLog``: compute slots, message
times, held-activation bytes): the measured timeline and its bubble (both definitions of
``playbook.theory.pp.schedules.DEFINITIONS``), the per-stage costs that make the simulator's
prediction, and the peak of held activations next to ``playbook.theory.pp.pipeline``'s count
(each piece of the GPT timed alone, to balance stages: ``playbook.parallel.pp.costs``).
"""

from __future__ import annotations

import statistics

from playbook.theory.pp.pipeline import chunk_activation_bytes, chunk_w_bytes
from playbook.theory.pp.simulator import Costs, Slot, Timeline, held_bytes, simulate
from playbook.theory.pp.types import Schedule
from playbook.theory.pp.schedules import DEFINITIONS


def measured_timeline(results: list[dict], step: int = -1) -> Timeline:
    """The real run's step ``step`` as a Timeline (times in seconds from its first compute)."""
    slots = [s for r in results for s in r["logs"][step].slots]
    t0 = min(s.start for s in slots)
    slots = [Slot(s.rank, s.kind, s.mb, s.chunk, s.start - t0, s.end - t0) for s in slots]
    return Timeline(len(results), slots)


def measured_costs(results: list[dict], schedule: Schedule, steps=None) -> Costs:
    """Per-virtual-stage mean F, B, W seconds over the given steps (default: all but the first,
    which pays one-off costs), for the simulator; with means, the simulated busy time of every rank
    equals the measured one, so the bubbles differ only by waiting. Unsplit schedules put the whole
    backward in b. Messages: the mean time to issue a send, and the mean time a receive takes
    once both sides are there (from the later of send and receive to the receive returning)."""
    steps = steps if steps is not None else range(1, len(results[0]["logs"])) or [0]
    per = {k: [[] for _ in range(schedule.n_stages)] for k in "FBW"}
    for r in results:
        for st in steps:
            for s in r["logs"][st].slots:
                per[s.kind][schedule.stage(s.rank, s.chunk)].append(s.end - s.start)

    def mean(xs):
        return [statistics.fmean(x) if x else 0.0 for x in xs]

    issue, latency = [], []
    for st in steps:
        sent = {tag: (t0, t1) for r in results for tag, t0, t1 in r["logs"][st].sends}
        issue += [t1 - t0 for t0, t1 in sent.values()]
        latency += [
            done - max(posted, sent[tag][0])
            for r in results
            for tag, posted, done in r["logs"][st].recvs
            if tag in sent
        ]
    return Costs(
        f=mean(per["F"]),
        b=mean(per["B"]),
        w=mean(per["W"]),
        send=statistics.fmean(issue) if issue else 0.0,
        comm=statistics.fmean(latency) if latency else 0.0,
    )


def compare_bubble(results: list[dict], schedule: Schedule, steps=None) -> dict:
    """Measured bubble of each step after the first (both definitions) next to the simulator's
    prediction from this run's own measured per-action costs."""
    steps = list(steps if steps is not None else range(1, len(results[0]["logs"])) or [0])
    costs = measured_costs(results, schedule, steps)
    predicted = simulate(schedule, costs)
    runs = [measured_timeline(results, st) for st in steps]
    measured = {k: sum(t.bubble()[k] for t in runs) / len(runs) for k in DEFINITIONS}
    return {
        "name": schedule.name,
        "p": schedule.p,
        "m": schedule.m,
        "v": schedule.v,
        "bubble_predicted": predicted.bubble(),
        "bubble_measured": measured,
        "makespan_predicted_s": predicted.makespan,
        "makespan_measured_s": sum(t.makespan for t in runs) / len(runs),
        "definition": DEFINITIONS,
        "costs_s": {"f": costs.f, "b": costs.b, "w": costs.w, "send": costs.send, "comm": costs.comm},
    }


def activation_report(results: list[dict], schedule: Schedule, setup) -> dict:
    """Peak held activation bytes per rank: measured (saved-tensor hooks) vs predicted (the
    schedule's order × the exact per-chunk count), and the peak micro-batch counts."""
    cfg, b = setup.config(), setup.global_batch // schedule.m
    per_chunk = [[chunk_activation_bytes(cfg, *rg, b, setup.seq_len) for rg in r["ranges"]] for r in results]
    split = schedule.split_backward  # what a micro-batch keeps from B until W
    w = [[chunk_w_bytes(cfg, *rg, b, setup.seq_len) for rg in r["ranges"]] for r in results] if split else None
    tl = simulate(schedule)
    return {
        "predicted_bytes": held_bytes(schedule, per_chunk, w),
        "measured_bytes": [r["logs"][0].peak_bytes for r in results],
        "chunk_bytes_predicted": per_chunk,
        "chunk_bytes_measured": [r["logs"][0].chunk_bytes for r in results],
        "peak_in_flight": tl.peak_in_flight,
        "peak_held": tl.peak_held,
    }
