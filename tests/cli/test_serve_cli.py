"""``playbook serve-plan`` and ``playbook run serve`` from the command line."""

import json

import pytest

from playbook.cli import main
from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.serving.layouts import serving_layout


def test_serve_plan_json_has_every_fitting_layout_and_a_recommendation(capsys):
    assert (
        main(
            [
                "serve-plan",
                "--model",
                "llama-3.1-70b",
                "--gpus",
                "8",
                "--hardware",
                "h100-sxm",
                "--context",
                "8192",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert [r["layout"] for r in out["layouts"]] == ["tp2×dp4", "tp4×dp2", "tp8×dp1"]
    want = serving_layout(ModelConfig.preset("llama-3.1-70b"), Hardware.preset("h100-sxm"), tp=4, dp=2, context=8192)
    assert out["layouts"][1] == want and out["recommended"] == "tp8×dp1"


def test_serve_plan_table_names_the_recommendation(capsys):
    assert main(["serve-plan", "--model", "llama-3.1-8b", "--gpus", "4", "--context", "4096", "--mem-util", "0.8"]) == 0
    text = capsys.readouterr().out
    assert "tp1×dp4" in text and "tp4×dp1" in text and "recommended:" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--context", "0"], "--context 0 must be in 1..131072"),
        (["--mem-util", "1.5"], "--mem-util must be greater than 0 and at most 1, got 1.5"),  # cli.checks.LIMITS
        (["--gpus", "0"], "--gpus must be a positive integer"),
        (["--model", "llama-3.1-405b", "--gpus", "4"], "does not fit 4 × h100-sxm"),
    ],
)
def test_serve_plan_refuses_bad_input_in_one_line(capsys, argv, message):
    assert main(["serve-plan", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.ranks
def test_run_serve_json_implies_the_world_size(capsys):
    assert main(["run", "serve", "--tp", "2", "--dp", "1", "--requests", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["world_size"] == 2 and out["parity"]["tokens_identical"]
    assert main(["run", "serve", "--tp", "1", "--blocks", "1", "--requests", "2"]) == 2
    assert "--blocks 1 of 4 tokens" in capsys.readouterr().err


@pytest.mark.ranks
def test_run_serve_with_a_prefix_cache_a_router_and_a_token_budget(capsys):
    argv = ["run", "serve", "--tp", "1", "--dp", "2", "--requests", "4", "--blocks", "24", "--json"]
    assert main([*argv, "--prefix-cache", "--router", "prefix", "--token-budget", "6", "--shared-prefix", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parity"]["tokens_identical"] and out["setup"]["router"] == "prefix"
    assert out["setup"]["prefix_cache"] and out["setup"]["token_budget"] == 6
    assert out["parity"]["kv_bytes_match_every_step"]
    assert sum(r["cached"] for r in out["replicas"]) >= 8  # the system prompt's two blocks, found at least once


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--router", "random"], "--router random is not one of round-robin, prefix; try --router prefix"),
        (["--token-budget", "0"], "--token-budget must be a positive integer, got 0"),
        (["--shared-prefix", "60"], "--shared-prefix 60 must be in 0..42"),
    ],
)
def test_run_serve_refuses_a_bad_router_or_budget_in_one_line(capsys, flags, message):
    assert main(["run", "serve", "--tp", "1", "--dp", "2", "--requests", "2", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_serve_plan_prices_the_tp_allreduce_by_size_when_asked(capsys):
    from playbook.theory.serving.serving import BY_SIZE

    argv = ["serve-plan", "--model", "llama-3.1-8b", "--gpus", "8", "--hardware", "b200", "--json"]
    out = {}
    for algo in ("ring", "by-size"):
        assert main([*argv, "--allreduce", algo]) == 0
        out[algo] = json.loads(capsys.readouterr().out)
    assert out["by-size"]["allreduce"] == "by-size"
    b200, llama8 = Hardware.preset("b200"), ModelConfig.preset("llama-3.1-8b")
    want = serving_layout(llama8, b200, tp=4, dp=2, context=8192, latency=BY_SIZE)
    ring, by_size = (next(r for r in out[a]["layouts"] if r["layout"] == "tp4×dp2") for a in ("ring", "by-size"))
    assert by_size == want and by_size["tpot_batch1"] < ring["tpot_batch1"]  # one-shot: ~10 µs, not 6 ring steps
