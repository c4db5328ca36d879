"""Data parallelism on real ranks: every variant against one process on the same global batch,
measured bytes and buckets against the prediction, the CLI report, figures and bad input."""

import json

import pytest
import torch

from playbook.cli import main
from playbook.parallel import TrainSetup, compare, train
from playbook.cluster.trace.spans import measured_comm
from playbook.parallel.dp.ddp import micro_batch
from playbook.parallel.parity import assert_parity
from playbook.parallel.dp.run import on_rank, parity, run_dp
from playbook.parallel.report import rel_l2_diff
from playbook.parallel.dp.scaling import scaling_on_rank, scaling_table
from playbook.parallel.dp.train import DPResult
from playbook.theory.dp.dp import predicted_comm
from playbook.theory.dp.buckets import bucket_cap_bytes, bucket_plan, parameter_shapes
from playbook.viz.dp import bucket_plan_figure, compare_timelines, gantt, scaling_figure
from playbook.viz.dp_dashboard import dp_dashboard

SETUP = TrainSetup(model="gpt-tiny", steps=3, global_batch=8, seq_len=32)
CAP_MB = 0.1
PLAN = bucket_plan(parameter_shapes(SETUP.config()), bucket_cap_bytes(CAP_MB))
PSI = SETUP.config().num_params()


@pytest.fixture(scope="module")
def reference():
    return train(SETUP)


@pytest.fixture(scope="module")
def runs():
    return {}  # (world_size, variant, accumulate) -> results, shared by the tests below


def run(ranks, runs, variant, accumulate=1):
    key = (ranks.world_size, variant, accumulate)
    if key not in runs:
        runs[key] = ranks.run(on_rank, SETUP, variant=variant, bucket_mb=CAP_MB, accumulate=accumulate, progress=False)
    return runs[key]


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("variant", ["naive", "bucketed", "ddp"])
@pytest.mark.parametrize("n", [2, 4])
def test_parity_with_one_process(request, runs, reference, n, variant, accumulate):
    results = run(request.getfixturevalue(f"ranks{n}"), runs, variant, accumulate)
    for r in results:  # every rank ends with the same model as the single process
        # losses of every step, every gradient after the first step, every parameter after the last
        # step as relative L2 per tensor, each within max(1e-5, 3 x the float floor): AdamW turns a
        # gradient element of rounding-noise size (~1e-8, one in ~1e5) into a step of ~lr, a 1e-3
        # single-element difference (max_rel_param_diff, information only); over the whole tensor
        # that is near the float floor, while a bug (a missed bucket, test below) is above 1e-2
        assert_parity(parity(r, reference), SETUP, f"{variant} n={n}")
    assert results[0].losses == results[-1].losses


def train_missing_a_bucket(ctx, setup, skipped):
    """Data parallelism with a bug: the gradients in ``skipped`` are never all-reduced."""
    import torch.distributed as dist

    def sum_but_skipped(model):
        for name, p in model.named_parameters():
            if name not in skipped:
                dist.all_reduce(p.grad, group=ctx.mesh.group("dp"))

    tokens = setup.global_batch * setup.seq_len  # every rank's loss: Σ over its tokens / the global ones
    return train(setup, rank=ctx.rank, world_size=ctx.world_size, sync_grads=sum_but_skipped, global_tokens=tokens)


@pytest.mark.parametrize("n", [2, 4])
def test_tolerances_catch_a_wrong_average_and_a_missed_bucket(request, runs, reference, n):
    """Gradients of Σ / N losses averaged instead of summed (DDP's division left on), and a real run
    that forgets the last bucket, fail the checks above by orders of magnitude."""
    good = run(request.getfixturevalue(f"ranks{n}"), runs, "bucketed")[0]
    averaged = DPResult(good.losses, {k: g / n for k, g in good.grads.items()}, good.params)  # ÷ n once too often
    assert compare(averaged, reference)["max_rel_grad_diff"] == pytest.approx(1 - 1 / n, rel=1e-4)
    missed = request.getfixturevalue(f"ranks{n}").run(train_missing_a_bucket, SETUP, PLAN[-1].names, progress=False)[0]
    p = parity(missed, reference)
    assert p["max_rel_grad_diff"] > 0.05 and p["max_rel_l2_param_diff"] > 1e-2, p


@pytest.mark.parametrize("variant", ["naive", "bucketed", "ddp"])
@pytest.mark.parametrize("n", [2, 4])
def test_measured_bytes_and_calls_equal_the_prediction(request, runs, n, variant):
    results = run(request.getfixturevalue(f"ranks{n}"), runs, variant)
    buffer = 4 * PSI + 4  # every fp32 gradient and the loss
    calls = 21 if variant == "naive" else len(PLAN)  # gpt-tiny has 21 parameter tensors
    by_hand = {"all_reduce": 2 * buffer * (n - 1) / n, "all_reduce buffer": buffer, "all_reduce calls": calls + 1}
    assert predicted_comm(SETUP, world_size=n, variant=variant, cap_bytes=bucket_cap_bytes(CAP_MB)) == pytest.approx(
        by_hand, rel=1e-12
    )
    for r in results:
        assert measured_comm(r, SETUP.steps) == pytest.approx(by_hand, rel=1e-12)


@pytest.mark.parametrize("n", [2, 4])
def test_accumulation_reduces_once_per_step(request, runs, n):
    results = run(request.getfixturevalue(f"ranks{n}"), runs, "bucketed", 2)
    assert measured_comm(results[0], SETUP.steps)["all_reduce calls"] == len(PLAN) + 1
    assert measured_comm(results[0], SETUP.steps)["all_reduce buffer"] == 4 * PSI + 4
    ddp = run(request.getfixturevalue(f"ranks{n}"), runs, "ddp", 2)
    assert measured_comm(ddp[0], SETUP.steps)["all_reduce buffer"] == 4 * PSI + 4


@pytest.mark.parametrize("n", [2, 4])
def test_buckets_follow_the_plan_and_ddp_rebuilds_to_it(request, runs, n):
    ours = run(request.getfixturevalue(f"ranks{n}"), runs, "bucketed")[0]
    ddp = run(request.getfixturevalue(f"ranks{n}"), runs, "ddp")[0]
    planned = [list(b.names) for b in PLAN]
    assert ours.buckets == planned
    assert ddp.buckets == planned  # after DDP rebuilt its buckets from the order gradients arrived
    names = sorted(n for n, _ in parameter_shapes(SETUP.config()))
    assert sorted(x for b in ddp.first_buckets for x in b) == names  # step 0: every parameter once
    sizes = [s["bytes"] for s in ours.spans if s["kind"] == "comm" and s["bytes"] > 4][: len(PLAN)]
    assert sizes == [b.bytes for b in PLAN]


@pytest.mark.parametrize("n", [2, 4])
def test_bucketed_starts_all_reduces_inside_backward_and_naive_after_it(request, runs, n):
    """Overlap as an order of events, not a timing: in every step, the first bucket's all-reduce is
    issued before that rank's backward ends; every naive all-reduce after it."""
    for variant, inside in (("bucketed", True), ("naive", False)):
        for r in run(request.getfixturevalue(f"ranks{n}"), runs, variant):
            for a, b in r.windows:
                spans = [s for s in r.spans if a <= s["start"] <= b]
                backward_end = max(s["end"] for s in spans if s["name"] == "backward")
                first = min(s["start"] for s in spans if s["kind"] == "comm")
                assert (first < backward_end) is inside, variant


def test_our_bucketed_matches_ddp(ranks2, runs):
    ours, ddp = run(ranks2, runs, "bucketed")[0], run(ranks2, runs, "ddp")[0]
    assert_parity(parity(ours, ddp), SETUP, "ours against DDP")  # two float32 runs of the same sums


def test_scaling_rows_on_subgroups(ranks4):
    strong = ranks4.run(
        scaling_on_rank, TrainSetup(steps=2, global_batch=8, seq_len=16), sizes=(1, 2, 4), progress=False
    )
    weak = ranks4.run(
        scaling_on_rank, TrainSetup(steps=2, global_batch=2, seq_len=16), sizes=(1, 4), weak=True, progress=False
    )
    assert strong[1:] == [[], [], []] and [r["per_rank_batch"] for r in strong[0]] == [8, 4, 2]
    assert [r["global_batch"] for r in weak[0]] == [2, 8]
    assert all(r["step_s"] > 0 and 0 < r["compute_s"] <= r["step_s"] for r in strong[0] + weak[0])


def test_scaling_table_by_hand():
    rows = [
        {"ranks": 1, "global_batch": 8, "step_s": 1.0, "compute_s": 0.8},
        {"ranks": 4, "global_batch": 8, "step_s": 0.5, "compute_s": 0.2},
    ]
    strong = scaling_table(rows, seq_len=10)
    assert strong[1]["speedup"] == 2.0 and strong[1]["efficiency"] == 0.5 and strong[1]["tokens_per_s"] == 160
    weak_rows = [{**rows[0]}, {"ranks": 4, "global_batch": 32, "step_s": 1.25, "compute_s": 1.0}]
    weak = scaling_table(weak_rows, seq_len=10, weak=True)
    assert (
        weak[1]["efficiency"] == 0.8 and weak[1]["speedup"] == pytest.approx(3.2) and weak[1]["compute_vs_base"] == 1.25
    )
    fig = scaling_figure(strong, weak, cores=2)
    assert [t.name for t in fig.data].count("measured") == 2


def test_chapter1_ninety_percent_efficiency_and_its_denominator():
    # strong: speedup over the baseline / (ranks / baseline ranks); weak: T1 / Tn (chapter 1, §7)
    def row(ranks, batch, step_s):
        return dict(ranks=ranks, global_batch=batch, step_s=step_s, compute_s=step_s)

    one = scaling_table([row(1, 64, 1.0), row(8, 64, 1 / 7.2)], seq_len=1)[1]
    node = scaling_table([row(8, 512, 1.0), row(64, 512, 1 / 7.2)], seq_len=1)[1]
    weak = scaling_table([row(1, 8, 1.0), row(8, 64, 1 / 0.9)], seq_len=1, weak=True)[1]
    assert one["speedup"] == node["speedup"] == pytest.approx(7.2)
    assert one["efficiency"] == node["efficiency"] == weak["efficiency"] == pytest.approx(0.9)
    assert node["efficiency"] != pytest.approx(node["speedup"] / 64)  # not over all 64 ranks


def test_relative_l2_ignores_one_noisy_element_but_not_a_shifted_tensor():
    w = {"w": torch.ones(10_000)}
    one = {"w": w["w"].clone()}
    one["w"][0] += 3e-3  # one element, a learning rate away (AdamW on a gradient of ~1e-8)
    assert rel_l2_diff(one, w) == pytest.approx(3e-5, rel=1e-3)
    assert rel_l2_diff({"w": w["w"] + 3e-3}, w) == pytest.approx(3e-3, rel=1e-3)


# ---- figures ---------------------------------------------------------------------------------------
def test_timeline_figure_rows_and_spans(ranks2, runs):
    naive, bucketed = run(ranks2, runs, "naive"), run(ranks2, runs, "bucketed")
    fig = compare_timelines({"naive": naive, "bucketed": bucketed})
    rows = {y for t in fig.data for y in t.y}
    assert rows == {"naive · rank 0", "naive · rank 1", "bucketed · rank 0", "bucketed · rank 1"}
    comm = [t for t in fig.data if t.name.startswith("all-reduce")][0]
    # last step: naive issues 21 + 1 all-reduces per rank, bucketed 4 + 1
    assert list(comm.y).count("naive · rank 0") == 22 and list(comm.y).count("bucketed · rank 1") == len(PLAN) + 1
    assert min(comm.base) >= 0 and all(x >= 0 for x in comm.x)


def test_bucket_plan_figure_shows_planned_and_measured(ranks2, runs):
    ours = run(ranks2, runs, "bucketed")[0]
    fig = bucket_plan_figure(PLAN, bucket_cap_bytes(CAP_MB), measured=ours.buckets)
    planned, measured = fig.data
    assert list(planned.y) == list(measured.y) == [b.bytes for b in PLAN] and sum(planned.y) == 4 * PSI


def test_gantt_draws_a_prediction():
    fig = gantt(
        {
            "a": [
                {"kind": "compute", "name": "forward", "start": 0.0, "end": 0.002},
                {"kind": "comm", "name": "all_reduce", "start": 0.001, "end": 0.003, "bytes": 10},
            ]
        }
    )
    assert {t.name: (list(t.base), list(t.x)) for t in fig.data} == {
        "forward": ([0.0], [2.0]),
        "all-reduce (comm)": ([1.0], [pytest.approx(2.0)]),
    }


def test_dashboard_recomputes_on_a_control_change():
    box = dp_dashboard(
        model="gpt-tiny",
        hardware="a100-80gb",
        world_size=4,
        bucket_mb=0.1,
        seq_len=64,
        tokens_per_rank=512,
        grad_dtype="fp32",
    )
    before = [list(t.x) for t in box.figure.data]
    assert "4 buckets" in box.message.value
    box.controls["world_size"].value = 16  # beyond one node: the network's bandwidth
    assert [list(t.x) for t in box.figure.data] != before
    box.controls["bucket_mb"].value = 1000
    assert "1 bucket," in box.message.value


# ---- the command line and bad input ---------------------------------------------------------------
def test_cli_reports_parity_against_reference_and_ddp(capsys):
    code = main(["run", "dp", "--world-size", "2", "--variant", "bucketed", "--steps", "2", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["strategy"] == "dp" and report["setup"]["variant"] == "bucketed"
    assert report["parity"]["within_bounds"] is True
    assert report["native"]["max_rel_grad_diff"] <= report["parity"]["bounds"]["max_rel_grad_diff"]
    assert (
        report["native"]["reference"].startswith("DistributedDataParallel") and report["native"]["step_time_ratio"] > 0
    )
    assert report["comm"]["measured"] == report["comm"]["predicted"]
    for k in ("params", "grads", "optimizer", "activations"):
        assert report["memory"]["measured"][k] == report["memory"]["predicted"][k], k
    assert report["memory"]["measured"]["comm_buffers"] == 4 * PSI  # our flat buckets: one more copy of the gradients


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--world-size", "3"],
            "global_batch=8 does not split evenly over world_size=3 ranks; use world_size in {1, 2, 4, 8}",
        ),
        (["--world-size", "2", "--accumulate", "3"], "try accumulate in {1, 2, 4}"),
        (["--world-size", "2", "--bucket-mb", "0"], "--bucket-mb must be greater than 0 and at most 4096, got 0"),
        (["--world-size", "2", "--bucket-mb", "-1"], "--bucket-mb must be greater than 0 and at most 4096, got -1"),
        (
            ["--world-size", "2", "--variant", "ddp", "--accumulate", "0"],
            "--accumulate must be between 1 and 1024, got 0",
        ),
    ],
)
def test_bad_input_gets_one_clear_line(capsys, argv, message):
    code = main(["run", "dp", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_bad_variant_and_micro_batch():
    with pytest.raises(ValueError, match="variant must be one of naive, bucketed, ddp"):
        run_dp(SETUP, world_size=2, variant="allgather")
    assert micro_batch(SETUP, 2, 2) == 2
