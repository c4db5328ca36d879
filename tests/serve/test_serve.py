"""Serving on real ranks: KV-cached greedy decoding equals decoding without a cache, token for token,
in one process, over tensor-parallel shards and over DP replicas with continuous batching; the
bytes the tracer sees and the KV bytes held equal the predictions."""

import pytest
import torch

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.model.gpt import GPT
from playbook.serve.run import run_serve
from playbook.serve.ranks import greedy_on_rank, serve_on_rank
from playbook.parallel.training import TrainSetup
from playbook.serve.batching import ContinuousBatcher, make_requests
from playbook.serve.generate import greedy, greedy_without_cache
from playbook.serve.kv import PagedKVCache
from playbook.theory.hybrid.memory import kv_cache_bytes_per_token
from playbook.theory.serving.serving import tp_allreduce_bytes

TINY, SMALL = ModelConfig.preset("gpt-tiny"), ModelConfig.preset("gpt-small")


def prompts(cfg, rows=4, length=9, seed=3):
    return torch.randint(0, cfg.vocab_size, (rows, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("cfg", [TINY, SMALL], ids=["gpt-tiny", "gpt-small"])
def test_kv_cache_changes_nothing_but_the_cost(cfg):
    model, p = GPT(cfg, seed=1).eval(), prompts(cfg)
    out = greedy(model, p, 16)
    tokens, logits = greedy_without_cache(model, p, 16)
    assert torch.equal(out.tokens, tokens)
    assert (out.logits - logits).abs().max() < 1e-5
    # the cache holds every token but the last generated one: rows × (prompt + 15) tokens, fp32
    assert out.kv_bytes == 4 * (9 + 15) * kv_cache_bytes_per_token(cfg, "fp32")
    assert len(out.step_seconds) == 15


def test_paged_cache_reads_back_what_was_written_across_blocks():
    cache = PagedKVCache(n_layers=1, kv_heads=2, head_dim=3, n_blocks=5, block_size=4)
    cache.add(7), cache.add(8)
    k, v = torch.randn(2, 6, 3), torch.randn(2, 6, 3)
    cache.reserve(7, 6)
    cache.write(0, 7, k, v)
    cache.advance(7, 6)
    cache.reserve(8, 1)
    cache.reserve(7, 3)  # 9 tokens: a third block, after sequence 8's
    assert cache.tables == {7: [0, 1, 3], 8: [2]} and cache.free == [4]
    k2, v2 = torch.randn(2, 3, 3), torch.randn(2, 3, 3)
    cache.write(0, 7, k2, v2)
    got_k, got_v = cache.read(0, 7, 9)
    assert torch.equal(got_k, torch.cat([k, k2], 1)) and torch.equal(got_v, torch.cat([v, v2], 1))
    assert cache.nbytes_used() == 4 * cache.block_bytes == 4 * 2 * (2 * 4 * 3 * 4)
    with pytest.raises(RuntimeError, match="KV cache full"):
        cache.reserve(8, 9)  # 3 blocks, 1 held, 1 free
    cache.release(7)
    assert cache.free == [0, 1, 3, 4]


def test_continuous_batching_equals_one_request_at_a_time():
    model = GPT(TINY, seed=0).eval()
    reqs = make_requests(6, TINY.vocab_size, seed=0)
    run = ContinuousBatcher(model, n_blocks=12, block_size=4, max_batch=4).run(reqs)
    for r in reqs:
        tokens, logits = greedy_without_cache(model, torch.tensor([r.prompt]), r.max_new)
        assert run.tokens[r.id] == tokens[0].tolist()
        assert (run.logits[r.id] - logits[0]).abs().max() < 1e-5
    steps = run.steps
    assert all(s["kv_bytes"] == s["kv_predicted"] for s in steps)
    assert any(s["admitted"] and s["decoded"] for s in steps)  # a request joins while others decode
    left = [i for s in steps for i in s["finished"]]
    assert sorted(left) == list(range(6)) and left != sorted(left)  # leaving in order of completion
    assert any(r.arrival < min(s["step"] for s in steps if r.id in s["admitted"]) for r in reqs)  # waited for blocks
    assert steps[-1]["free_blocks_after"] == 12


def test_tp_decoding_on_2_and_4_ranks_matches_the_reference(ranks2, ranks4):
    for ranks, cfg in ((ranks2, TINY), (ranks4, SMALL)):
        t = ranks.world_size
        p = prompts(cfg)
        answers = ranks.run(greedy_on_rank, cfg=cfg, seed=1, dims=ParallelDims(tp=t), prompts=p, new_tokens=12)
        tokens, logits = greedy_without_cache(GPT(cfg, seed=1).eval(), p, 12)
        for a in answers:
            assert torch.equal(a["tokens"], tokens)
            assert (a["logits"] - logits).abs().max() < 1e-5
            per_layer = a["layer_bytes"] / a["decoded"] / cfg.n_layers
            assert (
                per_layer
                == tp_allreduce_bytes(cfg, tokens=1, tp=t, act_bytes=4)
                == 2 * 2 * cfg.hidden * 4 * (t - 1) / t
            )


def test_dp_replicas_with_tp_serve_their_own_requests(ranks4):
    reqs = make_requests(6, TINY.vocab_size, seed=2)
    answers = ranks4.run(
        serve_on_rank,
        cfg=TINY,
        seed=0,
        dims=ParallelDims(dp=2, tp=2),
        requests=reqs,
        n_blocks=16,
        block_size=4,
        max_batch=4,
    )
    model = GPT(TINY, seed=0).eval()
    for a in answers:
        assert sorted(a["tokens"]) == [r.id for r in reqs if r.id % 2 == a["coords"]["dp"]]
        for rid, tokens in a["tokens"].items():
            assert (
                tokens
                == greedy_without_cache(model, torch.tensor([reqs[rid].prompt]), reqs[rid].max_new)[0][0].tolist()
            )
        assert all(s["kv_bytes"] == s["kv_predicted"] for s in a["steps"])
        assert a["layer_bytes"] == a["computed"] * TINY.n_layers * tp_allreduce_bytes(TINY, tokens=1, tp=2, act_bytes=4)


def test_run_serve_report_and_refusals():
    report = run_serve(TrainSetup(), tp=2, dp=1, requests=3)
    assert report.problem() is None and report.parity["tokens_identical"]
    assert report.parity["tp_bytes_per_token_per_layer"]["measured"] == [512.0, 512.0]
    with pytest.raises(ValueError, match="--blocks 2 of 4 tokens cannot hold"):
        run_serve(TrainSetup(), tp=1, dp=1, requests=3, blocks=2)
    with pytest.raises(ValueError, match="tp=3 must divide n_heads"):
        run_serve(TrainSetup(), tp=3, dp=1)
    with pytest.raises(ValueError, match="--world-size 3"):
        run_serve(TrainSetup(), world_size=3, tp=2, dp=1)


def test_run_serve_refuses_a_pool_one_block_short_of_its_longest_request():
    """Issue 48, near-miss 14: a request of L tokens (prompt + new − 1 cached) needs ceil(L / block)
    blocks, rounded up. With blocks of L − 1 tokens that is 2 (L > 2): 1 block is refused before any
    rank, naming 2; 2 are accepted. Rounded down, 1 would pass and fail inside the ranks."""
    from playbook.serve.checks import check_serve

    setup = TrainSetup()
    reqs = check_serve(setup, None, 1, 1, 3, 64, 4, 8)[2]  # the same requests whatever the pool
    longest = max(len(r.prompt) + r.max_new - 1 for r in reqs)
    assert longest > 2
    with pytest.raises(ValueError, match=f"--blocks 1 of {longest - 1} tokens cannot hold .* use --blocks 2 or more"):
        check_serve(setup, None, 1, 1, 3, 1, longest - 1, 8)
    check_serve(setup, None, 1, 1, 3, 2, longest - 1, 8)


def test_run_serve_refuses_a_token_budget_within_the_batch_in_one_line_before_any_rank(capsys):
    from playbook.cli import main

    assert main(["run", "serve", "--token-budget", "4", "--max-batch", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and "--token-budget 4 must exceed --max-batch 8" in err[0], err  # not a rank's traceback
