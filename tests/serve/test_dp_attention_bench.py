"""``serve-bench --attention-dp``: DP-attention ranks, each its own continuous batcher, the MoE layers
in lockstep (``serve.dp_attention``): every token as one process decodes it, every rank the same
number of MoE passes, and the all-to-all bytes the routing counts fix."""

import pytest

from playbook.config import ModelConfig
from playbook.serve.serve_bench import serve_bench

MOE = ModelConfig.preset("gpt-tiny-moe")


def test_dp_attention_under_continuous_batching_matches_one_process(ranks2):
    report = serve_bench(MOE, dp=2, requests=6, rate=1.0, attention_dp=True, ranks=ranks2)
    assert report["tokens_identical"] and report["setup"]["layout"] == "DP attention ×2, ep2"
    ranks = report["alltoall_bytes"]
    # lockstep: a rank's real forwards plus its idle ones = every other rank's
    assert len({r["forwards"] + r["idle_forwards"] for r in ranks}) == 1
    assert sum(r["forwards"] for r in ranks) > 0
    for r in ranks:
        assert r["measured"] == pytest.approx(r["predicted"], rel=1e-12) and r["measured"] > 0


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--model", "gpt-tiny"], "dense model"),
        (["--model", "gpt-tiny-moe", "--dp", "3"], "ep=3 does not divide the 4 experts"),
        (["--model", "gpt-tiny-moe", "--tp", "2"], "use --tp 1 --dp 2"),
    ],
)
def test_serve_bench_attention_dp_refuses_bad_combinations_in_one_line(capsys, argv, words):
    from playbook.cli import main

    assert main(["serve-bench", "--attention-dp", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("playbook: error: ") and "\n" not in err and words in err, err
