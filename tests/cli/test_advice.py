"""A does-not-fit answer names what would fit: ``playbook memory`` and ``plan --layout`` list the cheapest
changes that do, each with its new total, computed by the same memory model (``cli.advice``)."""

from __future__ import annotations

import re

import pytest

from playbook.cli import main
from playbook.cli.advice import training_total, what_would_fit
from playbook.config import ModelConfig
from playbook.hardware import MEM_UTIL, Hardware
from playbook.theory.hybrid.memory import training_memory

H100 = Hardware.preset("h100-sxm")
ALLOWED = MEM_UTIL * H100.capacity_bytes
BASE = dict(seq_len=4096, micro_batch=1, dp=64, zero=3, attention="eager")


def test_one_flag_that_fits_is_named_with_the_total_it_gives():
    cfg = ModelConfig.preset("llama-3.1-70b")
    changes = what_would_fit(cfg, BASE, ALLOWED)
    full = next(c for c in changes if c.flags == "--recompute full")
    assert full.total_bytes == training_memory(cfg, **BASE, recompute="full").total <= ALLOWED
    assert all(c.fits for c in changes) and len(changes) <= 3
    assert training_total(cfg, BASE) > ALLOWED  # the question: it does not fit as asked


def test_when_no_one_flag_fits_the_kinds_are_combined_and_the_last_one_is_needed():
    cfg = ModelConfig.preset("llama-3.1-405b")
    base = dict(seq_len=8192, micro_batch=1, dp=8, attention="eager")
    (combined,) = what_would_fit(cfg, base, ALLOWED)
    flags = re.findall(r"--[a-z-]+", combined.flags)
    assert combined.fits and len(flags) == len(set(flags)), combined.flags  # each kind of change at most once
    assert flags[-1] == "--pp"
    without_last = dict(base, attention="flash", recompute="full", zero=3, tp=8, sequence_parallel=True)
    assert training_total(cfg, without_last) > ALLOWED  # everything before the pipeline still does not fit


def test_memory_prints_what_would_fit_only_when_it_does_not(capsys):
    args = [
        "memory",
        "--model",
        "llama-3.1-70b",
        "--seq-len",
        "4096",
        "--dp",
        "64",
        "--zero",
        "3",
        "--hardware",
        "h100-sxm",
    ]
    assert main(args) == 0
    assert "what would fit (cheapest first): --recompute full" in capsys.readouterr().out
    assert main([*args, "--recompute", "full"]) == 0
    assert "what would fit" not in capsys.readouterr().out


def test_plan_layout_names_a_change_that_fits_and_the_planners_fastest_and_explains_its_labels(capsys):
    args = ["plan", "--model", "llama-3.1-70b", "--gpus", "64", "--seq-len", "8192", "--global-batch", "512"]
    assert main([*args, "--layout", "dp=8 tp=8 recompute=none"]) == 0
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "what would fit: zero=2 (58.1 GB" in out  # ZeRO-2 shards 105.8 GB of Adam over 8
    from playbook.theory.plan.layout import cost_layout, parse_layout

    cfg, z2 = ModelConfig.preset("llama-3.1-70b"), parse_layout("dp=8 tp=8 zero=2", global_batch=512)
    assert cost_layout(cfg, H100, z2, seq_len=8192, rank=False)["fits"]
    assert not cost_layout(cfg, H100, parse_layout("dp=8 tp=8 zero=1", global_batch=512), seq_len=8192, rank=False)[
        "fits"
    ]
    assert re.search(r"the planner's fastest layout that fits on 64 GPUs: dp\d", out)
    assert "z1 (ZeRO stage)" in out  # what a label says
    assert main([*args, "--layout", "dp=8 tp=8 zero=3"]) == 0
    assert "what would fit" not in capsys.readouterr().out


def test_plan_help_explains_a_layout_label(capsys):
    """Issue 48: the labels (dp8×tp8 z3 b2 m32 none) were explained nowhere; --help reads one out."""
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse rewraps the description
    for part in (
        "z1 (ZeRO stage)",
        "b1 (micro-batch, sequences)",
        "m32 (micro-batches per step)",
        "none (recomputation",
    ):
        assert part in text, part


def test_the_readme_memory_examples_show_a_miss_with_its_fix_and_a_fit(capsys):
    """Issue 48: the README's first memory example only said 'does NOT fit, margin −243.91 GB'. Its two
    examples now show a miss that names what would fit, and that change fitting."""
    import shlex
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    lines = [ln.split("#")[0].strip() for ln in readme.splitlines() if ln.startswith("playbook memory ")]
    miss, fit = lines[0], lines[1]
    assert main(shlex.split(miss)[1:]) == 0
    out = capsys.readouterr().out
    training = next(ln for ln in out.splitlines() if "training" in ln)
    assert "does NOT fit" in training and "what would fit (cheapest first): --recompute full:" in out, out
    assert main(shlex.split(fit)[1:]) == 0  # the change it names
    training = next(ln for ln in capsys.readouterr().out.splitlines() if "training" in ln)
    assert "fits h100-sxm" in training and "NOT" not in training, training
