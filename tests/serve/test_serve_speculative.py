"""Speculative decoding on real ranks: greedy speculative tokens are the target's own greedy tokens on
every request of a trace (TP2, DP2), the KV of rejected drafts is rolled back (blocks held = whole
blocks of the kept tokens at every step; a run without the rollback fails that check), and the
rejection-sampling rule emits the target's distribution (chi-square at a fixed seed)."""

import pytest
import torch

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.model.gpt import GPT
from playbook.parallel.training import TrainSetup
from playbook.serve.batching import Request, make_requests
from playbook.serve.drafts import check_speculative, make_draft
from playbook.serve.generate import greedy_without_cache
from playbook.serve.kv import PagedKVCache
from playbook.serve.ranks import serve_on_rank
from playbook.serve.run import run_serve
from playbook.serve.speculative import SpeculativeBatcher, accept_sampled, acceptance
from playbook.theory.serving import speculative as spec_theory
from playbook.theory.serving.serving import tp_allreduce_bytes
from playbook.theory.serving.workload import poisson_trace

TINY, SMALL = ModelConfig.preset("gpt-tiny"), ModelConfig.preset("gpt-small")


def greedy_of(cfg, seed, requests):
    model = GPT(cfg, seed=seed).eval()
    return {r.id: greedy_without_cache(model, torch.tensor([r.prompt]), r.max_new) for r in requests}


def trace(cfg, n=6, seed=2):
    """Requests arriving one per step, long enough to speculate several times each."""
    return make_requests(n, cfg.vocab_size, seed=seed, new=(6, 14))


def no_block_past_kept_tokens(steps, block_size: int) -> bool:
    """After every step each running request holds exactly the blocks of its kept tokens."""
    return all(len(s["tables"][i]) == -(-s["lengths"][i] // block_size) for s in steps for i in s["tables"])


def check_exact(answers, want):
    drafted = accepted = 0
    for a in answers:
        for rid, tokens in a["tokens"].items():
            assert tokens == want[rid][0][0].tolist(), f"request {rid} on rank {a['rank']}"
            assert (a["logits"][rid] - want[rid][1][0]).abs().max() < 1e-5
        drafted += a["speculative"]["drafted"]
        accepted += a["speculative"]["accepted"]
    assert 0 < accepted < drafted  # drafts were accepted and rejected: both paths ran


@pytest.mark.parametrize("draft", ["self:1", "gpt-tiny-tied"])
def test_greedy_speculative_tokens_are_the_targets_on_tp2(ranks2, draft):
    reqs = trace(TINY)
    answers = ranks2.run(
        serve_on_rank,
        cfg=TINY,
        seed=0,
        dims=ParallelDims(tp=2),
        requests=reqs,
        n_blocks=24,
        block_size=4,
        max_batch=4,
        speculative=3,
        draft=draft,
    )
    want = greedy_of(TINY, 0, reqs)
    for a in answers:
        for rid, tokens in a["tokens"].items():
            assert tokens == want[rid][0][0].tolist(), f"request {rid} on rank {a['rank']}"
            assert (a["logits"][rid] - want[rid][1][0]).abs().max() < 1e-5
        assert all(s["kv_bytes"] == s["kv_predicted"] for s in a["steps"])
        assert no_block_past_kept_tokens(a["steps"], 4)
        assert a["steps"][-1]["free_blocks_after"] == 24  # every block back, rejected ones included
    s = answers[0]["speculative"]
    assert answers[1]["speculative"] == s  # both shards drafted and accepted the same
    if draft == "self:1":
        assert 0 < s["accepted"] < s["drafted"]
    # the self-draft's TP layers all-reduce too: bytes per token per layer still 2 × [1, h] all-reduces
    a = answers[0]
    per_token = tp_allreduce_bytes(TINY, tokens=1, tp=2, act_bytes=4)
    assert a["layer_bytes"] == pytest.approx(a["computed"] * TINY.n_layers * per_token)


@pytest.mark.parametrize("prefix_cache", [False, True], ids=["paged", "prefix-cache"])
def test_greedy_speculative_tokens_are_the_targets_on_dp2(ranks2, prefix_cache):
    t = poisson_trace(n=8, rate=1.0, groups=2, prefix=8, suffix=(2, 6), new=(6, 12), vocab=SMALL.vocab_size, seed=1)
    reqs = [Request(i, x.prompt, x.max_new, x.arrival) for i, x in enumerate(t)]
    answers = ranks2.run(
        serve_on_rank,
        cfg=SMALL,
        seed=0,
        dims=ParallelDims(dp=2),
        requests=reqs,
        n_blocks=32,
        block_size=2,
        max_batch=3,
        prefix_cache=prefix_cache,
        speculative=4,
        draft="self:3",
    )
    want = greedy_of(SMALL, 0, reqs)
    assert sorted(r for a in answers for r in a["tokens"]) == [r.id for r in reqs]
    check_exact(answers, want)
    for a in answers:
        assert no_block_past_kept_tokens(a["steps"], 2)  # with shared prefix blocks too
        if not prefix_cache:
            assert all(s["kv_bytes"] == s["kv_predicted"] for s in a["steps"])
    if prefix_cache:
        assert sum(sum(a["cached"].values()) for a in answers) > 0  # shared prefixes were found


def test_sampled_speculative_ranks_of_a_replica_draw_alike(ranks2):
    reqs = trace(TINY, n=4)
    answers = ranks2.run(
        serve_on_rank, cfg=TINY, seed=0, dims=ParallelDims(tp=2), requests=reqs, n_blocks=24, block_size=4,
        max_batch=4, speculative=2, draft="self:1", temperature=0.8,
    )  # fmt: skip
    assert answers[0]["tokens"] == answers[1]["tokens"]
    assert all(len(answers[0]["tokens"][r.id]) == r.max_new for r in reqs)


def rollback_run(cfg=SMALL, k=6, block_size=2):
    """One process, a draft accepted rarely (gpt-small's first layer) and long proposals in small
    blocks, so that rejected drafts fill whole blocks."""
    model = GPT(cfg, seed=0).eval()
    reqs = make_requests(5, cfg.vocab_size, seed=4, new=(8, 16))
    b = SpeculativeBatcher(model, draft=make_draft("self:1", model, seed=0), k=k, n_blocks=48, block_size=block_size)
    return b, b.run(reqs), reqs


def rollback_problems(b, run, reqs) -> list[str]:
    want = greedy_of(b.model.cfg, 0, reqs)
    out = [f"request {r.id}: other tokens" for r in reqs if run.tokens[r.id] != want[r.id][0][0].tolist()]
    out += [
        f"step {s['step']}: KV held != whole blocks of kept tokens"
        for s in run.steps
        if s["kv_bytes"] != s["kv_predicted"]
    ]
    if not no_block_past_kept_tokens(run.steps, b.cache.block_size):
        out.append("a request held blocks past its kept tokens")
    if len(b.cache.free) != b.cache.n_blocks or len(b.draft_cache.free) != b.draft_cache.n_blocks:
        out.append("blocks left held after every request finished")
    return out


def test_rejected_drafts_give_their_blocks_back():
    b, run, reqs = rollback_run()
    assert rollback_problems(b, run, reqs) == []
    s = acceptance(b.stats)
    assert s["accepted"] < s["drafted"] - 2 * b.cache.block_size  # enough rejected for whole blocks


def test_the_rollback_check_fails_without_the_rollback(monkeypatch):
    """The bug on purpose: rejected drafts' blocks kept (trim does nothing): the check above goes red."""
    monkeypatch.setattr(PagedKVCache, "trim", lambda self, seq: [])
    b, run, reqs = rollback_run()
    assert any("KV held" in p for p in rollback_problems(b, run, reqs))


def test_the_token_check_fails_when_rejected_kv_is_counted(monkeypatch):
    """The other bug: every verified input's KV counted as written, the rejected drafts' included."""

    def commit_all(self, i, chunk, kept):
        self.cache.advance(i, len(chunk), chunk)
        self.cache.trim(i)

    monkeypatch.setattr(SpeculativeBatcher, "_commit", commit_all)
    b, run, reqs = rollback_run(k=3, block_size=4)
    assert any("other tokens" in p for p in rollback_problems(b, run, reqs))


# ---- sampling ------------------------------------------------------------------------------------
def chi_square(counts: torch.Tensor, p: torch.Tensor) -> tuple[float, int]:
    return spec_theory.chi_square(counts.tolist(), p.tolist())


def first_tokens(rule, draws=20000, seed=0, temperature=0.1):
    """The first token each of ``draws`` speculative steps (k = 1) emits on one prefix, by ``rule``;
    and the target's own next-token probabilities there. At temperature 0.1: the random weights' logits
    are nearly flat, so at 1 the draft's q and the target's p would hardly differ and no rule could fail."""
    model = GPT(TINY, seed=0).eval()
    draft = make_draft("self:1", model, seed=0)
    prefix = torch.tensor([[5, 17, 33, 2, 40, 9]])
    with torch.no_grad():
        x = draft.embed(prefix)
        for block in draft.blocks:
            x = block(x)
        q = (draft.head(x)[0, -1] / temperature).softmax(-1)  # [V]
        p0 = (model(prefix)[0, -1] / temperature).softmax(-1)  # [V]
    gen = torch.Generator().manual_seed(seed)
    p = torch.stack([p0, p0])  # [2, V]: the bonus row is never the first token
    counts = torch.zeros(TINY.vocab_size)
    for d in torch.multinomial(q, draws, replacement=True, generator=gen).tolist():
        counts[rule([d], p, q[None], gen)[0]] += 1
    return counts, p0


def resample_from_target(drafts, p, q, gen):
    """A wrong rule: on rejection draw from p instead of norm(max(0, p − q))."""
    d = drafts[0]
    if float(torch.rand((), generator=gen)) * float(q[0, d]) < float(p[0, d]):
        return [d]
    return [int(torch.multinomial(p[0], 1, generator=gen))]


def test_rejection_sampling_emits_the_targets_distribution():
    n = 20000
    counts, p = first_tokens(accept_sampled, draws=n)
    stat, df = chi_square(counts, p)
    assert stat < spec_theory.chi_square_threshold(df), (stat, df)
    # total variation: E[TV] <= ½ Σ √(p/n) (Jensen per cell), and one draw moves TV by at most 1/n,
    # so it exceeds its mean by 0.015 with probability <= exp(−2 n 0.015²) ≈ 1e-4 (McDiarmid 1989)
    tv = 0.5 * float((counts / n - p).abs().sum())
    assert tv < 0.5 * float((p / n).sqrt().sum()) + 0.015, tv
    for wrong in (resample_from_target, lambda d, p, q, g: d):  # both wrong rules fail the same test
        counts, p = first_tokens(wrong, draws=8000)
        assert chi_square(counts, p)[0] > spec_theory.chi_square_threshold(chi_square(counts, p)[1])


def test_bad_combinations_are_refused_in_one_line():
    cases = [
        (dict(speculative=0, draft="self:1"), "--draft self:1 drafts for speculative decoding"),
        (dict(speculative=40, draft=None), "--speculative 40 must be 1..16"),
        (dict(speculative=2, draft="self:2"), "1 <= E < 2"),
        (dict(speculative=2, draft="gpt-small"), "vocabulary of 128 tokens, gpt-tiny of 64"),
        (dict(speculative=2, draft="gpt-huge"), "neither self:E"),
    ]
    for options, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            check_speculative(TINY, **options, max_batch=4, token_budget=None)
    with pytest.raises(ValueError, match="must exceed --max-batch 4 × \\(--speculative 3 \\+ 1\\) = 16"):
        check_speculative(TINY, 3, None, max_batch=4, token_budget=12)
    assert check_speculative(TINY, 3, None, max_batch=4, token_budget=None) == "self:1"
    with pytest.raises(ValueError, match="not with --pp or --ep"):
        run_serve(TrainSetup(), pp=2, speculative=2)


def test_run_serve_speculative_report():
    report = run_serve(TrainSetup(), tp=1, dp=2, requests=4, speculative=2, draft="self:1")
    assert report.problem() is None and report.parity["tokens_identical"]
    sp = report.speculative
    assert sp["verifies"] > 0 and 1 <= sp["tokens_per_verify"] <= 3
    assert "tokens per verify" in report.summary()


def test_speculation_with_chunked_prefill_counts_k_plus_1_tokens_per_decode():
    model = GPT(TINY, seed=0).eval()
    reqs = make_requests(5, TINY.vocab_size, seed=6, prompt=(10, 30), new=(6, 12))
    b = SpeculativeBatcher(model, draft=make_draft("self:1", model, seed=0), k=3, n_blocks=64, token_budget=20)
    run = b.run(reqs)
    want = greedy_of(TINY, 0, reqs)
    assert all(run.tokens[r.id] == want[r.id][0][0].tolist() for r in reqs)
    for s in run.steps:  # the decodes' k + 1 tokens each and the prompt chunks share the budget
        assert s["verify_tokens"] + s["prefill_tokens"] <= 20
    prefilling = [sum(r.id in s["prefilled"] for s in run.steps) for r in reqs]
    assert max(prefilling) > 1  # some prompt was chunked over several steps


def test_measured_table_has_every_k_and_consistent_counts():
    from playbook.serve.spec_bench import measure

    out = measure(GPT(TINY, seed=0).eval(), draft="self:1", ks=(1, 3), requests=2, new=(6, 8), repeats=2)
    assert [r["k"] for r in out["rows"]] == [1, 3]
    for r in out["rows"]:
        assert 1 <= r["tokens_per_verify"] <= r["k"] + 1 and 0 <= r["acceptance_rate"] <= 1
        assert r["speedup_measured"] > 0 and r["speedup_predicted"] > 0 and r["draft_cost"] > 0
    assert set(out["load"]) == {"before", "after"}


def test_serve_bench_reports_acceptance_and_tokens_per_verify(ranks2):
    from playbook.serve.serve_bench import BENCH_KEYS, serve_bench, summary

    rep = serve_bench(TINY, dp=2, requests=6, rate=1.0, speculative=2, draft="self:1", ranks=ranks2)
    assert tuple(rep) == BENCH_KEYS and rep["tokens_identical"]
    sp = rep["speculative"]
    assert sp["k"] == 2 and sp["draft"] == "self:1" and 1 <= sp["tokens_per_verify"] <= 3 and sp["verifies"] > 0
    assert "tokens per verify" in summary(rep)
    assert serve_bench(TINY, dp=2, requests=2, ranks=ranks2)["speculative"] is None
