"""The Llama 3 shape, shrunk (Dubey et al. 2024, §3.3.2: TP·CP·PP·DP, sharded optimizer state,
sequence parallelism): dp2×tp2×pp2×cp2 on 16 real gloo ranks with ZeRO-1 over dp×cp and SP, under
1F1B and interleaved 1F1B with two virtual stages per rank, against one process on the same global
batch: loss, every gradient and the parameters after 3 AdamW steps within ``parallel.parity``'s
bounds; bytes per step on every axis of every rank measured == predicted (``theory.hybrid.hybrid``);
memory per category of every rank measured == predicted to the byte."""

import pytest
from hybrid_matrix import axes_used, check

from playbook.dims import ParallelDims
from playbook.theory.hybrid.plan import Plan
from playbook.parallel.training import TrainSetup

SETUP = TrainSetup()
FOUR_AXES = ParallelDims(dp=2, tp=2, pp=2, cp=2)
SIXTEEN = [  # rows of the composition matrix (tests/parallel/hybrid/test_hybrid_matrix.py)
    (f"Llama 3 shape {schedule}", SETUP, Plan(FOUR_AXES, zero=1, sequence_parallel=True, schedule=schedule))
    for schedule in ("1f1b", "interleaved")
]


@pytest.mark.parametrize("name, setup, plan", SIXTEEN, ids=[c[0] for c in SIXTEEN])
def test_dp2_tp2_pp2_cp2_with_zero1_and_sp_matches_one_process(ranks16, name, setup, plan):
    assert plan.v == (2 if plan.schedule == "interleaved" else 1)
    answers, _ = check(ranks16, setup, plan)
    assert len(answers) == 16
    for a in answers:  # every axis carries bytes on every rank
        assert axes_used([a]) == {"tp", "cp", "pp", "dp×cp"}, a["rank"]


def test_the_405b_plan_shrinks_to_this_layout_with_its_schedule_and_replays_exactly(ranks16):
    """``playbook plan``'s best layouts for Llama-3.1-405B on 16,384 H100 use all four axes and ZB-V
    (two chunks per rank, the V): shrunk, the replay keeps every axis and the schedule, and runs on
    these 16 ranks with every byte and memory category as predicted."""
    from playbook.config import ModelConfig
    from playbook.parallel.hybrid.replay import replay
    from playbook.theory.plan.shrink import shrink
    from playbook.viz.plan_dashboard import cached_plan

    planned = cached_plan("llama-3.1-405b", "h100-sxm", 16384, 8192, 2048)
    best = next(c for c in planned.candidates if c.layout.schedule == "zb-v")
    small = shrink(best, model=ModelConfig.preset("llama-3.1-405b"), max_ranks=16)
    assert (small.dims, small.schedule, small.virtual_stages) == (FOUR_AXES, "zb-v", 2)
    assert "--schedule zb-v" in small.command()
    assert replay(small, cluster=ranks16).exact
