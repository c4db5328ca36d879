"""Prefix caching: the paged cache's hits and evictions equal a brute-force reference on random
traces, and decoding with it gives the tokens of decoding without any cache, in one process, under
TP and across DP replicas behind either router."""

import random

import pytest
import torch

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.model.gpt import GPT
from playbook.serve.ranks import serve_on_rank
from playbook.serve.batching import ContinuousBatcher, Request
from playbook.serve.generate import greedy_without_cache
from playbook.serve.prefix import PrefixKVCache
from playbook.theory.serving.router import route
from playbook.theory.serving.prefix_cache import ReferencePrefixCache, simulate
from playbook.theory.serving.workload import conversations

TINY = ModelConfig.preset("gpt-tiny")


def trace_requests(n=6, seed=0, vocab=TINY.vocab_size, **kw):
    options = dict(groups=2, turns=2, system=9, user=(1, 4), answer=(1, 3), new=(2, 4))
    t = conversations(n=n, vocab=vocab, seed=seed, **{**options, **kw})
    return [Request(i, r.prompt, r.max_new, r.arrival) for i, r in enumerate(t)]


@pytest.mark.parametrize("seed", range(6))
def test_hits_and_evictions_equal_the_brute_force_reference_on_random_traces(seed):
    rng = random.Random(seed)
    bs, n_blocks = rng.choice([2, 3, 4]), rng.randint(6, 14)
    cache = PrefixKVCache(n_layers=1, kv_heads=1, head_dim=1, n_blocks=n_blocks, block_size=bs)
    ref = ReferencePrefixCache(n_blocks, bs)
    stems = [[rng.randrange(3) for _ in range(rng.randint(0, 3 * bs))] for _ in range(3)]
    live, hits, want = {}, [], []
    for seq in range(60):
        if live and (rng.random() < 0.4 or len(live) > 2):  # a sequence grows or leaves
            s = rng.choice(sorted(live))
            if rng.random() < 0.5:
                cache.release(s), ref.release(s)
                live.pop(s)
            else:
                ids = [rng.randrange(3) for _ in range(rng.randint(1, bs + 1))]
                try:
                    cache.reserve(s, len(ids))
                except RuntimeError:
                    with pytest.raises(RuntimeError):
                        ref.reserve(s, len(ids))
                    continue
                ref.reserve(s, len(ids))
                cache.advance(s, len(ids), ids), ref.advance(s, ids)
        prompt = rng.choice(stems) + [rng.randrange(3) for _ in range(rng.randint(1, 2 * bs))]
        hits.append(cache.add(seq, prompt)), want.append(ref.add(seq, prompt))
        live[seq] = True
        assert cache.used_blocks() == ref.in_use() and cache.evictions == ref.evictions
    assert hits == want and sum(hits) > 0 and cache.evictions > 0  # both happened, and agree


def test_prefix_cache_changes_tokens_not_at_all_and_saves_prefill():
    model, reqs = GPT(TINY, seed=0).eval(), trace_requests(4)
    plain = ContinuousBatcher(model, n_blocks=24, block_size=4, max_batch=4).run(reqs)
    batcher = ContinuousBatcher(model, n_blocks=24, block_size=4, max_batch=4, prefix_cache=True)
    run = batcher.run(reqs)
    for r in reqs:
        tokens, logits = greedy_without_cache(model, torch.tensor([r.prompt]), r.max_new)
        assert run.tokens[r.id] == tokens[0].tolist() == plain.tokens[r.id]
        assert (run.logits[r.id] - logits[0]).abs().max() < 1e-5
    # the run's own calls, replayed through the brute-force model, find the same tokens
    assert ReferencePrefixCache(24, 4).replay(batcher.cache.log) == [run.cached[r.id] for r in reqs]
    saved = sum(run.cached.values())
    assert saved > 0 and sum(s["prefill_tokens"] for s in run.steps) == sum(len(r.prompt) for r in reqs) - saved
    assert sum(plain.cached.values()) == 0


def test_a_cache_too_small_evicts_and_the_reference_agrees():
    model, reqs = GPT(TINY, seed=0).eval(), trace_requests(6, seed=1)
    batcher = ContinuousBatcher(model, n_blocks=12, block_size=4, max_batch=2, prefix_cache=True)
    run = batcher.run(reqs)
    ref = ReferencePrefixCache(12, 4)
    assert ref.replay(batcher.cache.log) == [run.cached[r.id] for r in sorted(reqs, key=lambda r: r.arrival)]
    assert batcher.cache.evictions == ref.evictions > 0


def test_prefix_router_keeps_conversations_on_one_replica():
    reqs = trace_requests(8, groups=4)
    prompts = [r.prompt for r in reqs]
    assert route(prompts, dp=2, block_size=4) == [i % 2 for i in range(len(reqs))]
    where = route(prompts, dp=2, block_size=4, policy="prefix")
    for c in range(8):  # turn 2 of conversation c follows turn 1 to its replica
        assert where[c] == where[8 + c]
    with pytest.raises(ValueError, match="not one of round-robin, prefix"):
        route(prompts, dp=2, block_size=4, policy="random")


def test_tp_replicas_with_prefix_caching_on_ranks(ranks4):
    reqs = trace_requests(8, groups=2, system=12)
    model = GPT(TINY, seed=0).eval()
    found = {}
    for policy in ("round-robin", "prefix"):
        where = route([r.prompt for r in reqs], dp=2, block_size=4, policy=policy)
        answers = ranks4.run(
            serve_on_rank,
            cfg=TINY,
            seed=0,
            dims=ParallelDims(dp=2, tp=2),
            requests=reqs,
            n_blocks=24,
            block_size=4,
            max_batch=4,
            prefix_cache=True,
            assign=where,
        )
        for a in answers:
            assert sorted(a["tokens"]) == [r.id for r in reqs if where[r.id] == a["coords"]["dp"]]
            for rid, tokens in a["tokens"].items():
                want = greedy_without_cache(model, torch.tensor([reqs[rid].prompt]), reqs[rid].max_new)
                assert tokens == want[0][0].tolist() and (a["logits"][rid] - want[1][0]).abs().max() < 1e-5
        found[policy] = sum(sum(a["cached"].values()) for a in answers if a["coords"]["tp"] == 0)
    assert found["prefix"] > found["round-robin"]


def test_simulate_counts_what_a_replica_would_find():
    sim = simulate([((1, 2, 3, 4, 5), 2), ((1, 2, 3, 4, 6), 2), ((9, 9, 9, 9, 9), 1)], n_blocks=8, block_size=2)
    assert sim["cached_tokens"] == 4 and sim["prompt_tokens"] == 15 and sim["prefill_tokens"] == 11
    tight = simulate([((1, 2, 3, 4, 5), 2), ((7, 7, 7, 7, 7), 2), ((1, 2, 3, 4, 6), 2)], n_blocks=3, block_size=2)
    assert tight["cached_tokens"] == 0 and tight["evictions"] > 0  # the second prompt pushed the first out


def test_shrunk_layouts_measured_on_ranks_keep_the_budgets_and_the_tokens(ranks2):
    from playbook.serve.prefix_bench import measure, shrunk_blocks

    rows = [{"layout": "a", "blocks_per_replica": 100}, {"layout": "b", "blocks_per_replica": 10_000}]
    budgets = shrunk_blocks(rows, scale_block=16, block_size=4, kv_scale=1 / 32, cap=60)
    assert budgets == {"a": 12, "b": 60}  # 100 · 16 / 32 / 4 = 12.5 -> 12; the second capped
    trace = conversations(n=4, groups=2, turns=2, system=8, user=(1, 4), answer=(1, 3), new=(2, 3), vocab=64)
    got = measure(
        ranks2, TINY, trace, layouts=[("a", 1, 2), ("b", 2, 1)], blocks=budgets, block_size=4, router="prefix"
    )
    model = GPT(TINY, seed=0).eval()
    want = {
        i: greedy_without_cache(model, torch.tensor([t.prompt]), t.max_new)[0][0].tolist() for i, t in enumerate(trace)
    }
    assert all(g["tokens"] == want for g in got) and all(0 < g["hit_rate"] < 1 for g in got)


def test_a_new_requests_own_evictable_hits_are_not_free_room():
    """Issue 48, near-miss 8. 4 blocks of 4 tokens. A (9 tokens, 1 new) ends at step 0: its two full
    prompt blocks wait in the LRU list. B ([30, 31], 4 new: needs ceil(5/4) = 2 blocks) runs from
    step 1 and holds 1 block at step 3, when C (A's 8-token prefix + 1, 2 new: ceil(10/4) = 3 blocks,
    2 of them hits) arrives. Room then: 1 free + 2 LRU = 3, but C's hits are the 2 LRU ones, so
    taking them leaves 1 for B's 1 more and C's 1 new: 2 > 1, C waits until B ends at step 4 (its
    4th token) and is admitted at step 5. Counting its hits as room (2 <= 3) admits it at step 3,
    and B's step 4 finds no block: "KV cache full"."""
    model = GPT(TINY, seed=0).eval()
    stem = list(range(1, 9))
    reqs = [Request(0, stem + [20], 1, 0), Request(1, [30, 31], 4, 0), Request(2, stem + [21], 2, 3)]
    run = ContinuousBatcher(model, n_blocks=4, block_size=4, max_batch=4, prefix_cache=True).run(reqs)
    admitted = {i: k for k, step in enumerate(run.steps) for i in step["admitted"]}
    assert admitted == {0: 0, 1: 1, 2: 5}
    assert run.cached[2] == 8  # both of A's blocks were still there
    for r in reqs:
        want, _ = greedy_without_cache(model, torch.tensor([r.prompt]), r.max_new)
        assert run.tokens[r.id] == want[0].tolist(), r.id
