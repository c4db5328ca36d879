"""Calibration: the α–β least-squares fit, a real (quick) calibration on 2 ranks, the profile it
writes, the figure, and the step-time prediction's pieces counted by hand on gpt-tiny.

No timing thresholds: measured numbers are only checked to be positive and finite."""

import json
import math

import pytest

from playbook.cli import main
from playbook.hardware import HARDWARE_DIR, Hardware
from playbook.theory.cost.alpha_beta import fit_collective, fit_points, predict_seconds

# ---- the fit (pure math: synthetic points are fine, it is the fit under test) -------------------


@pytest.mark.parametrize("op, n", [("all_reduce", 4), ("all_gather", 2), ("all_to_all", 3), ("send", 2)])
def test_fit_recovers_known_alpha_beta(op, n):
    alpha, beta = 30e-6, 1 / 2e9  # 30 µs per step, 2 GB/s
    sizes = [2.0**k for k in range(10, 24, 2)]
    # time from first principles: ring steps of the op, bytes each rank sends (theory.comm's counts)
    steps = {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "all_to_all": n - 1, "send": 1}[op]
    share = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "all_to_all": (n - 1) / n, "send": 1}[op]
    times = [steps * alpha + share * s * beta for s in sizes]
    fit = fit_collective(op, n, sizes, times)
    assert fit.alpha == pytest.approx(alpha, rel=1e-9)
    assert fit.beta == pytest.approx(beta, rel=1e-9)
    assert fit.rms_rel_residual < 1e-9 and fit.pinned == ""
    assert predict_seconds(fit, op, 1e6, n, calls=3) == pytest.approx(3 * (steps * alpha + share * 1e6 * beta))


def test_fit_with_noise_stays_close_and_weighs_sizes_alike():
    alpha, beta = 100e-6, 1e-9
    wire = [1e3, 1e4, 1e5, 1e6, 1e7]
    noise = [1.02, 0.98, 1.02, 0.98, 1.04]  # a few % multiplicative, as timing noise is
    times = [(alpha + w * beta) * k for w, k in zip(wire, noise)]
    fit = fit_points([1] * 5, wire, times)
    # relative weighting keeps the small sizes' say: plain least squares on seconds lets the 4% on
    # the largest point (0.4 ms) move α by 15%
    assert fit.alpha == pytest.approx(alpha, rel=0.05)
    assert fit.beta == pytest.approx(beta, rel=0.05)


def test_fit_is_non_negative_and_refuses_one_size():
    # times that fall with size would need a negative β: pinned to 0, α refitted alone
    fit = fit_points([1, 1, 1], [1e3, 1e5, 1e7], [3e-4, 2e-4, 1e-4])
    assert fit.beta == 0 and fit.pinned == "beta" and fit.alpha > 0
    with pytest.raises(ValueError, match="two different message sizes"):
        fit_points([1, 1], [1e3, 1e3], [1e-4, 1e-4])
    with pytest.raises(ValueError, match="positive finite"):
        fit_points([1, 1], [1e3, 1e4], [1e-4, 0.0])


# ---- a real calibration on 2 ranks ---------------------------------------------------------------


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "here.json"
    assert main(["calibrate", "--ranks", "2", "--quick", "--out", str(path)]) == 0
    return path


@pytest.mark.ranks
def test_quick_calibration_writes_a_profile_hardware_loads(profile_path):
    hw = Hardware.preset(str(profile_path))
    assert hw.name == "here" and hw.devices_per_node == 2
    assert set(hw.collectives) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send"}
    for op, f in hw.collectives.items():
        assert math.isfinite(f["alpha"]) and f["alpha"] > 0, op
        assert math.isfinite(f["beta"]) and f["beta"] > 0, op
        assert len(f["points"]) >= 3
    assert hw.intra_node_bandwidth == pytest.approx(1 / hw.collectives["all_reduce"]["beta"])
    assert hw.peak_bf16_flops > 0 and 0 < hw.achievable_flops_fraction <= 1
    assert len(hw.load_average["before"]) == 3 and hw.date.startswith("20")
    raw = json.loads(profile_path.read_text())  # the datasheet profiles' keys, all present
    datasheet = json.loads(HARDWARE_DIR.joinpath("cpu-laptop.json").read_text())
    assert set(datasheet) <= set(raw)
    import os
    import platform

    assert (raw["host"], raw["cpus"]) == (platform.node(), os.cpu_count())  # what the label reads
    from playbook.viz.calibrate import measured_where

    assert measured_where(raw).endswith("a machine of this one's name and CPU count")


@pytest.mark.ranks
def test_calibration_figure_has_points_fit_and_residuals(profile_path):
    from playbook.viz.calibrate import calibration_figure, fit_rows

    profile = json.loads(profile_path.read_text())
    fig = calibration_figure(profile)
    assert len(fig.data) == 3 * 5  # per collective: measured, fitted line, residuals
    rows = fit_rows(profile)
    for r in rows:  # the residual is the measured point against the fit's own formula
        assert r["residual"] == pytest.approx((r["measured"] - r["fitted"]) / r["fitted"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["calibrate", "--ranks", "1"], "--ranks must be between 2 and"),
        (["calibrate", "--ranks", "64"], "--ranks must be between 2 and"),
        (["calibrate", "--out", "profile.txt"], "--out must name a .json file"),
        (["calibrate", "--out", "/no/such/dir/p.json"], "does not exist"),
        (["plan", "--model", "gpt-tiny", "--hardware", "/no/such/profile.json"], "no hardware profile file"),
    ],
)
def test_bad_input_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


# ---- the step-time prediction, piece by piece, by hand on gpt-tiny --------------------------------


def _profile(**fits) -> Hardware:
    return Hardware(
        name="hand",
        memory_bytes=1e9,
        peak_bf16_flops=100e9,
        memory_bandwidth=1e10,
        intra_node_bandwidth=1e9,
        inter_node_bandwidth=1e8,
        devices_per_node=2,
        achievable_flops_fraction=0.5,
        collectives={op: {"alpha": a, "beta": b} for op, (a, b) in fits.items()},
    )


def test_step_prediction_by_hand_on_gpt_tiny():
    from playbook.config import ModelConfig
    from playbook.theory.plan.step_time import Comm, predict_step

    cfg = ModelConfig.preset("gpt-tiny")  # h 64, 2 layers, 4 heads (2 kv) of 16, ffn 176, vocab 64, untied
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 176 + 2 * 64  # q, k+v, o, SwiGLU, 2 norms
    n = 2 * per_layer + 64 + 64 * 64  # + final norm + head (the input embedding is a lookup)
    per_token = 6 * n + 12 * 2 * 4 * 16 * 32  # PaLM: 6N + 12·L·H·Q·T at T = 32
    flops = 8 * 32 * per_token / 2  # global batch 8 × 32 tokens over 2 ranks
    hw = _profile(all_reduce=(50e-6, 1e-9), send=(20e-6, 2e-9))
    loads = [Comm("all_reduce", 2, 3, 1e6), Comm("isend", 2, 4, 65536), Comm("irecv", 2, 4, 0)]
    p = predict_step(cfg, hw, global_batch=8, seq_len=32, world_size=2, comm=loads, pp=2, microbatches=4)
    assert p.flops_per_rank == pytest.approx(flops)
    assert p.compute == pytest.approx(flops / 50e9)  # 100 GFLOP/s × 0.5 achievable
    # all-reduce: 3 calls × 2(n−1) ring steps × α + bytes × β; a send pays once, its receive not at all
    assert p.comm == pytest.approx(3 * 2 * 50e-6 + 1e6 * 1e-9 + 4 * 1 * 20e-6 + 65536 * 2e-9)
    assert p.bubble == pytest.approx((2 - 1) / 4 * p.compute)  # 1F1B: (p − 1)/m of the ideal
    assert p.total == pytest.approx(p.compute + p.comm + p.bubble)


def test_datasheet_profile_without_fits_uses_its_link_numbers():
    from playbook.theory.plan.step_time import Comm, comm_seconds

    hw = Hardware.preset("cpu-laptop")
    got = comm_seconds(hw, Comm("all_gather_single", 4, 2, 3e6))
    assert got == pytest.approx(2 * 3 * hw.intra_node_latency + 3e6 / hw.intra_node_bandwidth)


def test_pp_send_bytes_by_hand():
    from playbook.parallel.pp.run import predict
    from playbook.parallel.training import TrainSetup

    # 1F1B on 2 stages, 4 micro-batches: stage 0 sends each micro-batch's activation forward once,
    # [8/4 rows, 32, 64] fp32 (gpt-tiny is untied: no embedding gradient to send)
    setup = TrainSetup(model="gpt-tiny", global_batch=8, seq_len=32)
    assert not setup.config().tie_embeddings and setup.config().hidden == 64
    assert predict(setup, world_size=2, schedule="1f1b", m=4) == {"isend": 4 * (2 * 32 * 64 * 4)}


def test_traced_loads_count_calls_per_step_and_overlap_once():
    from playbook.parallel.step_time import step_windows, traced_loads

    def comm(name, start, end, sent, rank=0):
        return dict(rank=rank, kind="comm", name=name, start=start, end=end, sent_bytes=sent, group_size=2)

    spans = [
        dict(rank=0, kind="compute", name="step 0", start=0.0, end=1.0),  # warm-up: left out
        dict(rank=0, kind="compute", name="step 1", start=1.0, end=2.0),
        dict(rank=0, kind="compute", name="step 2", start=2.0, end=3.0),
        comm("all_reduce", 0.5, 0.6, 100),
        comm("all_reduce", 1.1, 1.4, 100),
        comm("all_reduce", 1.2, 1.3, 100),  # inside the one above: counted once in time
        comm("all_gather_single", 2.1, 2.2, 50),
        comm("irecv", 2.3, 2.9, 0),  # a receive: its send pays
        comm("all_reduce", 2.5, 2.6, 100, rank=1),  # another rank
    ]
    windows = step_windows(spans, warmup=1)
    loads, busy = traced_loads(spans, windows)
    assert sorted(windows) == [1, 2]
    assert loads["all_reduce"]["calls"] == 1 and loads["all_reduce"]["sent_bytes"] == 100
    assert loads["all_gather"]["calls"] == 0.5 and "irecv" not in loads and None not in loads
    assert busy == pytest.approx((0.3 + 0.1) / 2)


def test_measured_step_on_real_ranks_uses_the_bytes_theory_predicts(ranks2):
    from playbook.parallel.step_time import measure_case
    from playbook.parallel.training import TrainSetup

    hw = _profile(all_reduce=(50e-6, 1e-9), reduce_scatter=(50e-6, 1e-9), all_gather=(50e-6, 1e-9))
    setup = TrainSetup(steps=2)
    for label in ("DP", "ZeRO-3"):
        row = measure_case(ranks2, label, setup, hw, warmup=1, alone=0.01)
        assert row["bytes_from"] == "theory" and math.isfinite(row["error"]) and row["measured_ms"] > 0
        for op, sent in row["traced_bytes"].items():  # the loss all-reduce sits outside the step spans
            assert sent == pytest.approx(row["predicted_bytes"][op] - (4 if op == "all_reduce" else 0))


def test_reason_reads_the_measurements(monkeypatch):
    from playbook.parallel import step_time

    monkeypatch.setattr(step_time.os, "cpu_count", lambda: 2)
    pred = {"compute": 0.010, "comm": 0.002, "bubble": 0.0, "total": 0.012}
    assert step_time.reason(4, pred, 0.5, 0.1).startswith("OS scheduling: 4 ranks")
    assert step_time.reason(2, pred, 0.011, 0.010).startswith("faster than predicted")
    # one rank alone is near its share; the run is far beyond it: communication is the gap
    assert step_time.reason(2, pred, 0.100, 0.012) == "gloo per call / waiting: 88 ms over 1 rank alone vs 2 ms fitted"


def test_compute_is_predicted_at_the_rate_one_rank_reached_alone():
    from playbook.parallel.step_time import model_rate
    from playbook.parallel.training import TrainSetup
    from playbook.theory.cost.flops import step_flops
    from playbook.theory.plan.step_time import predict_step

    setup = TrainSetup(model="gpt-tiny", global_batch=8, seq_len=32)
    cfg, hw = setup.config(), Hardware.preset("cpu-laptop")
    rate = model_rate(setup, 2, alone=0.05)  # half the batch took 50 ms alone
    assert rate == pytest.approx(step_flops(cfg, tokens=8 * 32, seq_len=32) / 2 / 0.05)
    pred = predict_step(cfg, hw, global_batch=8, seq_len=32, world_size=2, flops_per_s=rate)
    assert pred.compute == pytest.approx(0.05)  # the same share on each of 2 ranks: the time alone
    matmul = predict_step(cfg, hw, global_batch=8, seq_len=32, world_size=2)
    assert matmul.flops_per_s == hw.peak_bf16_flops * hw.achievable_flops_fraction


def test_cases_a_model_cannot_run_are_named_not_started():
    from playbook.parallel.step_time import not_runnable
    from playbook.parallel.training import TrainSetup

    tiny = TrainSetup()  # gpt-tiny: 2 KV heads, 2 layers
    assert "n_kv_heads=2" in not_runnable("TP", tiny, 4)
    assert "2 layers cannot fill 4 stages" in not_runnable("PP (1f1b)", tiny, 4)
    assert not_runnable("TP", tiny, 2) == "" and not_runnable("hybrid dp2×tp2", tiny, 4) == ""


def test_the_shipped_measurements_load_and_add_up():
    """data/measurements/cpu-2core: the profile loads as hardware, and every step-time row's prediction
    is its parts and its error is against its own measurement (a hand-edited row would not add up)."""
    folder = HARDWARE_DIR.parent / "measurements" / "cpu-2core"
    hw = Hardware.preset(str(folder / "profile.json"))
    assert set(hw.collectives) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send"}
    rows = json.loads((folder / "step-time.json").read_text())
    assert {r["strategy"] for r in rows} >= {"DP", "ZeRO-1", "ZeRO-3", "TP", "PP (1f1b)", "CP (ring)", "EP"}
    for r in rows:
        assert r["predicted_ms"] == pytest.approx(r["compute_ms"] + r["comm_ms"] + r["bubble_ms"])
        assert r["error"] == pytest.approx((r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"])
        assert r["load"] > 0 and r["ranks"] in (2, 4)
