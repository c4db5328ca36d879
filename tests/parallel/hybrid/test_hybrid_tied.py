"""A tied embedding across the pipeline (Megatron-LM's embedding group: Shoeybi et al. 2019, §3;
Narayanan et al. 2021): the first and the last stage each hold a copy of the word embedding, and
their gradients are summed over the two ranks after backward. Against one process on the same
global batch (loss, every gradient, parameters after 3 AdamW steps within ``parallel.parity``'s
bounds), bytes per axis of every rank measured == predicted with the embedding group's all-reduce
counted (``theory.hybrid.hybrid``), memory per category to the byte, and the two copies bit-for-bit equal.
Under ZeRO (Rajbhandari et al. 2020) the tied weight is one flat unit's (the embedding's) where a rank
holds both ends, and the embedding group's sum precedes the reduce-scatter where it does not."""

import pytest
from hybrid_matrix import TIED
from hybrid_matrix import check as check_layout

from playbook.dims import ParallelDims
from playbook.parallel import grads
from playbook.theory.hybrid.plan import Plan
from playbook.parallel.hybrid.merge import comm_table
from playbook.theory.hybrid.hybrid import comm_per_axis


def check(ranks, plan: Plan) -> list[dict]:
    """``hybrid_matrix.check``: parity, bytes and memory, and the copies of the tied weight bit-for-bit equal."""
    return check_layout(ranks, TIED, plan)[0]


TWO = [Plan(ParallelDims(pp=2)), Plan(ParallelDims(dp=2))]  # rows of the composition matrix, as the lists below


def test_pp2_sums_the_two_copies_over_the_embedding_group(ranks2):
    answers = check(ranks2, TWO[0])
    (row,) = [r for r in comm_table(answers, TIED, TWO[0]) if r["rank"] == 1]
    assert row["measured"]["embed"] == 4 * 64 * 64  # one [vocab, hidden] fp32 all-reduce over 2 ranks: S


def test_without_a_pipeline_the_tied_weight_is_one_tensor_counted_once(ranks2):
    answers = check(ranks2, TWO[1])  # memory to the byte: the head adds its norm only
    assert all("embed" not in row["measured"] for row in comm_table(answers, TIED, TWO[1]))


FOUR = [
    Plan(ParallelDims(dp=2, pp=2)),
    Plan(ParallelDims(tp=2, pp=2), sequence_parallel=True),
    Plan(ParallelDims(dp=2, pp=2), schedule="interleaved"),  # the head on rank 1's second chunk
    Plan(ParallelDims(dp=2, pp=2), schedule="zb-v", microbatches=2),  # rank 0 holds both: nothing sent
]


@pytest.mark.parametrize("plan", FOUR, ids=["dp2×pp2", "tp2×pp2 SP", "dp2×pp2 interleaved", "dp2×pp2 zb-v"])
def test_tied_embedding_composes_with_dp_tp_and_the_v(ranks4, plan):
    answers = check(ranks4, plan)
    axes = {ax for row in comm_table(answers, TIED, plan) for ax in row["measured"]}
    assert ("embed" in axes) == (plan.schedule != "zb-v")
    if plan == FOUR[0]:  # dp2×pp2: the copies summed in the order of the gradient table's row
        order = [{"dp_cp": "dp"}.get(axis, axis) for axis in grads.TIED.axes]
        for a in answers:
            assert [s["axis"] for s in a["spans"] if s["axis"] in order] == order * TIED.steps, a["rank"]


def test_only_the_first_and_last_pipeline_ranks_send_on_the_embedding_group():
    cfg = TIED.config().replace(n_layers=4)
    sent = [
        comm_per_axis(cfg, ParallelDims(pp=4), rank=r, global_batch=8, seq_len=32, microbatches=4).get("embed", 0)
        for r in range(4)
    ]
    assert sent == [4 * 64 * 64, 0, 0, 4 * 64 * 64]


ZERO_TWO = [Plan(ParallelDims(dp=2), zero=z) for z in (1, 2, 3)] + [Plan(ParallelDims(dp=2), zero=3, microbatches=2)]


@pytest.mark.parametrize("plan", ZERO_TWO, ids=[f"ZeRO-{p.zero} dp2 m{p.m}" for p in ZERO_TWO])
def test_zero_holds_the_tied_weight_in_the_embeddings_unit_only(ranks2, plan):
    """pp = 1: one weight, one unit (the head's unit is its norm only); ZeRO-3 keeps the embedding's
    unit gathered until the head has read it, so every unit is still gathered twice a step (once
    with m = 2 micro-batches, gathered for the whole step: ``parallel.zero.pipeline``)."""
    answers = check(ranks2, plan)
    assert all(set(row["measured"]) == {"dp"} for row in comm_table(answers, TIED, plan))


ZERO_FOUR = [
    Plan(ParallelDims(dp=2, pp=2), zero=1),
    Plan(ParallelDims(dp=2, pp=2), zero=2),
    Plan(ParallelDims(dp=2, pp=2), zero=3),
    Plan(ParallelDims(dp=2, tp=2), zero=1, sequence_parallel=True),
    Plan(ParallelDims(dp=2, pp=2), zero=1, schedule="zb-v", microbatches=2),  # rank 0: both ends, one unit
    Plan(ParallelDims(dp=2, pp=2), zero=3, schedule="zb-v", microbatches=2),
]


@pytest.mark.parametrize(
    "plan",
    ZERO_FOUR,
    ids=[
        "ZeRO-1 dp2×pp2",
        "ZeRO-2 dp2×pp2",
        "ZeRO-3 dp2×pp2",
        "ZeRO-1 dp2×tp2 SP",
        "ZeRO-1 dp2×pp2 zb-v",
        "ZeRO-3 dp2×pp2 zb-v",
    ],
)
def test_zero_composes_with_the_embedding_group(ranks4, plan):
    """The two copies summed over the embedding group before ZeRO's reduce-scatter over dp: the
    bytes on ``embed`` are the same [vocab/tp, hidden] all-reduce as without ZeRO."""
    answers = check(ranks4, plan)
    embed = {row["rank"]: row["measured"].get("embed", 0) for row in comm_table(answers, TIED, plan)}
    across = plan.dims.pp > 1 and plan.schedule != "zb-v"
    assert embed == {r: 4 * 64 * 64 // plan.dims.tp if across else 0 for r in embed}


EIGHT = [Plan(ParallelDims(dp=2, tp=2, pp=2), zero=1, sequence_parallel=True)]


def test_zero_with_tp_pp_and_sp_sums_each_tp_shard_of_the_copies(ranks8):
    """dp2×tp2×pp2 with SP and ZeRO-1: each tp rank's [vocab/tp, hidden] rows summed over its own
    embedding group, then reduce-scattered over dp."""
    (plan,) = EIGHT
    answers = check(ranks8, plan)
    embed = [row["measured"].get("embed", 0) for row in comm_table(answers, TIED, plan)]
    assert embed == [4 * 64 * 64 // 2] * 8


def test_run_zero_refuses_a_tied_preset_in_one_line_before_ranks_start():
    from playbook.parallel.zero.run import run_zero

    with pytest.raises(ValueError, match="playbook run hybrid --dp 2 --zero 1"):
        run_zero(TIED, world_size=2, stage=1)


def test_torchs_pipeline_refuses_a_tied_preset_in_one_line():
    """``torch.distributed.pipelining``'s stages would train the two copies apart: refused before any
    collective, as ``run pp`` skips it."""
    from playbook.parallel.pp.native import native_on_rank

    with pytest.raises(ValueError, match="gpt-tiny-tied ties its head to its embedding, .* run ours"):
        native_on_rank(None, TIED, schedule="1f1b", m=2)
