"""Calibration: the α–β least-squares fit, a real (quick) calibration on 2 ranks, the profile it
writes, the figure, and the step-time prediction's pieces counted by hand on gpt-tiny.

No timing thresholds: measured numbers are only checked to be positive and finite."""

import json
import math

import pytest

from playbook.cli import main
from playbook.config import HARDWARE_DIR, Hardware
from playbook.theory.alpha_beta import fit_collective, fit_points, predict_seconds

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
        (["plan", "--hardware", "/no/such/profile.json"], "no hardware profile file"),
    ],
)
def test_bad_input_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
