"""Issue 31, input to ``run``, ``plan`` and ``serve-plan``: huge values are refused at once in one
line (no hang, no C++ frames), the first error is the real one, and flags that would do nothing in
a layout are refused by one rule (as ``--sequence-parallel`` without tp always was)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from playbook.cli import main

ROOT = Path(__file__).resolve().parents[2]
HUGE = "9223372036854775808"  # 2**63


def one_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("playbook: error: ") and "\n" not in err, err
    return err


@pytest.mark.ranks  # a fresh Python that imports torch
@pytest.mark.parametrize(
    "argv, expected",
    [
        (["serve-plan", "--gpus", HUGE], "--gpus must be a positive integer at most 1,000,000, got " + HUGE),
        (["run", "serve", "--requests", HUGE], "--requests must be a positive integer at most 1,000"),
    ],
)
def test_huge_values_do_not_hang(argv, expected):
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "playbook.cli", *argv], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT
    )
    assert done.returncode == 2 and expected in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert time.monotonic() - t0 < 60


def test_divisors_of_a_huge_number_are_quick():
    from playbook.config import divisors

    t0 = time.monotonic()
    assert divisors(2**40) == [2**k for k in range(41)]  # 2**20 trials, not 2**40
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert time.monotonic() - t0 < 1


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["run", "serve", "--blocks", HUGE], "--blocks must be a positive integer at most 1,000,000"),
        (["run", "serve", "--block-size", HUGE], "--block-size must be a positive integer at most 4,096"),
        (["run", "serve", "--blocks", "1000000", "--block-size", "4096"], "tokens of KV per rank is more than"),
        (["serve-plan", "--block-size", HUGE], "--block-size must be a positive integer at most 4,096"),
        (
            ["run", "dp", "--global-batch", HUGE],
            f"--global-batch must be a positive integer at most 10,000,000, got {HUGE}",
        ),
        (["run", "dp", "--world-size", HUGE], "is more ranks than this machine can run"),
    ],
)
def test_huge_values_are_one_line(capsys, argv, expected):
    assert expected in one_line(capsys, argv)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["run", "hybrid", "--tp", "3"], "tp=3 must divide n_heads=4"),
        (["run", "hybrid", "--cp", "3"], "seq_len=32 must split into 3 equal chunks for cp=3"),
        (["run", "hybrid", "--world-size", "3", "--dp", "2"], "--world-size 3 but the degrees dp2 need 2 ranks"),
        (["run", "serve", "--tp", "3"], "tp=3 must divide n_heads=4"),
        (["run", "serve", "--pp", "2", "--tp", "2"], "--pp and --ep run alone here"),
    ],
)
def test_the_first_error_is_the_real_one(capsys, argv, expected):
    err = one_line(capsys, argv)
    assert expected in err and "global_batch" not in err


def test_the_memory_advice_names_only_values_the_user_could_type(capsys):
    from playbook.cli.checks import check_fits

    class Args:
        model, global_batch, seq_len, world_size = "gpt-tiny", 10**6 + 1, 32, 2

    with pytest.raises(ValueError) as err:
        check_fits(Args, available=10**9)
    line = str(err.value)
    suggested = int(line.split("--global-batch ")[-1].split()[0])
    assert suggested % 2 == 0 and suggested < 10**6 + 1, line


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["run", "hybrid", "--zero", "3"], "--zero 3 shards over dp×cp, and dp·cp=1 here"),
        (["run", "hybrid", "--zigzag"], "--zigzag balances causal work over cp, and cp=1 here"),
        (["run", "hybrid", "--cp-variant", "ulysses"], "--cp-variant ulysses is context parallelism, and cp=1 here"),
        (["run", "hybrid", "--microbatches", "3"], "global_batch=8 does not split over dp·microbatches=1·3"),
        (["run", "hybrid", "--sequence-parallel"], "it needs tp > 1"),
        (["plan", "--model", "gpt-tiny", "--gpus", "64", "--gpus-per-node", "1000"], "is more than --gpus 64"),
        (["plan", "--model", "gpt-tiny", "--gpus", "64", "--gpus-per-node", "3"], "not a whole number of nodes"),
    ],
)
def test_flags_that_would_do_nothing_are_refused_alike(capsys, argv, expected):
    assert expected in one_line(capsys, argv)


@pytest.mark.parametrize("gpus", [4, 8])
def test_plan_takes_one_full_node(capsys, gpus):
    """Issue 48, near-miss 15: --gpus-per-node equal to --gpus is one node, every GPU of the job in it;
    only more GPUs per node than the job has is refused."""
    import json

    argv = ["plan", "--model", "llama-3.1-8b", "--gpus", str(gpus), "--gpus-per-node", str(gpus), "--top", "1"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpus"] == out["gpus_per_node"] == gpus and out["candidates"]


# ---- part of torchrun's environment (a stray TORCHELASTIC_RUN_ID): one line, no KeyError ----------
TORCHRUN_NAMES = ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")


@pytest.fixture
def no_torchrun(monkeypatch):
    for name in TORCHRUN_NAMES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    "env, expected",
    [
        (
            {"TORCHELASTIC_RUN_ID": "x"},
            "TORCHELASTIC_RUN_ID is set but RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not",
        ),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "RANK, WORLD_SIZE are set but MASTER_ADDR, MASTER_PORT are not"),
    ],
)
def test_part_of_torchrun_s_environment_is_one_line(no_torchrun, capsys, env, expected):
    for name, value in env.items():
        no_torchrun.setenv(name, value)
    err = one_line(capsys, ["run", "dp", "--world-size", "2"])
    assert expected in err and "torchrun --nproc-per-node" in err, err


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, None),
        ({"RANK": "0"}, None),  # RANK alone is not torchrun's (other tools set it): local ranks start
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}, None),
        (
            {"RANK": "0", "WORLD_SIZE": "x", "MASTER_ADDR": "h", "MASTER_PORT": "29500"},
            "WORLD_SIZE='x' is not a whole number",
        ),
        (
            {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"},
            "RANK=2 is not below WORLD_SIZE=2",
        ),
    ],
)
def test_torchrun_env_problem(no_torchrun, env, expected):
    from playbook.cluster import torchrun_env_problem, under_torchrun

    for name, value in env.items():
        no_torchrun.setenv(name, value)
    problem = torchrun_env_problem()
    assert (problem is None) == (expected is None) and (expected is None or expected in problem), problem
    assert under_torchrun() == ("MASTER_PORT" in env)
