"""Step times from spans (``measure.steps``): the records, percentiles and the straggler rule on spans
made by hand, so every expected number is written out here."""

import random

import pytest

from playbook.measure.steps import (
    MIN_STEPS,
    find_straggler,
    percentile,
    percentiles,
    rank_table,
    report_lines,
    step_records,
)


def test_percentiles_by_hand():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 90) == pytest.approx(4.6)  # (5 − 1) · 0.9 = 3.6: between 4 and 5
    assert percentiles(xs) == {"p50": 3.0, "p90": pytest.approx(4.6), "p99": pytest.approx(4.96)}
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def _step(rank, n, a, b):
    return {"rank": rank, "kind": "compute", "name": f"step {n}", "start": a, "end": b}


def _comm(rank, a, b, waited=None):
    return {"rank": rank, "kind": "comm", "name": "all_reduce", "start": a, "end": b, "waited": waited}


def test_step_records_by_hand():
    spans = [
        {"rank": 0, "kind": "compute", "name": "input wait", "start": 0.0, "end": 0.5},
        _step(0, 0, 0.5, 2.0),
        _comm(0, 1.0, 1.4),
        _comm(0, 1.2, 1.6),  # overlaps the first: the union is 1.0..1.6
        _comm(0, 1.9, 2.5),  # only 1.9..2.0 lies in the step
        _step(0, 1, 3.0, 4.0),
    ]
    r0, r1 = step_records(spans)
    assert r0 == {
        "step": 0,
        "seconds": 2.0,
        "step_s": 1.5,
        "input_wait": 0.5,
        "comm": pytest.approx(0.7),
        "busy": pytest.approx(0.8),
    }
    assert r1["input_wait"] == 0 and r1["comm"] == 0 and r1["busy"] == 1.0 and r1["seconds"] == 1.0


def _records(busy_ms, comm_ms, steps=20, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        b = busy_ms / 1e3 * (1 + 0.1 * rng.random())
        out.append(
            {
                "step": 0,
                "seconds": b + comm_ms / 1e3,
                "step_s": b + comm_ms / 1e3,
                "input_wait": 0.0,
                "comm": comm_ms / 1e3,
                "busy": b,
            }
        )
    return out


def test_the_rank_that_works_longest_and_waits_least_is_the_straggler():
    records = [_records(10, 60, seed=r) for r in range(3)] + [_records(70, 2, seed=3)]
    table = rank_table(records)
    found = find_straggler(table)
    assert found["rank"] == 3 and found["excess_s"] == pytest.approx(0.06, abs=0.006)
    lines = report_lines({"ranks": table, "straggler": found})
    assert lines[-1].startswith("  straggler: rank 3") and len(lines) == 1 + 4 + 1


def test_ranks_alike_have_no_straggler_and_no_line():
    table = rank_table([_records(10, 5, seed=r) for r in range(4)])
    assert find_straggler(table) is None
    assert not any("straggler" in line for line in report_lines({"ranks": table, "straggler": None}))


def test_pipeline_stages_are_compared_within_a_stage():
    # stage 1 works twice as long as stage 0 by design (more layers): no straggler; then a slow rank on stage 1
    records = [_records(10, 20, seed=0), _records(10, 20, seed=1), _records(20, 10, seed=2), _records(20, 10, seed=3)]
    assert find_straggler(rank_table(records, stages=[0, 0, 1, 1])) is None
    records[3] = _records(60, 1, seed=4)
    assert find_straggler(rank_table(records, stages=[0, 0, 1, 1]))["rank"] == 3


def test_too_few_steps_name_no_straggler():
    # one measured step: every spread is 0 and some rank is "busiest in 1 of 1"; a resumed run of one
    # step named one before. Five steps of the same ranks name it.
    slow = [_records(10, 60, seed=r) for r in range(3)] + [_records(70, 2, seed=3)]
    few = [r[: 1 + MIN_STEPS - 1] for r in slow]  # the first is skipped: MIN_STEPS - 1 measured
    assert find_straggler(rank_table(few)) is None
    enough = [r[: 1 + MIN_STEPS] for r in slow]
    assert find_straggler(rank_table(enough))["rank"] == 3
