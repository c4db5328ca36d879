"""Pipeline- and expert-parallel decoding on real ranks: tokens equal the single process's greedy
decoding without a cache, logits within 1e-5, and the bytes the tracer sees equal the predictions
(activation rows per stage boundary; all-to-all rows from the routing counts)."""

import pytest

from playbook.config import ModelConfig
from playbook.serve.experts import serve_ep
from playbook.serve.pipeline import serve_pp, stage_layers
from playbook.theory.serving.parallel import (
    ep_forward_alltoall_bytes,
    ep_uniform_bytes_per_token,
    pp_decode_bubble,
    pp_stage_bytes_per_token,
)

TINY, SMALL, MOE = (ModelConfig.preset(n) for n in ("gpt-tiny", "gpt-small", "gpt-tiny-moe"))


def test_pp_decode_on_2_and_4_stages_matches_the_reference(ranks2, ranks4):
    for ranks, cfg, m in ((ranks2, TINY, 2), (ranks4, SMALL, 2)):  # m < pp on 4 stages: still exact
        pp = ranks.world_size
        out = serve_pp(cfg, pp=pp, seed=1, rows=4, prompt_len=7, new_tokens=9, microbatches=m, ranks=ranks)
        assert out["tokens_identical"] and out["max_abs_logit_diff"] < 1e-5
        # one fp32 row of h per token from every stage but the last; the last sends the int64 id back
        assert out["bytes_per_token"]["measured"] == out["bytes_per_token"]["predicted"]
        assert out["bytes_per_token"]["predicted"] == [4 * cfg.hidden] * (pp - 1) + [8]
        assert out["decoded"] == 4 * 8
        assert 0 <= out["bubble"]["measured"] <= 1 and out["tokens_per_second"] > 0
        assert out["bubble"]["predicted"] == pytest.approx(pp_decode_bubble(pp, m, 8))


def test_stages_cover_every_layer_once():
    assert [list(stage_layers(4, 2, s)) for s in range(2)] == [[0, 1], [2, 3]]
    assert [i for s in range(4) for i in stage_layers(8, 4, s)] == list(range(8))


def test_pp_decode_bubble_closed_forms():
    pp, n = 4, 10
    assert pp_decode_bubble(pp, 1, n) == pytest.approx((pp - 1) / pp)  # one micro-batch: one stage at a time
    for m in (4, 8):  # enough in flight: only fill and drain
        assert pp_decode_bubble(pp, m, n) == pytest.approx((pp - 1) / (n * m + pp - 1))
    assert pp_decode_bubble(pp, 2, n) > pp_decode_bubble(pp, 4, n)
    assert pp_decode_bubble(1, 1, n) == 0
    assert pp_stage_bytes_per_token(TINY, pp=1) == [0.0]
    with pytest.raises(ValueError, match="must be >= 1"):
        pp_decode_bubble(2, 0, 3)


def test_ep_decode_on_2_and_4_ranks_matches_the_moe_reference(ranks2, ranks4):
    for ranks in (ranks2, ranks4):
        ep = ranks.world_size
        out = serve_ep(MOE, ep=ep, seed=1, rows=4, prompt_len=7, new_tokens=9, ranks=ranks)
        assert out["tokens_identical"] and out["max_abs_logit_diff"] < 1e-5
        a2a = out["alltoall_bytes_per_token"]
        assert a2a["measured"] == a2a["predicted"]  # exact, from the routing counts every layer saw
        assert all(0 < b < 2 * a2a["even_routing"] for b in a2a["measured"])
        counts = out["counts_bytes_per_step"]
        assert (
            counts["measured"] == [counts["predicted"]] * ep == [MOE.n_moe_layers * MOE.n_experts * 8 * (ep - 1)] * ep
        )


def test_ep_alltoall_rows_by_hand():
    # 2 ranks, 4 experts (rank 0 owns 0-1, rank 1 owns 2-3); counts_by_rank[r][e]
    counts = [[3, 0, 1, 2], [0, 1, 4, 0]]
    # rank 0 dispatches 1 + 2 = 3 rows, gets back (combine) rank 1's 0 + 1 = 1 row for its experts
    # rank 1 dispatches 0 + 1 = 1 row, returns rank 0's 1 + 2 = 3 rows
    assert ep_forward_alltoall_bytes(counts, 2, hidden=5) == [(3 + 1) * 5 * 4, (1 + 3) * 5 * 4]
    assert ep_uniform_bytes_per_token(MOE, ep=2) == MOE.n_moe_layers * 2 * MOE.top_k * MOE.hidden * 4 / 2


def test_refusals_before_ranks_start():
    with pytest.raises(ValueError, match="pp=3 is more stages"):
        serve_pp(TINY, pp=3)
    with pytest.raises(ValueError, match=r"pp=3 must divide n_layers=4"):
        serve_pp(SMALL, pp=3)
    with pytest.raises(ValueError, match="microbatches=5 must be in 1..4"):
        serve_pp(TINY, pp=2, rows=4, microbatches=5)
    with pytest.raises(ValueError, match="must fit max_seq_len"):
        serve_pp(TINY, pp=2, prompt_len=60, new_tokens=10)
    with pytest.raises(ValueError, match="needs a mixture-of-experts model"):
        serve_ep(TINY, ep=2)
    with pytest.raises(ValueError, match="do not split over ep=2"):
        serve_ep(MOE, ep=2, rows=3)
    with pytest.raises(ValueError, match="ep=3 must divide n_experts=4"):
        serve_ep(MOE, ep=3, rows=3)


@pytest.mark.parametrize("argv", [["--pp", "2"], ["--ep", "2", "--model", "gpt-tiny-moe"]])
def test_playbook_run_serve_pp_and_ep(capsys, argv):
    import json

    from playbook.cli import main

    assert main(["run", "serve", *argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    result = report["result"]
    assert result["tokens_identical"] and result["max_abs_logit_diff"] <= 1e-5
    got = result.get("bytes_per_token") or result["alltoall_bytes_per_token"]
    assert got["measured"] == pytest.approx(got["predicted"], rel=1e-9)


def test_playbook_run_serve_refuses_pp_with_tp_in_one_line(capsys):
    from playbook.cli import main

    assert main(["run", "serve", "--pp", "2", "--tp", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--pp and --ep run alone here" in err[0]
