"""Issue 48, the sweep's hangs at the edges of ``plan``: a 10,000-layer model on 1,000,000 GPUs and
a hardware file with an absurd value are bounded or refused in one line before the search starts.

What hung: the pipeline's per-rank arithmetic rebuilt the p·v stage ranges for each of p ranks (p²),
the search's divisors tried every k up to n, and a model of 10,000 MoE layers made every rank's
unit list millions long (8 GB, minutes). Each check here finishes in seconds; a hang is a
subprocess killed at its timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from playbook.cli import main

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "data" / "hf"


def one_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("playbook: error: ") and "\n" not in err, err
    return err


def _quick(code: str, timeout: float = 30) -> str:
    """Run ``code`` in a fresh Python; a hang fails as a timeout, not a stuck suite."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s: {code}")
    assert done.returncode == 0, done.stderr
    return done.stdout


def _deep(tmp_path, name: str, layers: int) -> Path:
    raw = json.loads((HF / name).read_text()) | {"num_hidden_layers": layers}
    path = tmp_path / f"deep-{name}"
    path.write_text(json.dumps(raw))
    return path


def test_a_deep_pipeline_s_ranks_cost_one_pass_each(tmp_path):
    """10,000 layers over pp = 10,000 ranks: each rank's chunks, FLOPs and the stage layer ranges are
    one pass over the stages (were p² for even ends, p²·v² for light ones: minutes)."""
    path = _deep(tmp_path, "Llama-3.1-8B.json", 10_000)
    out = _quick(
        "from playbook.config import ModelConfig\n"
        "from playbook.theory.plan.memory import rank_chunks\n"
        "from playbook.theory.plan.stage_balance import rank_flops_per_token\n"
        "from playbook.theory.hybrid.stages import stage_layers\n"
        f"cfg = ModelConfig.from_hf_config({str(path)!r})\n"
        "flops = rank_flops_per_token(cfg, 8192, 10_000)\n"
        "light = [rank_chunks(cfg, 5_000, r, 'interleaved', 2, 'light') for r in range(5_000)]\n"
        "ranges = stage_layers(10_000, 10_000)\n"
        "print(len(flops), sum(n for c in light for _, n, _, _ in c), ranges[-1])"
    )
    # every rank one layer; the light ends' 10,002 slots less the two taken back hold every layer once
    assert out.split() == ["10000", "10000", "range(9999,", "10000)"]


def test_the_search_s_divisors_are_quick():
    out = _quick("from playbook.theory.plan.search import divisors\nprint(divisors(2**40)[-1], divisors(360, 10))")
    assert out.strip() == f"{2**40} [1, 2, 3, 4, 5, 6, 8, 9, 10]"  # 2**20 trials, not 2**40


def test_a_search_over_millions_of_expert_units_is_refused_before_it_starts(tmp_path, capsys):
    """DeepSeek-V3 at 10,000 layers: 9,997 MoE layers × 256 routed experts, each a unit the planner
    sizes on every rank of every layout. The refusal names the count, the bound, the published
    model's count and what does plan: the layers that fit under it, or one layout."""
    from playbook.theory.plan.search import MAX_UNITS

    path = _deep(tmp_path, "DeepSeek-V3.json", 10_000)
    units = 10_000 + (10_000 - 3) * 256  # first_k_dense_replace = 3 dense layers
    err = one_line(capsys, ["plan", "--hf-config", str(path), "--gpus", "1000000", "--global-batch", "1000000"])
    assert f"{units:,} units" in err and f"at most {MAX_UNITS:,}" in err, err
    assert f"DeepSeek-V3 has {61 + 58 * 256:,}" in err, err  # 14,909, as the message says
    most = (MAX_UNITS + 3 * 256) // 257  # L + (L − 3)·256 <= MAX_UNITS
    assert f"num_hidden_layers {most}" in err and "--layout" in err, err


def test_the_layers_the_refusal_names_do_plan():
    from playbook.config import ModelConfig
    from playbook.theory.plan.search import MAX_UNITS, check_search_size, planned_units

    raw = json.loads((HF / "DeepSeek-V3.json").read_text())
    most = (MAX_UNITS + 3 * 256) // 257
    check_search_size(ModelConfig.from_hf_config(raw | {"num_hidden_layers": most}))  # no refusal
    assert planned_units(ModelConfig.from_hf_config(raw | {"num_hidden_layers": most + 1})) > MAX_UNITS
    assert planned_units(ModelConfig.from_hf_config(raw)) == 61 + 58 * 256


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"memory_bytes": 1e30}, "memory_bytes must be a number greater than 0 and at most 1e+15, got 1e+30"),
        ({"devices_per_node": 10**9}, "devices_per_node must be a positive integer at most 1,024, got 1000000000"),
        ({"peak_bf16_flops": 1e40}, "peak_bf16_flops must be a number greater than 0 and at most 1e+18, got 1e+40"),
    ],
)
def test_an_absurd_hardware_value_is_refused_before_the_search(tmp_path, capsys, change, expected):
    raw = json.loads((ROOT / "data" / "hardware" / "h100-sxm.json").read_text()) | change
    path = tmp_path / "absurd.json"
    path.write_text(json.dumps(raw))
    err = one_line(capsys, ["plan", "--model", "llama-3.1-405b", "--gpus", "1000000", "--hardware", str(path)])
    assert expected in err, err


def test_the_one_layout_the_refusal_offers_is_costed(tmp_path, capsys):
    """``--layout`` on the same model: costed (memory, step, MFU), and said to be unranked, not searched."""
    path = _deep(tmp_path, "DeepSeek-V3.json", 10_000)
    layout = "dp=100 tp=8 pp=1250 ep=100 zero=1 b=1 m=10000"
    argv = ["plan", "--hf-config", str(path), "--gpus", "1000000", "--global-batch", "1000000", "--layout", layout]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "memory/GPU:" in out and "step:" in out and "not ranked against a search (2,569,232 units" in out, out
