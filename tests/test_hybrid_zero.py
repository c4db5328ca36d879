"""ZeRO composed with every axis on real ranks (issue 26): with expert parallelism (dense units over
dp×cp, routed experts over their replicas), ZeRO-3 inside a pipeline, ZeRO-2/3 with sequence
parallelism. Each against the single process on the same global batch (``check``: loss, every
gradient, parameters after AdamW within max(1e-5, 3 x the float floor; 10 x for parameters)), bytes per axis measured ==
predicted, memory per category to the byte."""

import pytest
from test_hybrid import DENSE, MOE, check

from playbook.dims import ParallelDims
from playbook.parallel.hybrid.parallelize import Plan

FOUR = [
    ("ZeRO-1 in dp4×ep2", MOE, Plan(ParallelDims(dp=4, ep=2), zero=1), {"dp", "ep", "ep_replica"}),
    ("ZeRO-2 in dp4×ep2", MOE, Plan(ParallelDims(dp=4, ep=2), zero=2), {"dp", "ep", "ep_replica"}),
    ("ZeRO-3 in dp4×ep2", MOE, Plan(ParallelDims(dp=4, ep=2), zero=3), {"dp", "ep", "ep_replica"}),
    # the norms' gradients summed over tp, unit by unit, before each unit's reduce-scatter over dp
    ("ZeRO-2 in dp2×tp2 with SP", DENSE, Plan(ParallelDims(dp=2, tp=2), zero=2, sequence_parallel=True), {"dp", "tp"}),
    ("ZeRO-3 in dp2×tp2 with SP", DENSE, Plan(ParallelDims(dp=2, tp=2), zero=3, sequence_parallel=True), {"dp", "tp"}),
]


TWO = [
    # ep = dp: every rank holds its own experts, no replica: the expert units are whole, never sent
    ("ZeRO-3 in dp2×ep2", MOE, Plan(ParallelDims(dp=2, ep=2), zero=3), {"dp", "ep"}),
    # ep = 1: every rank holds every expert, their replicas are all of dp
    ("ZeRO-2 with an MoE in dp2", MOE, Plan(ParallelDims(dp=2), zero=2), {"dp"}),
]


def _axes(answers) -> set:
    return {s["axis"] for a in answers for s in a["spans"] if s["axis"] != "report"}


@pytest.mark.parametrize("name, setup, plan, axes", TWO, ids=[c[0] for c in TWO])
def test_zero_composes_on_two_ranks(ranks2, name, setup, plan, axes):
    answers, _ = check(ranks2, setup, plan)
    assert _axes(answers) == axes


@pytest.mark.parametrize("name, setup, plan, axes", FOUR, ids=[c[0] for c in FOUR])
def test_zero_composes_on_four_ranks(ranks4, name, setup, plan, axes):
    answers, _ = check(ranks4, setup, plan)
    assert _axes(answers) == axes


EIGHT = [  # all three at once: ZeRO-3 gathered once a step in a pipeline, the norms summed over tp first
    (
        "ZeRO-3 in dp2×tp2×pp2 with SP",
        DENSE,
        Plan(ParallelDims(dp=2, tp=2, pp=2), zero=3, sequence_parallel=True),
        {"dp", "tp", "pp"},
    ),
    ("ZeRO-3 over dp×cp in dp2×cp2×pp2", DENSE, Plan(ParallelDims(dp=2, cp=2, pp=2), zero=3), {"cp", "dp×cp", "pp"}),
]


@pytest.mark.parametrize("name, setup, plan, axes", EIGHT, ids=[c[0] for c in EIGHT])
def test_zero_composes_on_eight_ranks(ranks8, name, setup, plan, axes):
    answers, _ = check(ranks8, setup, plan)
    assert _axes(answers) == axes


PIPELINE = [(z, s) for z in (1, 2, 3) for s in ("1f1b", "zb-h1")]


@pytest.mark.parametrize("zero, schedule", PIPELINE, ids=[f"ZeRO-{z} {s}" for z, s in PIPELINE])
def test_zero_inside_a_pipeline_saves_memory_between_steps_only(ranks4, zero, schedule):
    """dp2×pp2: ZeRO-3 gathers each unit once a step, keeps it through the m micro-batches and
    reduce-scatters after the last (``parallel.zero.pipeline``). Between steps it holds slices only;
    after the last backward every stage holds whole weights and whole gradients, measured == predicted,
    and ZeRO-3's slice on top: no less than ZeRO-1 at the step's peak."""
    from playbook.theory.hybrid import chunk_ranges
    from playbook.theory.hybrid_zero import flat_units, pipeline_peak_state

    plan = Plan(ParallelDims(dp=2, pp=2), zero=zero, schedule=schedule, microbatches=4)
    answers, _ = check(ranks4, DENSE, plan)
    assert _axes(answers) == {"dp", "pp"}
    for a in answers:
        stage = a["coords"]["pp"]
        units = flat_units(DENSE.config(), plan.dims, chunk_ranges(DENSE.config(), 2, stage))
        assert a["result"].memory["state_after_backward"] == pipeline_peak_state(units, zero), a["rank"]
    assert pipeline_peak_state(units, 3) > pipeline_peak_state(units, 2) == pipeline_peak_state(units, 1)
