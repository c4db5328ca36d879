"""A straggler on real ranks (``hybrid.conditions``, ``measure.steps``): one rank sleeps in every
step; parity holds, every rank's step-time percentiles are reported, and the slow rank is named."""

import pytest

from playbook.cli import main
from playbook.dims import ParallelDims
from playbook.measure.steps import step_report
from playbook.parallel.hybrid.conditions import STRAGGLER, Conditions
from playbook.parallel.hybrid.merge import merge
from playbook.parallel.hybrid.parallelize import train_hybrid
from playbook.parallel.report import compare
from playbook.parallel.training import TrainSetup, train
from playbook.theory.hybrid.plan import Plan

SLOW_S = 0.3  # far above a gpt-tiny step's own work on 4 ranks, even at load 40 (20-150 ms)


def test_the_slow_rank_is_found_from_its_own_work(ranks4):
    setup = TrainSetup(steps=8)
    answers = ranks4.run(
        train_hybrid, setup, Plan(ParallelDims(dp=2, tp=2)), Conditions(slow_rank=2, slow_ms=SLOW_S * 1e3)
    )
    assert compare(merge(answers, 2), train(setup))["max_abs_loss_diff"] < 1e-5  # a sleep changes no number
    report = step_report(answers)
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2, 3] and all(r["steps"] == 7 for r in report["ranks"])
    assert all(rec["busy"] >= SLOW_S for rec in answers[2]["steps"])  # the sleep is inside its step: a lower bound
    assert report["straggler"]["rank"] == 2
    naps = [s for s in ranks4.last_trace if s["name"] == STRAGGLER]
    assert {s["rank"] for s in naps} == {2} and len(naps) == setup.steps


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--slow-rank", "4", "--slow-ms", "5"], "--slow-rank 4 is not a rank of this layout's 4; try --slow-rank 3"),
        (["--slow-ms", "5"], "--slow-ms 5 slows one rank: name it with --slow-rank"),
        (["--slow-rank", "1"], "--slow-rank 1 needs --slow-ms"),
        (["--prefetch", "2"], "--prefetch 2 is batches kept ahead by each worker"),
        (["--loader-workers", "-1"], "--loader-workers must be an integer in 0..64"),
    ],
)
def test_bad_condition_flags_are_one_line_before_any_rank(capsys, flags, words):
    assert main(["run", "hybrid", "--dp", "2", "--tp", "2", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("playbook: error: ") and "\n" not in err and words in err, err
