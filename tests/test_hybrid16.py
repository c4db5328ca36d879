"""The Llama 3 shape, shrunk (Dubey et al. 2024, §3.3.2: TP·CP·PP·DP, sharded optimizer state,
sequence parallelism): dp2×tp2×pp2×cp2 on 16 real gloo ranks with ZeRO-1 over dp×cp and SP, under
1F1B and interleaved 1F1B with two virtual stages per rank, against one process on the same global
batch: loss, every gradient and the parameters after 3 AdamW steps within ``parallel.parity``'s
bounds; bytes per step on every axis of every rank measured == predicted (``theory.hybrid``);
memory per category of every rank measured == predicted to the byte."""

import pytest

from playbook.dims import ParallelDims
from playbook.parallel.hybrid.parallelize import Plan, train_hybrid
from playbook.parallel.hybrid.run import comm_table, merge, reference
from playbook.parallel.parity import assert_parity
from playbook.parallel.report import compare
from playbook.parallel.training import TrainSetup

SETUP = TrainSetup()
FOUR_AXES = ParallelDims(dp=2, tp=2, pp=2, cp=2)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
def test_dp2_tp2_pp2_cp2_with_zero1_and_sp_matches_one_process(ranks16, schedule):
    plan = Plan(FOUR_AXES, zero=1, sequence_parallel=True, schedule=schedule)
    plan.check(SETUP)
    assert plan.v == (2 if schedule == "interleaved" else 1)
    answers = ranks16.run(train_hybrid, SETUP, plan)
    assert_parity(compare(merge(answers, FOUR_AXES.tp), reference(SETUP)), SETUP, f"{FOUR_AXES} {schedule}")
    rows = comm_table(answers, SETUP, plan)
    assert len(rows) == 16
    for row in rows:
        assert set(row["predicted"]) == {"tp", "cp", "pp", "dp×cp"}, row["rank"]  # every axis carries bytes
        assert row["measured"] == pytest.approx(row["predicted"], rel=1e-12), row["rank"]
        assert row["memory"]["measured"] == row["memory"]["predicted"], row["rank"]  # every category, to the byte


def test_the_405b_plan_shrinks_to_this_layout_with_its_schedule_and_replays_exactly(ranks16):
    """``playbook plan``'s best layouts for Llama-3.1-405B on 16,384 H100 use all four axes and ZB-V
    (two chunks per rank, the V): shrunk, the replay keeps every axis and the schedule, and runs on
    these 16 ranks with every byte and memory category as predicted."""
    from playbook.config import ModelConfig
    from playbook.parallel.hybrid.replay import replay
    from playbook.theory.shrink import shrink
    from playbook.viz.plan_dashboard import cached_plan

    planned = cached_plan("llama-3.1-405b", "h100-sxm", 16384, 8192, 2048)
    best = next(c for c in planned.candidates if c.layout.schedule == "zb-v")
    small = shrink(best, model=ModelConfig.preset("llama-3.1-405b"), max_ranks=16)
    assert (small.dims, small.schedule, small.virtual_stages) == (FOUR_AXES, "zb-v", 2)
    assert "--schedule zb-v" in small.command()
    assert replay(small, cluster=ranks16).exact
