"""``playbook plan``'s run-life numbers (``cli.plan_life``): checkpoint, save, MTBF, Young's and
Daly's interval and goodput, each recomputed here by hand from the model, the profile and the flags."""

from __future__ import annotations

import json
import math

import pytest

from playbook.cli import main
from playbook.config import ModelConfig
from playbook.hardware import Hardware

LAYOUT_405B = ["--model", "llama-3.1-405b", "--gpus", "16384", "--seq-len", "8192", "--global-batch", "2048"]
LAYOUT_405B += ["--layout", "dp=128 tp=8 pp=16 schedule=interleaved v=8 zero=1 recompute=full"]


def _json(capsys, argv) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_405b_on_16384_gpus_by_hand(capsys):
    life = _json(capsys, ["plan", *LAYOUT_405B, "--restart-s", "600"])["life"]
    cfg, hw = ModelConfig.preset("llama-3.1-405b"), Hardware.preset("h100-sxm")
    total = 14 * cfg.num_params() + 4 * cfg.num_param_tensors()  # bf16 + fp32 master + m + v; a step per tensor
    assert life["checkpoint_bytes"] == pytest.approx(total) and total == pytest.approx(5.68e12, rel=1e-3)
    save = total / (16384 / 8 * hw.storage_bandwidth)
    assert life["save_s"] == pytest.approx(save)
    mtbf = 54 * 24 * 3600 / 419  # Llama 3: 419 interruptions in 54 days, on these 16,384 GPUs
    assert life["mtbf_s"] == pytest.approx(mtbf)
    assert life["young_s"] == pytest.approx(math.sqrt(2 * save * mtbf))
    assert life["young_s"] - life["daly_s"] == pytest.approx(save - math.sqrt(2 * save * mtbf) * (
        math.sqrt(save / (2 * mtbf)) / 3 + save / (18 * mtbf)), rel=1e-6)
    tau = life["daly_s"]
    by_hand = tau / (mtbf * math.exp(600 / mtbf) * (math.exp((tau + save) / mtbf) - 1))
    assert life["goodput_daly"] == pytest.approx(by_hand) and 0.9 < by_hand < 0.95


def test_the_flags_move_the_numbers(capsys):
    base = _json(capsys, ["plan", *LAYOUT_405B])["life"]
    worse = _json(capsys, ["plan", *LAYOUT_405B, "--failures-per-gpu-hour", "4e-5", "--restart-s", "1200"])["life"]
    assert worse["mtbf_s"] == pytest.approx(base["mtbf_s"] * base["failures_per_gpu_hour"] / 4e-5)
    assert worse["young_s"] < base["young_s"] and worse["goodput_daly"] < base["goodput_daly"]


def test_text_output_has_the_life_lines(capsys):
    assert main(["plan", *LAYOUT_405B]) == 0
    out = capsys.readouterr().out
    assert "checkpoint: 5.68 TB" in out and "MTBF 3.09 h" in out and "(Young)" in out and "(Daly)" in out
    assert main(["plan", "--model", "llama-3.1-8b", "--gpus", "16", "--global-batch", "64", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint:" in out and "goodput" in out and "steps of" in out


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--restart-s", "-1"], "--restart-s must be a number of seconds at least 0"),
        (["--failures-per-gpu-hour", "0"], "--failures-per-gpu-hour must be greater than 0"),
        (["--failures-per-gpu-hour", "nan"], "--failures-per-gpu-hour must be a finite number"),
    ],
)
def test_bad_life_flags_are_one_line(capsys, flags, words):
    assert main(["plan", "--model", "llama-3.1-8b", "--gpus", "16", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("playbook: error: ") and "\n" not in err and words in err, err
