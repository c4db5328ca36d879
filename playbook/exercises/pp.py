"""Exercise 4 — pipelines: the 1F1B action list of one rank, as data.

1F1B (PipeDream-Flush; Narayanan et al. 2021, arXiv:2104.04473, §2.2): with p stages and m
micro-batches, rank r first runs a **warm-up** of p−r−1 forwards (the later stages have nothing to
do until the first micro-batch reaches them), then alternates one forward and one backward, then
runs a **cool-down** of the remaining backwards. Backwards go in the order of the forwards. Rank r
never holds more than min(p−r, m) micro-batches of activations; the bubble is GPipe's,
(p−1)/(m+p−1) of the step.

Write ``one_f_one_b(rank, p, m)`` returning that rank's list, e.g. ``[("F", 0), ("F", 1), ("B", 0),
...]``. ``check`` plays the lists of every rank in ``playbook.theory.pp.simulator`` (sends
and receives inserted, as the executor on real ranks runs them) and compares with 1F1B.
"""

from __future__ import annotations

from playbook.exercises._common import NotYetWritten, Verdict
from playbook.theory.pp.simulator import Deadlock, in_flight, simulate
from playbook.theory.pp.schedules import closed_form, with_communication

NAME = "pipelines: the 1F1B action list of one rank"
CASES = [(4, 6), (4, 2), (2, 5)]  # (p stages, m micro-batches): m > p, m < p, and two stages


def solution(rank: int, p: int, m: int) -> list[tuple[str, int]]:
    """The reference answer."""
    warm = min(p - rank - 1, m)  # forwards before the first backward
    order = [("F", i) for i in range(warm)]
    for i in range(m - warm):  # steady state: one forward, one backward
        order += [("F", warm + i), ("B", i)]
    return order + [("B", i) for i in range(m - warm, m)]  # cool-down


def _lists(fn, p: int, m: int) -> tuple[list | None, str]:
    orders = []
    for r in range(p):
        try:
            got = fn(r, p, m)
        except NotYetWritten:
            return None, "not yet written — fill in the cell above, then run the check again"
        except Exception as e:  # noqa: BLE001 - the learner's error, in one line
            return None, f"one_f_one_b({r}, {p}, {m}) raised {type(e).__name__}: {e}"
        try:
            orders.append([(str(k), int(i), 0) for k, i in got])
        except (TypeError, ValueError):
            return (
                None,
                f"one_f_one_b({r}, {p}, {m}) should return a list of (kind, micro-batch) like ('F', 0); got {got!r:.80}",
            )
        bad = [k for k, _, _ in orders[-1] if k not in ("F", "B")]
        if bad:
            return None, f"rank {r}'s list has kind {bad[0]!r}; 1F1B uses 'F' (forward) and 'B' (backward) only"
    return orders, ""


def _warmup(order) -> int:
    return next((i for i, (k, *_) in enumerate(order) if k == "B"), len(order))


def _problem(orders, p: int, m: int) -> str:
    """The first thing that differs from 1F1B, said as the rule it breaks."""
    for r, order in enumerate(orders):
        done = [i for k, i, _ in order if k == "B"]
        if sorted(set(done)) != list(range(m)) and set(done) < set(range(m)) and len(done) == len(set(done)):
            missing = sorted(set(range(m)) - set(done))
            return (
                f"rank {r} never runs the backward of micro-batch(es) {missing}: the cool-down is missing — "
                f"after the steady state, rank r runs its last p−r−1 = {p - r - 1} backwards"
            )
    for r, order in enumerate(orders):
        want = min(p - r, m)  # the warm-up's p−r−1, then the steady state's first forward
        got = _warmup(order)
        if got != want:
            size = "one" if abs(got - want) == 1 else str(abs(got - want))
            return (
                f"rank {r} runs {got} forward(s) before its first backward; 1F1B runs min(p−r, m) = {want} there "
                f"(a warm-up of p−r−1 = {min(p - r - 1, m)}, then one forward, one backward): warm-up off by {size}, "
                f"{'too many' if got > want else 'too few'}"
            )
    for r, order in enumerate(orders):
        back = [i for k, i, _ in order if k == "B"]
        if back != sorted(back):
            j = next(j for j in range(len(back) - 1) if back[j] > back[j + 1])
            return (
                f"rank {r} runs the backward of micro-batch {back[j]} before micro-batch {back[j + 1]}: backwards "
                "go in the order of the forwards (the oldest micro-batch first)"
            )
    for r, order in enumerate(orders):
        ref = [(k, i, 0) for k, i in solution(r, p, m)]
        if order != ref:
            j = next((j for j, (a, b) in enumerate(zip(order, ref)) if a != b), min(len(order), len(ref)))
            yours = f"{order[j][0]}{order[j][1]}" if j < len(order) else "the end"
            return f"rank {r}, position {j}: yours is {yours}, 1F1B's is {ref[j][0]}{ref[j][1]} (after the same {j} actions)"
    return ""


def check(fn) -> Verdict:
    """Play ``fn(rank, p, m)``'s lists in the simulator for a few (p, m) and compare with 1F1B."""
    numbers: dict = {}
    for p, m in CASES:
        orders, failure = _lists(fn, p, m)
        if failure:
            return Verdict(NAME, False, failure)
        case = f"p={p}, m={m}: "
        problem = _problem(orders, p, m)
        try:
            schedule = with_communication("yours", p, m, 1, False, orders)
            timeline = simulate(schedule)
        except Deadlock as e:
            stuck = str(e).split("deadlocks: ")[-1]
            return Verdict(
                NAME, False, case + "the lists deadlock (" + stuck + ")" + (f": {problem}" if problem else "")
            )
        except ValueError as e:
            return Verdict(NAME, False, case + (problem or str(e)))
        if problem:
            peak = in_flight(schedule)[1]
            return Verdict(NAME, False, f"{case}{problem}; it runs, holding up to {peak} micro-batches per rank")
        expected = closed_form("1f1b", p, m)
        numbers[f"p={p} m={m} bubble (idle/total), simulated"] = timeline.bubble_over_total
        numbers[f"p={p} m={m} bubble, closed form (p−1)/(m+p−1)"] = expected["idle_over_total"]
        numbers[f"p={p} m={m} peak micro-batches held per rank"] = in_flight(schedule)[1]
        numbers[f"p={p} m={m} 1F1B's bound min(p−r, m)"] = [min(p - r, m) for r in range(p)]
    return Verdict(NAME, True, f"your lists are 1F1B for every (p, m) in {CASES}; they play without deadlock", numbers)
