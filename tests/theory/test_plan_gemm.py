"""GEMM efficiency by shape (``theory.cost.gemm_efficiency``): tile and wave quantization by hand, the
roofline, ``playbook calibrate``'s measured curve, and the planner choosing a micro-batch of more than 1."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from playbook.config import DATA_DIR, ModelConfig
from playbook.hardware import Hardware
from playbook.theory.cost.gemm_efficiency import compute_factor, curve_rate, gemm_efficiency, wave_efficiency
from playbook.theory.plan.cost import step_cost
from playbook.theory.plan.planner import plan

H100 = Hardware.preset("h100-sxm")
LLAMA8 = ModelConfig.preset("llama-3.1-8b")
PROFILE = DATA_DIR / "measurements" / "cpu-2core" / "profile.json"


def test_waves_by_hand():
    """132 SMs: 132 tiles of 128² are one full wave; one tile more needs a second, nearly empty one;
    a ragged edge wastes the rest of its tiles (NVIDIA's guide, §3.1-3.2)."""
    assert wave_efficiency(128 * 12, 128 * 11, 132) == 1.0
    assert wave_efficiency(128 * 133, 128, 132) == pytest.approx(133 / 264)
    assert wave_efficiency(100, 128 * 132, 132) == pytest.approx(100 / 128)
    assert H100.sms == 132 and Hardware.preset("a100-80gb").sms == 108


def test_a_thin_gemm_is_memory_bound():
    """128 tokens through a 16,896² weight: one full wave of tiles, but ~126 FLOPs per byte moved,
    below the ~162 at which an H100 at 55 % of peak stops waiting on HBM: the roofline sets the time.
    A single token fills 1/128 of each tile: there the tiles, not the bytes, set it."""
    m, n, k = 128, 128 * 132, 128 * 132
    seconds = 2 * (m * k + k * n + m * n) / H100.memory_bandwidth
    rate = H100.peak_bf16_flops * H100.achievable_flops_fraction
    assert gemm_efficiency(m, n, k, H100) == pytest.approx(2 * m * n * k / rate / seconds)
    assert gemm_efficiency(m, n, k, H100) < 0.8
    assert gemm_efficiency(1, 8192, 8192, H100) == pytest.approx(8192 / (132 * 128 * 128))
    assert gemm_efficiency(128 * 12, 128 * 11, 8192, H100) == 1.0  # one full wave, compute-bound
    assert gemm_efficiency(8192, 8192, 8192, H100) == pytest.approx(4096 / (32 * 132))  # 31.03 waves run as 32
    bare = dataclasses.replace(H100, sms=0)
    assert (
        gemm_efficiency(1, 8192, 8192, bare) == 1.0
        and compute_factor(LLAMA8, bare, tokens=1, tp=8, seq_len=1024) == 1.0
    )


def test_a_micro_batch_of_2_beats_1_and_the_planner_takes_it():
    """8B at 1,024 tokens under tp8: each rank's GEMMs are [b·1024, ≤ 1,792] wide: b = 1 leaves
    waves part empty, a larger b fills them (compute 1.22× the flat rate at b = 1, 1.13× at 2)."""
    factors = [compute_factor(LLAMA8, H100, tokens=b * 1024, tp=8, seq_len=1024) for b in (1, 2, 4, 8)]
    assert factors == sorted(factors, reverse=True) and factors[0] > factors[1] > 1
    assert round(factors[0], 2) == 1.22 and round(factors[1], 2) == 1.13
    lay = dict(dp=1, tp=8, pp=1, cp=1, ep=1, zero=0, recompute="none", seq_len=1024, gpus_per_node=8)
    one, two = (step_cost(LLAMA8, H100, micro_batch=b, microbatches=8 // b, **lay) for b in (1, 2))
    assert two.compute / one.compute == pytest.approx(factors[1] / factors[0]) and two.total < one.total
    flat = dataclasses.replace(H100, sms=0)  # the flat rate: b buys nothing
    a, b = (step_cost(LLAMA8, flat, micro_batch=b, microbatches=8 // b, **lay).compute for b in (1, 2))
    assert a == pytest.approx(b)
    run = dict(gpus=8, seq_len=2048, global_batch=128)  # 8B on one node: the flat rate picks b = 1, shapes b = 4
    assert plan(LLAMA8, flat, **run).candidates[0].layout.micro_batch == 1
    assert plan(LLAMA8, H100, **run).candidates[0].layout.micro_batch == 4


def test_the_calibrated_curve_is_read_where_a_profile_carries_one():
    """A profile written by ``playbook calibrate`` carries its matmul rates by size: a square GEMM of a
    measured size runs at its measured rate (over the profile's large-GEMM rate, peak × achievable =
    its median size's), one between two sizes log-log between them, past the ends at the end's."""
    hw = Hardware.preset(str(PROFILE))
    points = json.loads(PROFILE.read_text())["matmul"]
    assert [p["size"] for p in hw.matmul] == [p["size"] for p in points] and hw.sms == 0
    rate = hw.peak_bf16_flops * hw.achievable_flops_fraction
    (s0, r0), (s1, r1) = [(p["size"], p["flops_per_s"]) for p in points[:2]]
    assert gemm_efficiency(s0, s0, s0, hw) == pytest.approx(r0 / rate)
    mid = math.sqrt(s0 * s1)
    assert gemm_efficiency(int(mid), int(mid), int(mid), hw) == pytest.approx(
        curve_rate(((s0, r0), (s1, r1)), int(mid)) / rate
    )
    assert curve_rate(((s0, r0), (s1, r1)), mid) == pytest.approx(math.sqrt(r0 * r1))
    assert gemm_efficiency(4, 4, 4, hw) == pytest.approx(r0 / rate)  # below the smallest size measured
    tiny = ModelConfig.preset("gpt-small")
    assert compute_factor(tiny, hw, tokens=128, tp=1, seq_len=128) != 1.0
