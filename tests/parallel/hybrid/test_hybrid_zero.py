"""ZeRO composed with every axis on real ranks (issue 26): with expert parallelism (dense units over
dp×cp, routed experts over their replicas), ZeRO-3 inside a pipeline, ZeRO-2/3 with sequence
parallelism. Each against the single process on the same global batch (``check``: loss, every
gradient, parameters after AdamW within max(1e-5, 3 x the float floor; 10 x for parameters)), bytes per axis measured ==
predicted, memory per category to the byte."""

import pytest
from hybrid_matrix import DENSE, MOE, axes_used, check

from playbook.dims import ParallelDims
from playbook.theory.hybrid.plan import Plan
from playbook.parallel.training import TrainSetup

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


@pytest.mark.parametrize("name, setup, plan, axes", TWO, ids=[c[0] for c in TWO])
def test_zero_composes_on_two_ranks(ranks2, name, setup, plan, axes):
    answers, _ = check(ranks2, setup, plan)
    assert axes_used(answers) == axes


@pytest.mark.parametrize("name, setup, plan, axes", FOUR, ids=[c[0] for c in FOUR])
def test_zero_composes_on_four_ranks(ranks4, name, setup, plan, axes):
    answers, _ = check(ranks4, setup, plan)
    assert axes_used(answers) == axes


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
    assert axes_used(answers) == axes


PIPELINE = [
    (f"ZeRO-{z} {s} in dp2×pp2", DENSE, Plan(ParallelDims(dp=2, pp=2), zero=z, schedule=s, microbatches=4))
    for z in (1, 2, 3)
    for s in ("1f1b", "zb-h1")
]


@pytest.mark.parametrize("name, setup, plan", PIPELINE, ids=[c[0] for c in PIPELINE])
def test_zero_inside_a_pipeline_saves_memory_between_steps_only(ranks4, name, setup, plan):
    """dp2×pp2: ZeRO-3 gathers each unit once a step, keeps it through the m micro-batches and
    reduce-scatters after the last (``parallel.zero.pipeline``). Between steps it holds slices only;
    after the last backward every stage holds whole weights and whole gradients, measured == predicted,
    and ZeRO-3's slice on top: no less than ZeRO-1 at the step's peak."""
    from playbook.theory.pp.rank_params import chunk_ranges
    from playbook.theory.hybrid.zero import flat_units, pipeline_peak_state

    zero = plan.zero
    answers, _ = check(ranks4, DENSE, plan)
    assert axes_used(answers) == {"dp", "pp"}
    for a in answers:
        stage = a["coords"]["pp"]
        units = flat_units(DENSE.config(), plan.dims, chunk_ranges(DENSE.config(), 2, stage))
        assert a["result"].memory["state_after_backward"] == pipeline_peak_state(units, zero), a["rank"]
    assert pipeline_peak_state(units, 3) > pipeline_peak_state(units, 2) == pipeline_peak_state(units, 1)


# A routed expert that no token reaches: 4 tokens per row, seeds where the single process routes none
# to an expert in step 1 (of 3), every expert fed in steps 0 and 2 (its AdamW state exists; step 2's
# bias correction sees the skipped step). The single process leaves it without gradient, so AdamW
# does not touch it; ZeRO must do the same. In dp4×ep2 (seed 43) some expert is also fed on one
# replica and not on the other (steps 0 and 1): neither may wait on a reduce-scatter the other never joins.
STARVED = [
    (z, TrainSetup(model="gpt-tiny-moe", global_batch=n, seq_len=4, seed=seed), Plan(ParallelDims(dp=n, ep=2), zero=z))
    for n, seed in ((2, 9), (4, 43))
    for z in (1, 2, 3)
]


@pytest.mark.parametrize("zero, setup, plan", STARVED, ids=[f"ZeRO-{z} {p.dims} seed {s.seed}" for z, s, p in STARVED])
def test_an_expert_no_token_reaches_is_left_alone_as_the_single_process_leaves_it(ranks2, ranks4, zero, setup, plan):
    answers, _ = check(ranks2 if plan.dims.world == 2 else ranks4, setup, plan)
    routing = next(a["routing"] for a in answers)  # [step][forward]: the counts of every data rank
    assert [any(0 in f["kept"] for f in step) for step in routing] == [False, True, False]
    if plan.dims.ep < plan.dims.dp:  # the replicas of an expert: ep groups of data ranks, {0, 1} and {2, 3}
        fed = [
            [[sum(f["counts_by_rank"][r][e] for r in g) > 0 for g in ((0, 1), (2, 3))] for e in range(4)]
            for f in routing[1]
        ]
        assert any(a != b for layer in fed for a, b in layer)  # fed on one replica only


def test_an_expert_no_token_reaches_is_left_alone_by_a_pipelines_zero(ranks4):
    """``PipelineZero`` (ZeRO-3 gathered once a step, reduced after the last micro-batch) leaves it
    alone too; against the single process that routes the same micro-batches (``test_hybrid_moe``)."""
    setup = TrainSetup(model="gpt-tiny-moe", global_batch=4, seq_len=4, seed=66)  # starved in step 1
    answers, _ = check(ranks4, setup, Plan(ParallelDims(dp=2, pp=2, ep=2), zero=3))
    # each stage holds one MoE layer: an expert starved in a step is 0 in every micro-batch's forward
    starved = [
        any(any(all(f["kept"][e] == 0 for f in a["routing"][step]) for e in range(4)) for a in answers)
        for step in range(setup.steps)
    ]
    assert starved == [False, True, False]
