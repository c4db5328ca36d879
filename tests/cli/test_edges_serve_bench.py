"""Issue 48, the sweep's serve-bench edges: a trace whose arrivals span billions of idle steps, a
billion prefix groups, a seed past 64 bits and a model too large for this machine are refused in one
line before any rank starts (they hung, ate gigabytes, or failed in a rank's traceback)."""

from __future__ import annotations

import re

import pytest

from playbook.cli import main
from playbook.cli.checks import _size, check_serving_fits
from playbook.config import ModelConfig
from playbook.serve.serve_bench import MAX_ARRIVAL_STEP
from playbook.theory.serving.workload import poisson_trace

DEFAULTS = dict(n=16, groups=2, prefix=16, suffix=(2, 12), new=(4, 12), seed=0)  # serve-bench's


def one_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("playbook: error: ") and "\n" not in err, err
    return err


def _last_arrival(rate: float) -> int:
    vocab = ModelConfig.preset("gpt-tiny").vocab_size
    return max(t.arrival for t in poisson_trace(rate=rate, vocab=vocab, **DEFAULTS))


def test_a_trace_spanning_billions_of_idle_steps_is_refused_with_a_rate_that_fits(capsys):
    err = one_line(capsys, ["serve-bench", "--rate", "1e-9"])
    last = _last_arrival(1e-9)
    assert last > MAX_ARRIVAL_STEP and f"arrives at step {last:,}" in err, err
    rate = float(re.search(r"try --rate (\S+) or more", err)[1])
    assert _last_arrival(rate) <= MAX_ARRIVAL_STEP < _last_arrival(rate * 0.9), rate  # and not far above it


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--groups", "1000000000", "--prefix", "0"], "--groups must be a positive integer at most 1,000"),
        (["--seed", str(10**23)], "--seed must be between 0 and 9,223,372,036,854,775,807"),
        (["--seed", "-1"], "--seed must be between 0 and 9,223,372,036,854,775,807"),
    ],
)
def test_huge_counts_are_one_line(capsys, argv, expected):
    assert expected in one_line(capsys, ["serve-bench", *argv])


def test_a_model_too_large_for_this_machine_is_refused_before_the_ranks():
    """llama-3.1-8b on dp 2: each rank builds the fp32 reference (4 bytes a parameter) and 64 blocks
    of 4 tokens at 2·32·8·128·4 = 262,144 B a token; the parent builds one more reference."""
    cfg = ModelConfig.preset("llama-3.1-8b")
    weights = 4 * cfg.num_params()
    per_rank = weights + 64 * 4 * 2 * 32 * 8 * 128 * 4
    total = 2 * per_rank + weights
    with pytest.raises(ValueError) as e:
        check_serving_fits(cfg, tp=1, dp=2, blocks=64, block_size=4, available=24e9)
    assert f"needs {_size(per_rank)} per rank" in str(e.value) and f"{_size(total)} in all" in str(e.value)
    assert "try --model gpt-small / gpt-tiny" in str(e.value)
    check_serving_fits(ModelConfig.preset("gpt-tiny"), tp=1, dp=2, blocks=64, block_size=4, available=24e9)
    check_serving_fits(cfg, tp=1, dp=2, blocks=64, block_size=4, available=total / 0.8)  # just fits
