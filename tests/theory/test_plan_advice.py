"""The planner on imported configs and on bad input: `playbook plan --hf-config`, and one line with
what would work when the batch splits over no dp, no layout can be planned, or nothing fits.

The suggestions are checked two ways: by hand where the arithmetic is short, and by running the
planner on what they suggest (it must then plan) and on one step short of it (it must not).
"""

from __future__ import annotations

import json
import re

import pytest

from playbook.cli import main
from playbook.config import DATA_DIR, ModelConfig
from playbook.hardware import Hardware
from playbook.theory.plan.planner import plan

H100 = Hardware.preset("h100-sxm")  # 80 GB, 8 per node
TINY = ModelConfig.preset("gpt-tiny")  # 2 layers, 4 heads, 2 KV heads, vocab 64


def test_batch_that_splits_over_no_dp():
    # 6 GPUs of one node: tp, cp and pp are powers of two, so tp·cp·pp is 1 or 2 and dp is 6 or 3;
    # a batch of 8 splits over neither, and the multiples of 3 around it (6, 9) do
    with pytest.raises(ValueError) as err:
        plan(TINY, H100, gpus=6, seq_len=32, global_batch=8)
    assert str(err.value) == (
        "global batch 8 does not split over any dp of 6 GPUs (dp can be 3, 6); use a multiple of 3, "
        "e.g. --global-batch 6 or 9"
    )
    assert all(c.layout.dp == 3 for c in plan(TINY, H100, gpus=6, seq_len=32, global_batch=9).candidates)


def test_batch_no_layout_plans_names_the_smallest_that_does():
    # gpt-tiny on 8 GPUs at 2 tokens: tp, cp, pp are each at most 2 (2 KV heads, 2 tokens, 2 layers),
    # and tp2 with cp2 leaves 1 token per rank, which sequence parallelism cannot split over tp=2.
    # Batch 1: dp1 needs tp2·cp2·pp2. Batch 2: dp2 leaves m=1 < pp=2 for tp2·pp2 and cp2·pp2, dp1
    # needs tp2·cp2 again. Batch 4: dp4 × tp2 (or × cp2), and dp2 × tp2 × pp2 with m=2, plan.
    with pytest.raises(ValueError) as err:
        plan(TINY, H100, gpus=8, seq_len=2, global_batch=1)
    message = str(err.value)
    assert message.startswith("no layout of 8 GPUs can be planned for gpt-tiny with global batch 1")
    assert "pipeline not filled" in message and message.endswith("--global-batch 4 would give layouts")
    with pytest.raises(ValueError, match="no layout of 8 GPUs can be planned"):
        plan(TINY, H100, gpus=8, seq_len=2, global_batch=2)
    assert plan(TINY, H100, gpus=8, seq_len=2, global_batch=4).candidates


def test_nothing_fits_names_the_gpus_from_first_principles():
    # Llama-3.1-405B in mixed precision keeps 16 bytes per parameter (bf16 weights and gradients, fp32
    # master and two AdamW moments); spread over every GPU (ZeRO-3 and tp together) it needs
    # 16 · 405,853,388,800 / (0.9 · 80e9) = 90.2 GPUs at least: of 8, 16, ... 128 is the first to fit.
    cfg = ModelConfig.preset("llama-3.1-405b")
    assert 64 < 16 * cfg.num_params() / (0.9 * 80e9) < 128
    with pytest.raises(ValueError) as err:
        plan(cfg, H100, gpus=8, seq_len=4096, global_batch=8)
    message = str(err.value)
    assert re.match(r"nothing fits: the least memory a layout of 8 GPUs needs is \d+\.\d GB per GPU \(\S+", message)
    assert "full recomputation, the largest ZeRO stage, micro-batch 1" in message
    assert "it would fit with --gpus 128 (" in message and "--seq-len" not in message  # no context is short enough
    assert "\n" not in message


# 8B on 3 GPUs, not 2: with Megatron's fp32 main_grad (18 bytes per parameter without ZeRO, the
# production count) the model state of dp1×tp2 alone fills 90 % of the H100's 85.5 GB, so no shorter
# context helps; 70B on 16 GPUs fits 16K and 32K (cp8, ZeRO-3, full recomputation), not 64K
@pytest.mark.parametrize("name, gpus, seq_len", [("llama-3.1-8b", 3, 131072), ("llama-3.1-70b", 16, 65536)])
def test_nothing_fits_suggestions_work_and_are_the_first_that_do(name, gpus, seq_len):
    cfg = ModelConfig.preset(name)
    with pytest.raises(ValueError) as err:
        plan(cfg, H100, gpus=gpus, seq_len=seq_len, global_batch=16)
    message = str(err.value)
    more = int(re.search(r"--gpus (\d+)", message).group(1))
    shorter = int(re.search(r"--seq-len (\d+)", message).group(1))
    assert plan(cfg, H100, gpus=more, seq_len=seq_len, global_batch=16).candidates  # what it suggests plans
    assert plan(cfg, H100, gpus=gpus, seq_len=shorter, global_batch=16).candidates
    for fewer, longer in ((more // 2, seq_len), (gpus, 2 * shorter)):  # and one step short of it does not
        if (fewer, longer) != (gpus, seq_len):
            with pytest.raises(ValueError, match="nothing fits"):
                plan(cfg, H100, gpus=fewer, seq_len=longer, global_batch=16)


# ---- the command line ---------------------------------------------------------------------------
def test_plan_an_imported_config(capsys):
    # Qwen2-7B has 28 query heads and 4 KV heads: tp must divide both, so tp is 1, 2 or 4, never 8
    argv = ["plan", "--hf-config", str(DATA_DIR / "hf" / "Qwen2-7B.json"), "--gpus", "16", "--seq-len", "4096"]
    assert main([*argv, "--global-batch", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "Qwen2-7B" and out["candidates"]
    assert {c["tp"] for c in out["candidates"]} <= {1, 2, 4}
    assert "tp=8 must divide n_heads=28" in out["rejected"]["tp vs the model"]["example"]
    assert "--model Qwen2-7B" in out["launch"]["torchrun"]
    assert main([*argv, "--global-batch", "64"]) == 0
    assert capsys.readouterr().out.startswith("Qwen2-7B: 7,615,616,512 parameters from Hugging Face config.json")


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("playbook: error: "), captured.err
    return lines[0]


def test_bad_input_one_line_each(capsys, tmp_path):
    qwen = str(DATA_DIR / "hf" / "Qwen2-7B.json")
    line = _one_line_error(capsys, ["plan", "--model", "llama-3.1-8b", "--hf-config", qwen])
    assert "both name the model; give one of them" in line
    line = _one_line_error(capsys, ["plan"])
    assert "--model NAME (one of deepseek-v3," in line and "--hf-config path/to/config.json" in line
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 768}))
    line = _one_line_error(capsys, ["plan", "--hf-config", str(tmp_path)])
    assert "model_type 'gpt2', which is not supported; supported model_type values: llama, mistral" in line
    line = _one_line_error(capsys, ["plan", "--model", "llama-3.1-8b", "--gpus", "12"])
    assert line.endswith("--gpus 12 is not a whole number of nodes of 8; try --gpus 8 or 16")
    line = _one_line_error(capsys, ["plan", "--model", "llama-3.1-8b", "--hardware", "tpu-v9"])
    assert "unknown hardware profile 'tpu-v9'; known hardware profiles: a100-80gb" in line
    line = _one_line_error(capsys, ["plan", "--model", "llama-3.1-8b", "--gpus", "0"])
    assert line.endswith("--gpus must be a positive integer, got 0; e.g. --gpus 64")  # cli.checks.LIMITS


# ---- every preset and every shipped config.json gets an answer ------------------------------------
# DeepSeek-V3 left out (its 671B need 16 bytes each over >= 150 GPUs, and the MoE search there takes
# seconds); test_hf_config checks that its import equals the preset.
CONFIGS = [
    *(n for n in ModelConfig.presets() if n != "deepseek-v3"),
    *sorted(p.name for p in (DATA_DIR / "hf").glob("*.json") if p.stem != "DeepSeek-V3"),
]


@pytest.mark.parametrize("name", CONFIGS)
def test_every_model_gets_ranked_layouts_that_fit(name):
    cfg = ModelConfig.from_hf_config(DATA_DIR / "hf" / name) if name.endswith(".json") else ModelConfig.preset(name)
    run = dict(gpus=64, seq_len=min(2048, cfg.max_seq_len), global_batch=64)
    if 16 * cfg.num_params() / 64 > 0.9 * H100.capacity_bytes:  # mixed-precision AdamW state alone cannot fit
        with pytest.raises(ValueError, match=r"^nothing fits: .*; it would fit with --gpus \d+ \("):
            plan(cfg, H100, **run)
        return
    p = plan(cfg, H100, **run)
    steps = [c.cost.total for c in p.candidates]
    assert steps and steps == sorted(steps)
    for c in p.candidates:
        assert c.memory <= 0.9 * H100.capacity_bytes and c.layout.tp <= 8
        assert cfg.n_heads % c.layout.tp == 0 and cfg.kv_heads % c.layout.tp == 0
        assert c.layout.dp * c.layout.tp * c.layout.pp * c.layout.cp == 64
        assert c.layout.dp * c.layout.micro_batch * c.layout.microbatches == 64


def test_a_sequence_past_max_position_embeddings_plans_and_says_its_rope_scaling(capsys):
    """Long-context training extends RoPE past a model's max_position_embeddings (issue 41, cause 6):
    the planner, ``plan --layout`` and ``memory`` take such a sequence and say what they assume."""
    from playbook.cli.main import main
    from playbook.hardware import Hardware
    from playbook.theory.plan.planner import plan

    cfg = ModelConfig.preset("llama-3.1-8b")  # 131,072 positions
    p = plan(cfg, Hardware.preset("h100-sxm"), gpus=64, seq_len=262144, global_batch=8)
    assert p.candidates and p.rope_scaling.startswith("seq 262,144 is past llama-3.1-8b's max_position_embeddings")
    assert "extended 2x" in p.rope_scaling and "YaRN" in p.rope_scaling
    assert plan(cfg, Hardware.preset("h100-sxm"), gpus=8, seq_len=8192, global_batch=8).rope_scaling == ""
    common = ["--model", "llama-3.1-8b", "--seq-len", "262144"]
    for argv in (
        ["plan", *common, "--gpus", "64", "--global-batch", "8", "--layout", "dp=1 tp=8 cp=8 zero=1 recompute=full"],
        ["memory", *common, "--tp", "8", "--cp", "8"],
    ):
        assert main(argv) == 0, argv
        out = capsys.readouterr().out
        assert "past llama-3.1-8b's max_position_embeddings 131,072: this assumes RoPE extended 2x" in out, argv
