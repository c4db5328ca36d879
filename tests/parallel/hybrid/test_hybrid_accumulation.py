"""pp = 1 with m > 1 micro-batches: gradient accumulation through the hybrid's one pipeline driver
(``parallel.hybrid.pipeline``: 1F1B of one stage, F₀ B₀ F₁ B₁ …), against the single process on the same
global batch (``check``: loss, every gradient, parameters after AdamW within the parity gate), bytes
per axis measured == predicted and memory per category to the byte. The activations are one
micro-batch's: they scale with b/m. ZeRO-3 keeps its weights gathered across the micro-batches and
reduces on the last one, as torchtitan does with FSDP under PP (``parallel.zero.pipeline``)."""

import json

import pytest
from hybrid_matrix import DENSE, MOE, check

from playbook.dims import ParallelDims
from playbook.theory.hybrid.plan import Plan
from playbook.theory.hybrid.hybrid import memory_per_rank

CASES = [
    ("dp2 m4", DENSE, Plan(ParallelDims(dp=2), microbatches=4), 2),
    ("ZeRO-3 dp2 m2", DENSE, Plan(ParallelDims(dp=2), zero=3, microbatches=2), 2),
    ("ZeRO-2 dp2 m2", DENSE, Plan(ParallelDims(dp=2), zero=2, microbatches=2), 2),
    ("MoE dp2 m2", MOE, Plan(ParallelDims(dp=2), microbatches=2), 2),
    ("MoE ZeRO-3 dp4×ep2 m2", MOE, Plan(ParallelDims(dp=4, ep=2), zero=3, microbatches=2), 4),
    ("tp2×cp2 with SP, m2", DENSE, Plan(ParallelDims(tp=2, cp=2), sequence_parallel=True, microbatches=2), 4),
]


@pytest.mark.parametrize("name, setup, plan, world", CASES, ids=[c[0] for c in CASES])
def test_gradient_accumulation_at_pp1_matches_the_single_process(request, name, setup, plan, world):
    # an MoE model against the single process that routes the same m micro-batches (``hybrid.moe.reference``)
    check(request.getfixturevalue(f"ranks{world}"), setup, plan)


def test_activations_at_pp1_are_one_micro_batchs():
    """1F1B of one stage frees each micro-batch's graph before the next forward: m = 4 holds about a
    quarter of m = 1's activations (a quarter of the rows; what does not grow with the rows, such as
    the causal mask, stays), weights and AdamW unchanged. The runs above measure it to the byte."""
    cfg, dims = DENSE.config(), ParallelDims(dp=2)
    one, four = (memory_per_rank(cfg, dims, rank=0, global_batch=8, seq_len=32, microbatches=m) for m in (1, 4))
    assert one["activations"] / 4 < four["activations"] < one["activations"] / 3.9
    assert {k: v for k, v in four.items() if k != "activations"} == {k: v for k, v in one.items() if k != "activations"}


def test_playbook_run_hybrid_dp2_microbatches4(capsys):
    from playbook.cli import main

    assert main(["run", "hybrid", "--dp", "2", "--microbatches", "4", "--steps", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["world_size"] == 2 and report["setup"]["microbatches"] == 4
    assert report["parity"]["within_bounds"] is True
    for row in report["per_rank"]:
        assert row["measured"] == pytest.approx(row["predicted"], rel=1e-12)
        assert row["memory"]["measured"] == row["memory"]["predicted"]


@pytest.mark.parametrize("schedule", ["gpipe", "zb-h1", "interleaved", "zb-v"])
def test_a_pipeline_schedule_without_a_pipeline_is_refused_in_one_line(capsys, schedule):
    """At pp = 1 the driver plays 1F1B of one stage whatever --schedule says: refused, not ignored."""
    from playbook.cli import main

    assert main(["run", "hybrid", "--dp", "2", "--microbatches", "2", "--schedule", schedule]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--schedule {schedule} orders a pipeline's stages, and pp=1 here" in err[0]
