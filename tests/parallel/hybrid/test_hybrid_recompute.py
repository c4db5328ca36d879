"""Activation recomputation in hybrid layouts on real ranks (``Plan.recompute``, applied after TP,
CP and EP by ``parallel.hybrid.recompute``): each layout against the single process on the same
batch (loss, every gradient, parameters after AdamW, within ``parallel.parity``'s bounds), bytes
per rank per step on every axis measured == predicted, the replayed TP and CP collectives of the
recomputed forward included, and memory per category measured == predicted to the byte."""

import pytest
from hybrid_matrix import DENSE, check

from playbook.dims import ParallelDims
from playbook.theory.hybrid.plan import Plan

FOUR = [
    ("dp2×tp2", ParallelDims(dp=2, tp=2), {}),
    ("tp2×cp2", ParallelDims(tp=2, cp=2), {}),
    ("dp2×pp2", ParallelDims(dp=2, pp=2), {}),
    ("tp2×pp2 with SP", ParallelDims(tp=2, pp=2), {"sequence_parallel": True}),
]
CASES = [
    (f"{mode} in {name}", dims, extra | {"recompute": mode})
    for name, dims, extra in FOUR
    for mode in ("selective", "full")
]

CASES += [
    ("full with ZeRO-3 over dp×cp in dp2×cp2", ParallelDims(dp=2, cp=2), {"zero": 3, "recompute": "full"}),
    (
        "selective with Ulysses in dp2×cp2",
        ParallelDims(dp=2, cp=2),
        {"cp_variant": "ulysses", "recompute": "selective"},
    ),
    ("full with Ulysses in dp2×cp2", ParallelDims(dp=2, cp=2), {"cp_variant": "ulysses", "recompute": "full"}),
    (
        "selective with all-gather CP in dp2×cp2",
        ParallelDims(dp=2, cp=2),
        {"cp_variant": "allgather", "recompute": "selective"},
    ),
    ("full with ZeRO-1 in dp2×pp2", ParallelDims(dp=2, pp=2), {"zero": 1, "recompute": "full"}),
    (
        "selective with zb-h1 in dp2×pp2",
        ParallelDims(dp=2, pp=2),
        {"schedule": "zb-h1", "microbatches": 4, "recompute": "selective"},
    ),
    (
        "full interleaved in tp2×pp2",
        ParallelDims(tp=2, pp=2),
        {"schedule": "interleaved", "microbatches": 4, "recompute": "full"},
    ),
    (
        "selective zb-v in tp2×pp2 with SP",
        ParallelDims(tp=2, pp=2),
        {"schedule": "zb-v", "sequence_parallel": True, "recompute": "selective"},
    ),
]


CASES += [  # a split backward: B recomputes each block once and keeps W's inputs until W
    ("full with zb-h1 in dp2×pp2", ParallelDims(dp=2, pp=2), {"schedule": "zb-h1", "microbatches": 4}),
    ("full zb-v in dp2×pp2", ParallelDims(dp=2, pp=2), {"schedule": "zb-v"}),
    ("full dualpipe-v in dp2×pp2", ParallelDims(dp=2, pp=2), {"schedule": "dualpipe-v", "microbatches": 4}),
    ("full with zb-h1 in cp2×pp2 (a peak after B)", ParallelDims(cp=2, pp=2), {"schedule": "zb-h1", "microbatches": 4}),
    (
        "full with ZeRO-1 and zb-h1 in dp2×pp2",
        ParallelDims(dp=2, pp=2),
        {"schedule": "zb-h1", "microbatches": 4, "zero": 1},
    ),
]
CASES += [  # with TP: the graph stays for W, and W's tensors inside the blocks come from B's recomputation
    ("full with zb-h1 in tp2×pp2", ParallelDims(tp=2, pp=2), {"schedule": "zb-h1", "microbatches": 4}),
    ("full zb-v in tp2×pp2 with SP", ParallelDims(tp=2, pp=2), {"schedule": "zb-v", "sequence_parallel": True}),
]
CASES[-7:] = [(name, dims, options | {"recompute": "full"}) for name, dims, options in CASES[-7:]]


@pytest.mark.parametrize("name, dims, options", CASES, ids=[c[0] for c in CASES])
def test_recomputation_on_four_ranks_matches_the_single_process(ranks4, name, dims, options):
    check(ranks4, DENSE, Plan(dims, **options))


EIGHT = [
    (f"full in tp2×cp2×pp2 {s}", ParallelDims(tp=2, cp=2, pp=2), {"schedule": s, "recompute": "full"})
    for s in ("1f1b", "zb-h1")
]


@pytest.mark.parametrize("name, dims, options", EIGHT, ids=[c[0] for c in EIGHT])
def test_full_recomputation_in_tp2_cp2_pp2_ring_inside_a_pipeline(ranks8, name, dims, options):
    check(ranks8, DENSE, Plan(dims, **options))


def test_recomputation_saves_activations_and_pays_the_collectives_again(ranks4):
    """Measured against measured: full keeps less than none, and sends more on tp and cp (the
    recomputed forward's all-reduces and K/V blocks, Korthikanti et al. 2022, §5)."""
    from playbook.parallel.hybrid.parallelize import train_hybrid
    from playbook.cluster.trace.spans import bytes_by_axis

    def run(mode):
        answers = ranks4.run(train_hybrid, DENSE, Plan(ParallelDims(tp=2, cp=2), recompute=mode))
        a = min(answers, key=lambda a: a["rank"])
        sent = bytes_by_axis([s for s in a["spans"] if s["axis"] != "report"], per=DENSE.steps)
        return a["result"].memory["activations"], sent

    (kept_none, sent_none), (kept_full, sent_full) = run("none"), run("full")
    assert kept_full < kept_none / 4
    assert sent_full["tp"] > sent_none["tp"] and sent_full["cp"] > sent_none["cp"]


def test_recompute_it_cannot_predict_is_refused_in_one_line_before_ranks_start(capsys):
    from playbook.cli import main

    with pytest.raises(ValueError, match="recompute must be one of none, selective, full"):
        Plan(ParallelDims(dp=2), recompute="some").check(DENSE)
    with pytest.raises(SystemExit):  # argparse's own refusal: its usage and one error line
        main(["run", "hybrid", "--dp", "2", "--recompute", "some"])
    assert "argument --recompute: invalid choice: 'some'" in capsys.readouterr().err
