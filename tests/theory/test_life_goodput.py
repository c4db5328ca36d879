"""Goodput against the checkpoint interval (``theory.life``): the closed forms by hand, against each
other, against a seeded simulation of failures; the checkpoint's bytes and save time."""

import math

import pytest

from playbook.config import ModelConfig
from playbook.theory.life import (
    LLAMA3_FAILURES_PER_GPU_HOUR,
    best_interval,
    checkpoint_bytes,
    checkpoint_bytes_per_param,
    cluster_mtbf,
    daly_interval,
    goodput,
    goodput_first_order,
    save_seconds,
    simulate,
    young_interval,
)


def test_llama3_rate_and_mtbf_by_hand():
    # 419 interruptions / (54 days · 24 h · 16,384 GPUs)
    assert LLAMA3_FAILURES_PER_GPU_HOUR == pytest.approx(1.97e-5, rel=2e-3)
    # the whole cluster fails 16,384 times as often: 54·24/419 hours between failures
    assert cluster_mtbf(16_384) == pytest.approx(54 * 24 / 419 * 3600)
    assert cluster_mtbf(8, 1e-3) == pytest.approx(3600 / 8e-3)


def test_young_and_daly_by_hand():
    save, mtbf = 2.0, 10_000.0
    assert young_interval(save, mtbf) == pytest.approx(200.0)  # sqrt(2·2·10^4)
    x = save / (2 * mtbf)  # 1e-4
    assert daly_interval(save, mtbf) == pytest.approx(200 * (1 + 0.01 / 3 + 1e-4 / 9) - 2)
    assert daly_interval(30.0, 10.0) == 10.0  # a save longer than 2·MTBF: Daly's fallback
    assert x == 1e-4


def test_goodput_closed_form_by_hand_and_its_limits():
    # no failures in sight: only the saves cost, interval / (interval + save)
    assert goodput(100.0, 5.0, 1e12) == pytest.approx(100 / 105, rel=1e-6)
    tau, save, mtbf, restart = 50.0, 5.0, 400.0, 20.0
    expected = tau / (mtbf * math.exp(restart / mtbf) * (math.exp((tau + save) / mtbf) - 1))
    assert goodput(tau, save, mtbf, restart) == pytest.approx(expected)
    # the first-order form agrees to first order (here save/interval = 0.008: its square is 7e-5)
    assert goodput_first_order(60.0, 0.5, 1e5, 10.0) == pytest.approx(goodput(60.0, 0.5, 1e5, 10.0), abs=1e-4)


def test_daly_is_nearer_the_true_optimum_than_young_and_both_are_near_it():
    for save, mtbf in ((2.84, 11_135.0), (60.0, 3600.0), (300.0, 3600.0)):
        best = best_interval(save, mtbf)
        young, daly = young_interval(save, mtbf), daly_interval(save, mtbf)
        assert abs(daly - best) < abs(young - best)
        assert goodput(best, save, mtbf) >= goodput(daly, save, mtbf) >= goodput(young, save, mtbf) - 1e-12
        assert goodput(young, save, mtbf) > goodput(0.5 * young, save, mtbf)
        assert goodput(young, save, mtbf) > goodput(2 * young, save, mtbf)


@pytest.mark.parametrize(
    "interval, save, mtbf, restart, seed",
    [(20.0, 2.0, 100.0, 5.0, 0), (6.0, 0.5, 20.0, 2.0, 1), (40.0, 10.0, 50.0, 0.0, 2), (200.0, 1.0, 300.0, 30.0, 3), (5.0, 1.0, 20.0, 10.0, 5)],  # last: restarts often hit
)
def test_simulation_agrees_with_the_closed_form_within_four_standard_errors(interval, save, mtbf, restart, seed):
    sim = simulate(interval, save, mtbf, restart, segments=3000, replicas=16, seed=seed)
    predicted = goodput(interval, save, mtbf, restart)
    assert sim.failures > 100  # the regime is one where failures matter
    assert abs(sim.goodput - predicted) < 4 * sim.stderr, (sim.goodput, predicted, sim.stderr)
    assert sim.stderr < 0.02 * predicted


def test_simulation_tells_a_wrong_model_apart():
    # ignoring the restart, or the failures during saves, would be off by many standard errors
    sim = simulate(20.0, 2.0, 100.0, 5.0, segments=3000, replicas=16, seed=4)
    assert abs(sim.goodput - goodput(20.0, 2.0, 100.0, 0.0)) > 10 * sim.stderr
    assert abs(sim.goodput - goodput(20.0, 0.0, 100.0, 5.0)) > 10 * sim.stderr


def test_simulation_is_seeded():
    a, b = simulate(20.0, 2.0, 100.0, 5.0, seed=7), simulate(20.0, 2.0, 100.0, 5.0, seed=7)
    assert a == b
    assert a != simulate(20.0, 2.0, 100.0, 5.0, seed=8)


def test_checkpoint_bytes_405b_by_hand():
    cfg = ModelConfig.preset("llama-3.1-405b")
    n = cfg.num_params()
    assert checkpoint_bytes_per_param("mixed") == 2 + 4 + 4 + 4  # bf16 weights, fp32 master, m, v
    assert checkpoint_bytes_per_param("fp32") == 4 + 4 + 4
    b = checkpoint_bytes(n, n_tensors=cfg.num_param_tensors())
    assert b["weights"] == 2 * n and b["optimizer"] == 12 * n and b["step"] == 4 * cfg.num_param_tensors()
    assert b["total"] == pytest.approx(5.68e12, rel=1e-3)  # 405.85e9 parameters × 14 B
    # 2,048 nodes writing 1 GB/s each: 5.68e12 / 2.048e12 s
    assert save_seconds(b["total"], nodes=2048, storage_bandwidth=1e9) == pytest.approx(b["total"] / 2.048e12)
    assert save_seconds(1e12, nodes=10, storage_bandwidth=1e9, aggregate_bandwidth=5e9) == pytest.approx(200.0)


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: cluster_mtbf(0), "gpus must be a positive integer"),
        (lambda: cluster_mtbf(8, -1.0), "failures per GPU-hour must be a positive number"),
        (lambda: young_interval(0.0, 10.0), "save must be a positive number"),
        (lambda: goodput(10.0, -1.0, 100.0), "save must be a number of seconds at least 0"),
        (lambda: checkpoint_bytes_per_param("bf16"), "precision must be one of"),
        (lambda: save_seconds(1e9, nodes=2, storage_bandwidth=0), "storage bandwidth must be a positive number"),
        (lambda: simulate(1e4, 1.0, 10.0), "would almost never finish"),
    ],
)
def test_bad_input_is_one_clear_line(call, words):
    with pytest.raises(ValueError, match=words):
        call()
