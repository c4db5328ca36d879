"""The hybrid mesh on real ranks: every composition against the single process on the same global
batch (loss, every gradient, and parameters after 3 AdamW steps by relative L2 per tensor, each
within max(1e-5, 3 x the float floor of this machine's float32: ``parallel.parity``), bytes per
rank per step on every mesh axis measured == predicted, memory per category to the byte
(``hybrid_matrix.check``). FOUR and EIGHT are rows of the composition matrix (tests/parallel/hybrid/test_hybrid_matrix.py)."""

import pytest

from hybrid_matrix import DENSE, MOE, axes_used, check

from playbook.cluster import RankTimeout
from playbook.dims import ParallelDims
from playbook.theory.hybrid.plan import Plan
from playbook.parallel.hybrid.parallelize import train_hybrid
from playbook.parallel.hybrid.merge import comm_table, merge
from playbook.parallel.parity import reference
from playbook.parallel.parity import bounds
from playbook.parallel.report import compare
from playbook.parallel.training import TrainSetup

FOUR = [
    ("dp2×tp2", DENSE, Plan(ParallelDims(dp=2, tp=2)), {"dp", "tp"}),
    ("tp2×pp2", DENSE, Plan(ParallelDims(tp=2, pp=2)), {"tp", "pp"}),
    ("dp2×pp2", DENSE, Plan(ParallelDims(dp=2, pp=2)), {"dp", "pp"}),
    ("dp2×cp2", DENSE, Plan(ParallelDims(dp=2, cp=2)), {"cp", "dp×cp"}),
    ("tp2×cp2", DENSE, Plan(ParallelDims(tp=2, cp=2)), {"tp", "cp"}),
    ("ZeRO-1 over dp in dp2×tp2", DENSE, Plan(ParallelDims(dp=2, tp=2), zero=1), {"dp", "tp"}),
    ("ZeRO-2 over dp in dp2×tp2", DENSE, Plan(ParallelDims(dp=2, tp=2), zero=2), {"dp", "tp"}),
    ("ZeRO-3 over dp in dp2×tp2", DENSE, Plan(ParallelDims(dp=2, tp=2), zero=3), {"dp", "tp"}),
    ("ZeRO-3 over dp4", DENSE, Plan(ParallelDims(dp=4), zero=3), {"dp"}),
    ("dp2×tp2 with sequence parallelism", DENSE, Plan(ParallelDims(dp=2, tp=2), sequence_parallel=True), {"dp", "tp"}),
    ("dp2×cp2 zig-zag", DENSE, Plan(ParallelDims(dp=2, cp=2), zigzag=True), {"cp", "dp×cp"}),
    ("tp2×cp2 all-gather", DENSE, Plan(ParallelDims(tp=2, cp=2), cp_variant="allgather"), {"tp", "cp"}),
    ("ep2 inside dp4 (replicas)", MOE, Plan(ParallelDims(dp=4, ep=2)), {"dp", "ep", "ep_replica"}),
    ("ZeRO-1 in dp2×pp2", DENSE, Plan(ParallelDims(dp=2, pp=2), zero=1), {"dp", "pp"}),
    # ZeRO-1 in dp2×pp2 zb-h1, m=4: test_hybrid_zero.PIPELINE (the same check, axes and the peak state)
    ("ZeRO-2 in dp2×pp2 (reduce on the last micro-batch)", DENSE, Plan(ParallelDims(dp=2, pp=2), zero=2), {"dp", "pp"}),
    ("ZeRO-1 over dp×cp in dp2×cp2", DENSE, Plan(ParallelDims(dp=2, cp=2), zero=1), {"cp", "dp×cp"}),
    ("ZeRO-3 over cp in cp2×tp2", DENSE, Plan(ParallelDims(tp=2, cp=2), zero=3), {"tp", "cp"}),
    ("tp2×pp2 with sequence parallelism", DENSE, Plan(ParallelDims(tp=2, pp=2), sequence_parallel=True), {"tp", "pp"}),
    ("tp2×cp2 with sequence parallelism", DENSE, Plan(ParallelDims(tp=2, cp=2), sequence_parallel=True), {"tp", "cp"}),
    ("cp2×pp2", DENSE, Plan(ParallelDims(cp=2, pp=2)), {"cp", "pp"}),
    (
        "cp2×pp2 zig-zag, gpipe, m=4",
        DENSE,
        Plan(ParallelDims(cp=2, pp=2), zigzag=True, schedule="gpipe", microbatches=4),
        {"cp", "pp"},
    ),
]
EIGHT = [
    ("dp2×tp2×pp2", DENSE, Plan(ParallelDims(dp=2, tp=2, pp=2)), {"dp", "tp", "pp"}),
    ("dp2×cp2×pp2", DENSE, Plan(ParallelDims(dp=2, cp=2, pp=2)), {"cp", "dp×cp", "pp"}),
    ("tp2×cp2×pp2", DENSE, Plan(ParallelDims(tp=2, cp=2, pp=2)), {"tp", "cp", "pp"}),
    ("ZeRO-1 over dp×cp in dp2×cp2×pp2", DENSE, Plan(ParallelDims(dp=2, cp=2, pp=2), zero=1), {"cp", "dp×cp", "pp"}),
    (
        "ZeRO-1 in dp2×tp2×pp2 with SP",
        DENSE,
        Plan(ParallelDims(dp=2, tp=2, pp=2), zero=1, sequence_parallel=True),
        {"dp", "tp", "pp"},
    ),
    (
        "ZeRO-1 over cp in tp2×cp2×pp2 with SP",
        DENSE,
        Plan(ParallelDims(tp=2, cp=2, pp=2), zero=1, sequence_parallel=True),
        {"tp", "cp", "pp"},
    ),
    (
        "ZeRO-2 in dp2×tp2×pp2 with SP",
        DENSE,
        Plan(ParallelDims(dp=2, tp=2, pp=2), zero=2, sequence_parallel=True),
        {"dp", "tp", "pp"},
    ),
    ("tp2×cp2×pp2 with SP", DENSE, Plan(ParallelDims(tp=2, cp=2, pp=2), sequence_parallel=True), {"tp", "cp", "pp"}),
]


@pytest.mark.parametrize("name, setup, plan, axes", FOUR, ids=[c[0] for c in FOUR])
def test_four_rank_layouts_match_the_single_process_with_bytes_per_axis_as_predicted(ranks4, name, setup, plan, axes):
    answers, _ = check(ranks4, setup, plan)
    assert axes_used(answers) == axes


def test_ep2_inside_dp2_moe(ranks2):
    answers, _ = check(ranks2, MOE, Plan(ParallelDims(dp=2, ep=2)))
    assert {"dp", "ep"} <= axes_used(answers)  # the all-to-alls on their own group, though its ranks are dp's


def test_moe_inside_dp_alone_routes_on_the_global_counts(ranks2):
    """dp2 with every expert on every rank (ep = 1): capacity and the aux loss are functions of the
    whole batch's routing counts, so the counts are all-gathered over dp as under EP. Routing each
    rank's tokens alone (the old bug) put the first gradients 8% off the single process."""
    answers, _ = check(ranks2, MOE, Plan(ParallelDims(dp=2)))
    assert {s["name"] for a in answers for s in a["spans"] if s["axis"] == "dp"} >= {"all_gather_single"}


@pytest.mark.parametrize("name, setup, plan, axes", EIGHT, ids=[c[0] for c in EIGHT])
def test_eight_rank_layouts_match_the_single_process_with_bytes_per_axis_as_predicted(ranks8, name, setup, plan, axes):
    answers, _ = check(ranks8, setup, plan)
    assert axes_used(answers) == axes
    sends = [s for a in answers for s in a["spans"] if s["name"] == "isend"]
    assert sends and all(s["axis"] == "pp" for s in sends)


def test_a_pipeline_inside_a_subgroup_talks_to_its_own_stage_peers(ranks4):
    """dp2×pp2: the pipelines are ranks {0, 2} and {1, 3}. Sending to the pipeline-local peer
    index as if it were global (the old bug) would pair rank 0 with rank 1 and rank 2 with rank 0."""
    answers, _ = check(ranks4, DENSE, Plan(ParallelDims(dp=2, pp=2), schedule="gpipe", microbatches=2))
    for a in answers:
        groups = {s["group"] for s in a["spans"] if s["name"] in ("isend", "irecv")}
        assert groups == {"ranks0-2" if a["rank"] in (0, 2) else "ranks1-3"}


def wrong_group(ctx):
    import torch
    import torch.distributed as dist

    mesh = ctx.mesh_for(ParallelDims(dp=2, tp=2))
    t = torch.ones(1)
    dist.all_reduce(t, group=mesh.group("tp" if ctx.rank == 0 else "dp"))  # rank 0 in the wrong group
    return t.item()


def test_a_collective_on_the_wrong_axis_ends_in_a_report_naming_rank_axis_and_collective(ranks4):
    with pytest.raises(RankTimeout) as err:
        ranks4.run(wrong_group, timeout=4)
    text = str(err.value)
    assert "all_reduce" in text and "axis tp" in text and "axis dp" in text


@pytest.mark.parametrize(
    "plan, words",
    [
        (Plan(ParallelDims(dp=2), sequence_parallel=True), "needs tp > 1"),
        (Plan(ParallelDims(tp=2, pp=2), zero=1), r"ZeRO-1 shards over the dp×cp ranks .* dp·cp=1 in tp2×pp2"),
        (Plan(ParallelDims(tp=4)), r"tp=4 must divide kv_heads=2"),
        (Plan(ParallelDims(dp=3)), "global_batch=8 does not split over dp=3"),
    ],
)
def test_bad_layouts_are_refused_before_any_rank_starts(plan, words):
    with pytest.raises(ValueError, match=words):
        plan.check(DENSE)


@pytest.mark.parametrize(
    "dims", [ParallelDims(dp=2, tp=2, ep=2), ParallelDims(dp=2, pp=2, ep=2), ParallelDims(tp=2, cp=2, ep=2)]
)
def test_moe_with_tp_pp_and_cp_passes_the_check(dims):
    Plan(dims).check(MOE)  # composed and run on ranks in tests/parallel/hybrid/test_hybrid_moe.py


def test_playbook_run_hybrid_on_eight_fresh_ranks(capsys):
    import json

    from playbook.cli import main

    assert main(["run", "hybrid", "--dp", "2", "--tp", "2", "--pp", "2", "--steps", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["world_size"] == 8 and report["layout"]["name"] == "dp2×tp2×pp2"
    assert report["parity"]["within_bounds"] is True and report["parity"]["bounds"] == bounds(TrainSetup(steps=2))
    for row in report["per_rank"]:
        assert row["measured"] == pytest.approx(row["predicted"], rel=1e-12) and set(row["predicted"]) == {
            "dp",
            "tp",
            "pp",
        }


def test_playbook_run_hybrid_refuses_a_bad_layout_in_one_line(capsys):
    from playbook.cli import main

    assert main(["run", "hybrid", "--tp", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tp=4 must divide kv_heads=2" in err[0]
    assert main(["run", "hybrid", "--dp", "2", "--world-size", "4"]) == 2
    assert "--world-size 4 but the degrees dp2 need 2 ranks" in capsys.readouterr().err


def test_summary_reads_as_a_table(ranks4):
    from playbook.parallel.hybrid.run import HybridReport

    setup, plan = DENSE, Plan(ParallelDims(tp=2, cp=2))
    answers = ranks4.run(train_hybrid, setup, plan)
    rows = comm_table(answers, setup, plan)
    report = HybridReport(
        "hybrid",
        4,
        "gloo",
        compare(merge(answers, 2), reference(setup)),
        layout={"name": "tp2×cp2"},
        per_rank=rows,
        losses=[1.0],
    )
    text = report.summary()
    assert "rank 3 (tp1 cp1 dp0 pp0): cp 300,288 / 300,288, tp 329,216 / 329,216" in text
    assert "activations 1,014,400 / 1,014,400" in text  # tp × cp: TP's block with CP's attention core


@pytest.mark.parametrize("n, dims", [(2, ParallelDims(pp=2)), (4, ParallelDims(tp=2, pp=2))], ids=["pp2", "tp2×pp2"])
def test_zb_h1_over_pp_memory_to_the_byte(request, n, dims):
    """ZB-H1 on the mesh's pp axis: without TP a micro-batch keeps only W's part from its B to its W
    (``theory.pp.pipeline.chunk_w_bytes``); with tensor-parallel layers the stage keeps its graph until
    W. Either way parity holds and every rank's activations are measured == predicted (``check``)."""
    check(request.getfixturevalue(f"ranks{n}"), DENSE, Plan(dims, schedule="zb-h1", microbatches=4))
