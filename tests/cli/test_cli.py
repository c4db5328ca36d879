"""The command line: report shape, exact memory on a real rank, and clear errors."""

import json

import pytest
import torch

from playbook.cli import main
from playbook.parallel import RunReport, TrainResult, compare


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.ranks
def test_run_single_reports_the_shared_shape_with_exact_memory(capsys):
    code, out, _ = run_cli(capsys, "run", "single", "--world-size", "1", "--steps", "2", "--json")
    assert code == 0
    report = json.loads(out)
    assert {"strategy", "world_size", "backend", "parity", "native", "memory", "comm"} <= set(report)
    assert report["strategy"] == "single" and report["world_size"] == 1 and report["backend"] == "gloo"
    parity = report["parity"]
    assert set(parity) >= {"reference", "max_abs_loss_diff", "max_rel_grad_diff"}
    # the same code on the same data in two processes: bit-identical
    assert parity["max_abs_loss_diff"] == 0.0 and parity["max_rel_grad_diff"] == 0.0
    predicted, measured = report["memory"]["predicted"], report["memory"]["measured"]
    for category in ("params", "grads", "optimizer"):
        assert measured[category] == predicted[category], category  # to the byte
    assert abs(measured["activations"] - predicted["activations"]) <= 0.01 * predicted["activations"]
    assert report["comm"] == {"predicted": {}, "measured": {}}


def test_memory_command_prints_json(capsys):
    code, out, _ = run_cli(capsys, "memory", "--model", "llama-3.1-70b", "--seq-len", "1024", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["num_params"] == 70_553_706_496
    assert report["inference"]["weights"] == 2 * 70_553_706_496  # bf16 weights: 2 bytes each
    assert report["training"]["params"] == 2 * 70_553_706_496  # mixed precision, no sharding


def test_memory_command_says_whether_a_layout_fits_the_device(capsys):
    """``--hardware``: the most loaded rank against 90 % of what the device reports (an H100's
    81,559 MiB); ``--hf-config`` instead of a preset. 70B at 1K tokens: ZeRO-3 over 64 fits, one rank not."""
    from playbook.config import DATA_DIR

    base = ["memory", "--model", "llama-3.1-70b", "--seq-len", "1024", "--json"]
    code, out, _ = run_cli(capsys, *base, "--dp", "64", "--zero", "3", "--hardware", "h100-sxm")
    report = json.loads(out)
    device, total = report["device"], report["training"]["total"]
    assert code == 0 and device["capacity_bytes"] == 81_559 * 2**20
    assert device["training"] == {"fits": True, "margin_bytes": 0.9 * 81_559 * 2**20 - total}
    code, out, _ = run_cli(capsys, *base)
    assert code == 0 and json.loads(out)["device"]["training"]["fits"] is False
    code, out, _ = run_cli(capsys, "memory", "--hf-config", str(DATA_DIR / "hf" / "Qwen2-7B.json"), "--hardware", "l4")
    assert code == 0 and out.startswith("Qwen2-7B: 7,615,616,512 parameters")
    assert "training (the most loaded rank): does NOT fit l4" in out and "inference: fits l4" in out
    code, _, err = run_cli(capsys, "memory", "--model", "gpt-tiny", "--hf-config", "x.json")
    assert code == 2 and err.count("\n") == 1 and "both name the model; give one of them" in err


def test_memory_command_fp32_grad_accum(capsys):
    # Llama 3.1 70B, 70,553,706,496 parameters: the fp32 buffer adds 4 bytes each to the 2-byte grads,
    # sharded over dp=8 under ZeRO-2 like the gradients: (2 + 4) · Ψ / 8
    psi = 70_553_706_496
    code, out, _ = run_cli(
        capsys,
        "memory",
        "--model",
        "llama-3.1-70b",
        "--seq-len",
        "1024",
        "--dp",
        "8",
        "--zero",
        "2",
        "--fp32-grad-accum",
        "--json",
    )
    assert code == 0
    assert json.loads(out)["training"]["grads"] == 6 * psi / 8
    # Megatron-LM's main_grad replaces the bf16 gradient: 4 · Ψ / 8
    argv = ["memory", "--model", "llama-3.1-70b", "--seq-len", "1024", "--dp", "8", "--zero", "2", "--json"]
    code, out, _ = run_cli(capsys, *argv, "--fp32-grad-accum", "main_grad")
    assert code == 0 and json.loads(out)["training"]["grads"] == 4 * psi / 8
    code, out, err = run_cli(capsys, "memory", "--precision", "fp32", "--fp32-grad-accum")
    assert code == 2 and "fp32_grad_accum needs precision='mixed'" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["memory", "--model", "gpt-huge"], "unknown model preset 'gpt-huge'; known model presets: "),
        (["memory", "--seq-len", "0"], "--seq-len must be a positive integer, got 0; e.g. --seq-len"),
        (["run", "single", "--world-size", "2"], "use --world-size 1"),
        (["run", "single", "--global-batch", "-4"], "--global-batch must be a positive integer, got -4"),
        (["run", "single", "--seq-len", "4096"], "exceeds gpt-tiny's max_seq_len=64"),
    ],
)
def test_bad_input_gets_one_clear_line(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_info_lists_presets(capsys):
    code, out, _ = run_cli(capsys, "info", "--json")
    info = json.loads(out)
    assert code == 0 and "gpt-tiny" in info["model_presets"] and info["gloo"] is True


def test_parity_catches_a_wrong_averaging_factor():
    grads = {"w": torch.tensor([1.0, -2.0, 3.0])}
    reference = TrainResult([1.0], grads, grads)
    doubled = TrainResult([1.0], {"w": grads["w"] * 2}, grads)  # summed instead of averaged over 2 ranks
    missing = TrainResult([1.0], {"w": grads["w"] * torch.tensor([1.0, 1.0, 0.0])}, grads)  # a lost bucket
    assert compare(doubled, reference)["max_rel_grad_diff"] == pytest.approx(1.0)
    assert compare(missing, reference)["max_rel_grad_diff"] == pytest.approx(1.0)
    assert compare(reference, reference)["max_rel_grad_diff"] == 0.0


@pytest.mark.parametrize("where", ["loss", "grad", "param", "reference"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_parity_fails_loudly_on_a_diverged_run(where, bad):
    """Python's max() drops a NaN that is not first: a diverged run once read as perfect parity."""
    w = torch.tensor([1.0, -2.0, 3.0])
    good = TrainResult([4.15, 3.9, 3.7], {"a": w, "b": w}, {"a": w, "b": w})
    broken = torch.tensor([1.0, bad, 3.0])
    diverged = {
        "loss": TrainResult([4.15, bad, bad], good.grads, good.params),
        "grad": TrainResult(good.losses, {"a": w, "b": broken}, good.params),
        "param": TrainResult(good.losses, good.grads, {"a": w, "b": broken}),
    }
    candidate, reference = (good, diverged["param"]) if where == "reference" else (diverged[where], good)
    p = compare(candidate, reference)
    assert p["finite"] is False
    gate = ("max_abs_loss_diff", "max_rel_grad_diff", "max_rel_param_diff", "max_rel_l2_param_diff")
    failing = {k: p[k] for k in gate if not p[k] < 1e-3}
    assert failing, f"a tolerance check passed on a diverged run: {p}"
    assert RunReport("x", 1, "gloo", p, losses=candidate.losses).problem()
    assert "PARITY FAILED" in RunReport("x", 1, "gloo", p, losses=candidate.losses).summary()
    assert compare(good, good)["finite"] is True and RunReport("x", 1, "gloo", compare(good, good)).problem() is None


def test_parity_names_every_figure_and_refuses_runs_of_different_length():
    w = {"a": torch.tensor([1.0, 2.0])}
    p = compare(TrainResult([1.0, 2.0], w, w), TrainResult([1.0, 2.0], w, w))
    assert {"max_abs_loss_diff", "max_rel_grad_diff", "max_rel_param_diff", "max_rel_l2_param_diff", "finite"} <= set(p)
    with pytest.raises(ValueError, match="the run has 2 step.*the reference 3"):
        compare(TrainResult([1.0, 2.0], w, w), TrainResult([1.0, 2.0, 3.0], w, w))


@pytest.mark.parametrize(
    "extra",
    [[], ["--schedule", "interleaved", "--chunks", "2", "--layers", "4"], ["--schedule", "dualpipe-v"]],
    ids=["1f1b", "interleaved", "dualpipe-v without --chunks: a V holds two by itself"],
)
@pytest.mark.ranks
def test_pp_reports_its_point_to_point_bytes_predicted_and_measured(capsys, extra):
    code, out, _ = run_cli(capsys, "run", "pp", "--world-size", "2", "--steps", "2", "--no-native", *extra, "--json")
    assert code == 0
    comm = json.loads(out)["comm"]
    assert comm["predicted"]["isend"] > 0
    assert comm["measured"] == comm["predicted"], comm  # every send is one [b/m, s, h] fp32 message


@pytest.mark.ranks
def test_ep_refuses_zero_experts_and_reports_what_it_trained(capsys):
    from playbook.parallel.ep.run import moe_config
    from playbook.parallel.training import TrainSetup

    for experts, top_k in ((0, None), (None, 0)):  # 0 is falsy: `x or preset` once ran the preset's value
        with pytest.raises(ValueError, match="must be a positive integer"):
            moe_config(TrainSetup(), experts, top_k)
    assert moe_config(TrainSetup(), 4, 1).top_k == 1
    code, out, _ = run_cli(capsys, "run", "ep", "--world-size", "2", "--steps", "1", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["setup"]["model"] == "gpt-tiny-moe"  # the model actually trained, not the dense preset asked for
    assert report["parity"]["finite"] is True and report["parity"]["within_bounds"] is True
    summary = RunReport(**{k: report[k] for k in ("strategy", "world_size", "backend", "parity", "losses")}).summary()
    assert "nan" not in summary


def test_memory_command_takes_every_degree_together_and_lists_the_stages(capsys):
    argv = ["memory", "--model", "llama-3.1-405b", "--seq-len", "8192", "--tp", "8", "--pp", "16", "--dp", "64"]
    code, out, _ = run_cli(capsys, *argv, "--zero", "1", "--recompute", "full", "--json")
    assert code == 0
    report = json.loads(out)
    stages = report["training_stages"]
    assert len(stages) == 16 and stages[0]["embedding"] and stages[-1]["head"]
    assert [s["in_flight"] for s in stages] == list(range(16, 0, -1))  # 1F1B: p - i micro-batches on stage i
    assert report["training"]["total"] == max(s["memory"]["total"] for s in stages)  # the most loaded stage


@pytest.mark.ranks  # a fresh Python that imports torch
def test_python_dash_m_playbook_is_the_same_cli():
    """`python -m playbook` works where the venv's scripts are not on PATH, and exits with the CLI's code."""
    import subprocess
    import sys

    ok = subprocess.run([sys.executable, "-m", "playbook", "--help"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "usage: playbook" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "playbook", "run", "hybrid", "--tp", "3"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and bad.stderr.strip()
