"""``playbook serve-bench``: the documented JSON on real ranks, a seeded trace, refusals in one line."""

import json

import pytest

from playbook.cli import main
from playbook.config import ModelConfig
from playbook.serve.serve_bench import BENCH_KEYS, serve_bench
from playbook.theory.serving.workload import poisson_trace

TINY = ModelConfig.preset("gpt-tiny")


def test_trace_is_seeded_and_shares_prefixes():
    a = poisson_trace(n=20, rate=0.5, groups=2, prefix=8, suffix=(1, 4), new=(2, 5), vocab=50, seed=3)
    assert a == poisson_trace(n=20, rate=0.5, groups=2, prefix=8, suffix=(1, 4), new=(2, 5), vocab=50, seed=3)
    assert len({r.prompt[:8] for r in a}) == 2 and [r.arrival for r in a] == sorted(r.arrival for r in a)
    assert 20 / (a[-1].arrival + 1) == pytest.approx(0.5, rel=0.5)  # about rate per step
    with pytest.raises(ValueError, match="rate must be > 0"):
        poisson_trace(n=2, rate=0, groups=1, prefix=1, suffix=(1, 1), new=(1, 1), vocab=5)


def test_serve_bench_json_on_ranks(ranks4, tmp_path, capsys):
    rep = serve_bench(TINY, tp=2, dp=2, requests=8, rate=1.0, slo_ttft_ms=1e6, slo_tpot_ms=1e6, ranks=ranks4)
    assert tuple(rep) == BENCH_KEYS and rep["tokens_identical"]
    for part in ("measured", "predicted"):
        for k in ("ttft", "tpot", "itl", "e2e"):
            d = rep[part][k]
            assert list(d) == ["p50", "p90", "p99"] and 0 < d["p50"] <= d["p90"] <= d["p99"]
    m = rep["measured"]
    assert m["requests"] == 8 and m["slo_met"] == 8 and m["goodput_requests_per_s"] == 8 / m["duration"]
    assert len(m["step_seconds"]) == 2 and max(sum(r) for r in m["step_seconds"]) == m["duration"]
    assert 0 < rep["cache"]["cached_tokens"] < rep["cache"]["prompt_tokens"]
    json.dumps(rep)  # plain JSON


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--token-budget", "4", "--max-batch", "4"], "--token-budget 4 must exceed --max-batch 4"),
        (["--tp", "3"], "tp=3 must divide n_heads"),
        (["--blocks", "2"], "--blocks 2 cannot hold a request"),
        (["--slo-ttft-ms", "0"], "--slo-ttft-ms must be > 0"),
        (["--suffix", "5", "2"], "need 1 <= low <= high for suffix (5, 2)"),
        (["--new", "100000", "200000"], "= 200028 tokens, more than gpt-tiny's max_seq_len 64"),  # before drawing
        (["--out", "/no/such/folder/x.json"], "the folder '/no/such/folder' does not exist"),  # before any rank
    ],
)
def test_serve_bench_refuses_bad_input_in_one_line(capsys, argv, message):
    assert main(["serve-bench", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
