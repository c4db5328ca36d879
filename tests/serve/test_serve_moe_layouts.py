"""MoE serving layouts on real ranks (``serve.moe_layouts``): TP attention and DP attention with the
experts over every rank, each against one process; KV bytes per rank and bytes per decode step
against numbers written out here from the layouts' definitions."""

import pytest

from playbook.config import ModelConfig
from playbook.serve.moe_layouts import layouts_on_rank, problem, serve_moe_layouts
from playbook.theory.serving.parallel import ep_forward_alltoall_bytes

MOE = ModelConfig.preset("gpt-tiny-moe")  # 4 heads, 2 KV heads, head_dim 16, 2 layers, 4 experts, top-2
ROWS, PROMPT, NEW = 4, 8, 8


def _kv_per_rank(heads: int, rows: int) -> int:
    """fp32 K and V of ``heads`` KV heads, every layer, of prompt + new − 1 cached tokens per row."""
    return rows * (PROMPT + NEW - 1) * 2 * MOE.n_layers * heads * MOE.dim_head * 4


@pytest.mark.parametrize("n", [2, 4])
def test_both_layouts_decode_the_single_process_tokens_and_hold_the_predicted_kv(n, ranks2, ranks4):
    ranks = ranks2 if n == 2 else ranks4
    out = serve_moe_layouts(MOE, ep=n, seed=3, rows=ROWS, prompt_len=PROMPT, new_tokens=NEW, ranks=ranks)
    tp, dp = out["layouts"]
    assert problem(out["layouts"]) is None
    for row in (tp, dp):
        assert row["tokens_identical"] and row["max_abs_logit_diff"] < 1e-5
    # TP attention: every request on every rank, max(2/n, 1) KV heads each: at n = 4 a KV head per 2 ranks
    assert tp["kv_bytes"]["measured"] == [_kv_per_rank(max(2 // n, 1), ROWS)] * n
    # replicated: what a rank holds beyond its 1/n of the whole cache (half a head's worth at n = 4)
    assert tp["kv_bytes"]["replicated"] == [_kv_per_rank(max(2 // n, 1), ROWS) - _kv_per_rank(2, ROWS) / n] * n
    # DP attention: each rank its own ROWS / n requests with both KV heads, nothing replicated
    assert dp["kv_bytes"]["measured"] == [_kv_per_rank(2, ROWS // n)] * n
    assert sum(dp["kv_bytes"]["measured"]) == _kv_per_rank(2, ROWS)  # the cache once, over the ranks
    # TP attention: 2 ring all-reduces of [ROWS, h] fp32 per layer per step, 2(n−1)/n of it sent
    ring = 2 * (n - 1) / n * ROWS * MOE.hidden * 4
    assert tp["bytes_per_step"]["all_reduce"]["measured"] == [2 * MOE.n_layers * ring] * n
    assert "all_to_all_single" not in tp["bytes_per_step"]
    # DP attention: all-to-all as the routing counts predict, the counts all-gathered (int64 per expert)
    a2a = dp["bytes_per_step"]["all_to_all_single"]
    assert a2a["measured"] == pytest.approx(a2a["predicted"], rel=1e-9)
    assert dp["bytes_per_step"]["all_gather_single"]["measured"] == [MOE.n_moe_layers * MOE.n_experts * 8 * (n - 1)] * n
    assert "all_reduce" not in dp["bytes_per_step"]


def test_dp_attention_alltoall_counts_every_row_sent_off_its_rank(ranks2):
    """The all-to-all bytes from the raw routing: each slot routed to an expert on another rank goes
    there (dispatch) and comes back (combine), h fp32 each way: the sum over ranks, written out here."""
    import torch

    prompts = torch.randint(0, MOE.vocab_size, (ROWS, PROMPT), generator=torch.Generator().manual_seed(5))
    answers = ranks2.run(layouts_on_rank, cfg=MOE, seed=5, ep=2, prompts=prompts, new_tokens=NEW)
    routing = answers[0]["dp"]["decode_routing"]  # per forward of each layer: counts [rank][expert]
    assert len(routing) == MOE.n_moe_layers * (NEW - 1)
    per = MOE.n_experts // 2
    off = sum(counts[r][e] for counts in routing for r in range(2) for e in range(MOE.n_experts) if e // per != r)
    measured = sum(a["dp"]["sent"]["all_to_all_single"] for a in answers)
    assert measured == 2 * off * MOE.hidden * 4
    assert [a["dp"]["sent"]["all_to_all_single"] for a in answers] == [
        sum(ep_forward_alltoall_bytes(c, 2, MOE.hidden)[r] for c in routing) for r in range(2)
    ]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--ep", "2"], "gpt-tiny is a dense model"),
        (["--model", "gpt-tiny-moe", "--ep", "3"], "ep=3 does not divide the 4 experts"),
        (["--model", "gpt-tiny-moe"], "add --ep 2"),
        (["--model", "gpt-tiny-moe", "--ep", "2", "--tp", "2"], "give only --ep"),
        (["--model", "gpt-tiny-moe", "--ep", "4", "--requests", "3"], "use --requests 4"),
    ],
)
def test_run_serve_attention_dp_refuses_bad_combinations_in_one_line_before_ranks(capsys, argv, words):
    from playbook.cli import main

    assert main(["run", "serve", "--attention-dp", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("playbook: error: ") and "\n" not in err and words in err, err


def test_uneven_requests_over_dp_attention_ranks_still_match(ranks2):
    """3 requests on 2 DP-attention ranks: 2 and 1 (each rank its own batch), the MoE layers still in lockstep."""
    out = serve_moe_layouts(MOE, ep=2, seed=1, rows=3, prompt_len=PROMPT, new_tokens=NEW, ranks=ranks2)
    assert problem(out["layouts"]) is None
    tp, dp = out["layouts"]
    assert dp["rows_per_rank"] == [2, 1] and tp["rows_per_rank"] == [3, 3]
    assert dp["kv_bytes"]["measured"] == [_kv_per_rank(2, 2), _kv_per_rank(2, 1)]
