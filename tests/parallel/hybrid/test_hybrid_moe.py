"""A mixture of experts inside the hybrid's pipeline, on real ranks: every stage's aux loss counted,
against the single process that routes the same m micro-batches (``parallel.hybrid.moe``): loss,
every gradient and parameters after 3 AdamW steps within max(1e-5, 3 x the float floor; 10 x for parameters), bytes
per rank per step on every axis measured == predicted, memory per category to the byte
(``hybrid_matrix.check``). The layout lists are rows of the composition matrix (tests/parallel/hybrid/test_hybrid_matrix.py)."""

import pytest
from hybrid_matrix import MOE, axes_used, check

from playbook.dims import ParallelDims
from playbook.parallel.hybrid import moe as hybrid_moe
from playbook.theory.hybrid.plan import Plan
from playbook.parallel.pp.run import PipelineSetup
from playbook.parallel.training import TrainSetup


def test_moe_in_pp2_counts_the_aux_loss_of_both_stages(ranks2):
    answers, _ = check(ranks2, MOE, Plan(ParallelDims(pp=2)))
    assert axes_used(answers) == {"pp"}


IN_PIPELINE = [  # rows of the composition matrix (tests/parallel/hybrid/test_hybrid_matrix.py), as are the lists below
    ("pp2×dp2", Plan(ParallelDims(dp=2, pp=2)), {"dp", "pp"}),
    ("pp2×ep2 inside dp2", Plan(ParallelDims(dp=2, pp=2, ep=2)), {"dp", "ep", "pp"}),
]


@pytest.mark.parametrize("name, plan, used", IN_PIPELINE, ids=[c[0] for c in IN_PIPELINE])
def test_moe_in_a_pipeline_with_data_and_expert_parallelism(ranks4, name, plan, used):
    answers, _ = check(ranks4, MOE, plan)
    assert axes_used(answers) == used


UNDER_CP = [
    ("ep2 inside dp2×cp2", Plan(ParallelDims(dp=2, cp=2, ep=2)), {"cp", "dp×cp", "ep", "dp"}),  # replicas: dp
    ("pp2×cp2 with ep2 over cp", Plan(ParallelDims(pp=2, cp=2, ep=2)), {"cp", "ep", "pp"}),
]


@pytest.mark.parametrize("name, plan, used", UNDER_CP, ids=[c[0] for c in UNDER_CP])
def test_moe_under_context_parallelism_routes_on_the_counts_of_every_shard(ranks4, name, plan, used):
    """Each cp rank routes the tokens of its shard; the counts are all-gathered over dp×cp, so the
    capacity and the aux loss are the global batch's, as under dp (``parallel.hybrid.moe``)."""
    answers, _ = check(ranks4, MOE, plan)
    assert axes_used(answers) == used


def test_moe_under_tp2_routes_each_ranks_sequence_slice(ranks2):
    """tp2: the router and the experts replicated, each tp rank routing its half of the sequence
    (``parallel.tp.moe``); their gradients summed over tp. Without that sum (broken on purpose)
    the router's gradient is half the single process's."""
    answers, _ = check(ranks2, MOE, Plan(ParallelDims(tp=2)))
    assert axes_used(answers) == {"tp"}


WITH_TP = [
    ("dp2×tp2 ep2 with SP", Plan(ParallelDims(dp=2, tp=2, ep=2), sequence_parallel=True), {"dp", "ep", "tp"}),
    ("tp2×pp2", Plan(ParallelDims(tp=2, pp=2)), {"pp", "tp"}),
    ("tp2×cp2", Plan(ParallelDims(tp=2, cp=2)), {"cp", "tp"}),
]


@pytest.mark.parametrize("name, plan, used", WITH_TP, ids=[c[0] for c in WITH_TP])
def test_moe_with_tensor_parallelism_composes(ranks4, name, plan, used):
    answers, _ = check(ranks4, MOE, plan)
    assert axes_used(answers) == used


EIGHT = [
    # DeepSeek-V3's PP·EP·DP (arXiv:2412.19437, §3.2), shrunk: 2 stages, each over 4 data ranks in
    # 2 expert groups of 2 (ep2), every expert held by 2 replicas (dp2 per expert)
    ("DeepSeek-V3 shape dp4×pp2×ep2", Plan(ParallelDims(dp=4, pp=2, ep=2)), {"dp", "ep", "ep_replica", "pp"}),
    # ep2 over dp and sequence parallelism: every axis of the mesh carries bytes
    (
        "every axis: dp2×tp2×pp2 ep2 with SP",
        Plan(ParallelDims(dp=2, tp=2, pp=2, ep=2), sequence_parallel=True),
        {"dp", "ep", "pp", "tp"},
    ),
]


@pytest.mark.parametrize("name, plan, used", EIGHT, ids=[c[0] for c in EIGHT])
def test_moe_on_eight_ranks(ranks8, name, plan, used):
    answers, _ = check(ranks8, MOE, plan)
    assert axes_used(answers) == used


def test_the_reference_routes_micro_batches_not_the_whole_batch():
    """The aux loss is a product of two batch means: the m micro-batches' sum is not the whole
    batch's, so the plain one-forward reference is a different computation."""
    from playbook.parallel.parity import reference

    single, _ = hybrid_moe.reference(MOE, Plan(ParallelDims(pp=2)))
    assert abs(single.losses[0] - reference(MOE).losses[0]) > 1e-6
    assert hybrid_moe.micro_rows(8, 2, 2) == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_an_moe_sequence_that_tp_cannot_split_is_refused_before_ranks_start():
    with pytest.raises(ValueError, match="tp=2 does not divide the 33 tokens per cp rank"):
        Plan(ParallelDims(tp=2)).check(TrainSetup(model="gpt-tiny-moe", seq_len=33))


DEEPER = PipelineSetup(model="gpt-tiny-moe", n_layers=3)  # 3 MoE layers: no pp > 1 divides them
CHUNKED = [  # pp2 on the V (ZB-V) alone: test_hybrid_moe_split.CASES, "none in pp2 zb-v"
    ("pp2 interleaved, v=2", Plan(ParallelDims(pp=2), schedule="interleaved", microbatches=2), MOE, 2),
    ("pp2 over 3 layers (unequal stages)", Plan(ParallelDims(pp=2), microbatches=2), DEEPER, 2),
    (
        "dp2×pp2×ep2 interleaved over 3 layers (unequal virtual stages)",
        Plan(ParallelDims(dp=2, pp=2, ep=2), schedule="interleaved", microbatches=2),
        DEEPER,
        4,
    ),
    (
        "ZeRO-1 in dp2×pp2×ep2, interleaved",
        Plan(ParallelDims(dp=2, pp=2, ep=2), schedule="interleaved", microbatches=2, zero=1),
        MOE,
        4,
    ),
    (
        "dp2×pp2×ep2 on the V: rank 0 holds no MoE layer",
        Plan(ParallelDims(dp=2, pp=2, ep=2), schedule="zb-v", microbatches=2),
        MOE,
        4,
    ),
    (
        "dp2×pp2×ep2 ZB-H1 over 3 layers",
        Plan(ParallelDims(dp=2, pp=2, ep=2), schedule="zb-h1", microbatches=2),
        DEEPER,
        4,
    ),
    ("tp2×pp2 on the V (W on the kept graph)", Plan(ParallelDims(tp=2, pp=2), schedule="zb-v", microbatches=2), MOE, 4),
]


@pytest.mark.parametrize("name, plan, setup, world", CHUNKED, ids=[c[0] for c in CHUNKED])
def test_moe_stages_follow_the_chunks_of_any_schedule(request, name, plan, setup, world):
    """A rank's MoE stage is the pieces of its chunks (``theory.pp.rank_params.chunk_ranges``): v
    virtual stages, equal or not; its routing is played F by F, chunk by chunk, and a split
    backward keeps each MoE layer's W part from B to W (``theory.hybrid.moe``)."""
    check(request.getfixturevalue(f"ranks{world}"), setup, plan)


def test_more_stages_than_layers_is_refused_before_ranks_start():
    with pytest.raises(ValueError, match="pp=3 is more stages than the model's 2 layers"):
        Plan(ParallelDims(pp=3), microbatches=3).check(MOE)


ZERO_WITH_MOE = [
    ("DeepSeek-V3's PP·EP·DP with ZeRO-1: dp4×pp2×ep2", Plan(ParallelDims(dp=4, pp=2, ep=2), zero=1), 8),
    ("ZeRO-3 in dp2×pp2×ep2 (gathered once a step)", Plan(ParallelDims(dp=2, pp=2, ep=2), zero=3), 4),
    (
        "ZeRO-1 in dp2×tp2 with SP (MoE gradients summed over tp)",
        Plan(ParallelDims(dp=2, tp=2), zero=1, sequence_parallel=True),
        4,
    ),
    ("ZeRO-1 in dp2×cp2 with ep2 (experts' replicas: the dp group)", Plan(ParallelDims(dp=2, cp=2, ep=2), zero=1), 4),
]


@pytest.mark.parametrize("name, plan, world", ZERO_WITH_MOE, ids=[c[0] for c in ZERO_WITH_MOE])
def test_zero_shards_an_moe_model_inside_pipelines_tp_and_cp(request, name, plan, world):
    """Dense units over dp×cp, routed experts over their replicas (``theory.hybrid.zero``), with the
    MoE layers' own collectives (``theory.hybrid.moe``) beside them."""
    check(request.getfixturevalue(f"ranks{world}"), MOE, plan)
