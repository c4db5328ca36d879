"""Speculative decoding over the paged cache: a draft proposes k tokens, the target checks them in one forward.

A decode step reads every weight of the target for one token per sequence: it is memory-bound, so
checking k + 1 tokens of a sequence in one forward costs about what one token does. Speculative
decoding (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", ICML,
§2; Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling",
arXiv:2302.01318) lets a cheap draft propose d₁..d_k one at a time; the target runs once over
[x₀, d₁, …, d_k] (its last emitted token, then the proposals) and gives k + 1 next-token
distributions p₀..p_k; the longest prefix of proposals the target agrees with is kept, plus one token
of the target's own (the correction at the first disagreement, or a bonus after k agreements): a
step emits 1..k + 1 tokens, never fewer than a plain decode step.

- Greedy: d_j is kept while d_j = argmax p_{j−1}, so the emitted tokens are argmax p₀, …, argmax p_m,
  the target's own greedy tokens whatever the draft proposed (``tests/serve/test_serve_speculative.py``).
- Temperature τ > 0 (Leviathan §2.3; Chen, Algorithm 2; ``accept_sampled``): d_j ~ q_j is kept with
  probability min(1, p_{j−1}(d_j) / q_j(d_j)); the first rejected one is replaced by a draw from
  norm(max(0, p_{j−1} − q_j)), and after k acceptances one more token is drawn from p_k. Every emitted
  token is then distributed as the target's own sampling would draw it.

The paged cache (``serve.kv``): the verify reserves k + 1 slots per sequence and writes all their
keys and values; only the m + 1 kept inputs (x₀, d₁..d_m) are counted as written (``advance``), and
the blocks past that length go back to the free list (``trim``): a rejected token's KV is rolled
back, and the slots it used inside a kept block are written again by the next step. The draft keeps
its own pool (its layers' KV), rolled back the same way; the next step first feeds it the emitted
tokens it has not seen (one, or two after k acceptances). Near a request's end k shrinks so that at
most the tokens still wanted are emitted, which keeps a request's worst case (prompt + new − 1
positions, ``serve.batching``'s admission) unchanged.

Under TP the verify is the shards' packed forward (two all-reduces per layer of [T, 1, h], T now
counting k + 1 tokens per decoding request) and the draft is on every rank alike (``serve.drafts``);
random numbers come from one generator per replica, seeded alike on its ranks, so every rank of a
replica draws the same tokens. DP replicas speculate independently.
"""

from __future__ import annotations

import time

import torch

from playbook.serve.batching import BatchRun, ContinuousBatcher
from playbook.serve.kv import PagedKVCache
from playbook.serve.packed import forward_packed


def accept_greedy(drafts: list[int], logits: torch.Tensor) -> list[int]:
    """The emitted tokens of a greedy verify: ``logits`` [k + 1, V] of the target at x₀, d₁..d_k ->
    argmax p₀..argmax p_m, m the number of leading drafts equal to the target's argmax."""
    best = logits.argmax(-1).tolist()  # [k + 1]
    m = 0
    while m < len(drafts) and drafts[m] == best[m]:
        m += 1
    return best[: m + 1]


def accept_sampled(drafts: list[int], p: torch.Tensor, q: torch.Tensor, gen: torch.Generator) -> list[int]:
    """Leviathan et al. 2023, Algorithm 1 (§2.3): ``p`` [k + 1, V] the target's probabilities at x₀..d_k,
    ``q`` [k, V] the draft's from which d₁..d_k were drawn; returns the kept drafts and one token more."""
    kept = []
    for j, d in enumerate(drafts):
        if float(torch.rand((), generator=gen)) * float(q[j, d]) < float(p[j, d]):  # r < p/q, without dividing
            kept.append(d)
            continue
        residual = (p[j] - q[j]).clamp_min(0)  # [V]: what p has that q over-proposed away
        if float(residual.sum()) <= 0:  # p == q to rounding: never rejected in exact arithmetic
            residual = p[j]
        kept.append(int(torch.multinomial(residual / residual.sum(), 1, generator=gen)))
        return kept
    kept.append(int(torch.multinomial(p[len(drafts)], 1, generator=gen)))
    return kept


def rollback(cache: PagedKVCache, seq: int, tokens: int) -> None:
    """Keep the first ``tokens`` positions of ``seq`` in ``cache`` and free the blocks past them."""
    cache.lengths[seq] = tokens
    cache.trim(seq)


class SpeculativeBatcher(ContinuousBatcher):
    """Continuous batching whose decode steps are speculative: ``draft`` (``serve.drafts``) proposes
    ``k`` tokens per decoding request and the target verifies them in the step's one forward (prompt
    chunks packed beside them, as in ``ContinuousBatcher``). ``temperature`` 0 is greedy; above it,
    tokens are sampled with ``seed``'s generator by the rejection rule. ``stats``: drafted, accepted,
    verifies (decoding rows that drafted), tokens those verifies emitted, verifies that kept every draft
    (``acceptance`` turns them into rates)."""

    def __init__(self, model, *, draft, k: int, temperature: float = 0.0, seed: int = 0, **batching):
        if k < 1:
            raise ValueError(f"k={k}: speculative decoding proposes at least 1 token per step; try k=4")
        if temperature < 0:
            raise ValueError(f"temperature={temperature} must be >= 0 (0: greedy)")
        super().__init__(model, **batching)
        self.draft, self.k, self.temperature = draft, k, temperature
        attn = draft.blocks[0].attn
        per_seq = self.cache.blocks_for(model.cfg.max_seq_len)  # the draft never holds more than the target
        self.draft_cache = PagedKVCache(
            n_layers=len(draft.blocks),
            kv_heads=attn.kv_heads,
            head_dim=attn.head_dim,
            n_blocks=self.max_batch * per_seq,
            block_size=self.cache.block_size,
        )
        self.gen = torch.Generator().manual_seed(seed)
        self.stats = {"drafted": 0, "accepted": 0, "verifies": 0, "verify_tokens": 0, "full": 0}
        self._last: dict = {}
        self._fed = 0  # tokens fed to the draft this step

    def _k(self, run: BatchRun, running: dict, i: int) -> int:
        return max(0, min(self.k, running[i].max_new - len(run.tokens[i]) - 1))  # emit no more than wanted

    def _decode_tokens(self, run: BatchRun, running: dict, decoding: list[int]) -> int:
        return sum(self._k(run, running, i) + 1 for i in decoding)

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        return (logits / self.temperature).softmax(-1)  # [..., V]

    def _pick(self, logits: torch.Tensor) -> int:
        """One token from logits [V]: the argmax, or a draw at the temperature."""
        if self.temperature == 0:
            return int(logits.argmax())
        return int(torch.multinomial(self._probs(logits), 1, generator=self.gen))

    def _propose(self, run: BatchRun, running: dict, ks: dict) -> tuple[dict, dict]:
        """k_i draft tokens for each request of ``ks``, batched over requests one round at a time; with
        a temperature also the draft's probabilities [k_i, V] they were drawn from."""
        rows, dc = [i for i in ks if ks[i] > 0], self.draft_cache
        chunks = {}
        for i in rows:
            if i not in dc.tables:
                dc.add(i)
            chunks[i] = [*running[i].prompt, *run.tokens[i]][dc.lengths[i] :]  # emitted, not yet seen by the draft
        drafts, probs = {i: [] for i in rows}, {i: [] for i in rows}
        for j in range(max(ks.values(), default=0)):
            act = [i for i in rows if ks[i] > j]
            starts = [dc.lengths[i] for i in act]
            for i in act:
                dc.reserve(i, len(chunks[i]))
            logits = forward_packed(
                self.draft, [chunks[i] for i in act], starts, self._store(act, starts, dc)
            )  # [n, V]
            self._fed += sum(len(chunks[i]) for i in act)
            for i, row in zip(act, logits):
                dc.advance(i, len(chunks[i]))
                drafts[i].append(self._pick(row))
                chunks[i] = drafts[i][-1:]
                if self.temperature:
                    probs[i].append(self._probs(row))
        return drafts, {i: torch.stack(p) for i, p in probs.items() if p}

    def _accept(self, drafts: list[int], logits: torch.Tensor, q) -> list[int]:
        if self.temperature == 0 or not drafts:
            return accept_greedy(drafts, logits) if self.temperature == 0 else [self._pick(logits[0])]
        return accept_sampled(drafts, self._probs(logits), q, self.gen)

    def _compute(self, run: BatchRun, running: dict, prefilled: dict, decoding: list[int], pending: dict) -> list[int]:
        """Draft, then one target forward over the prompt chunks and every decoding request's
        [x₀, d₁..d_k]; keep the agreeing prefix and the target's next token, roll the rest back."""
        ks = {i: self._k(run, running, i) for i in decoding}
        self._fed = 0
        c0 = time.thread_time()
        drafts, q = self._propose(run, running, ks)
        c1 = time.thread_time()
        ids = [*prefilled, *decoding]
        chunks = [*prefilled.values(), *([run.tokens[i][-1], *drafts.get(i, [])] for i in decoding)]
        starts = [self.cache.lengths[i] for i in ids]
        for i, chunk in zip(ids, chunks):
            self.cache.reserve(i, len(chunk))
        logits = forward_packed(self.model, chunks, starts, self._store(ids, starts), every=True)  # [T, V]
        c2 = time.thread_time()
        emitted, at, accepted = [], 0, {}
        for i, chunk in zip(ids, chunks):
            rows, at = logits[at : at + len(chunk)], at + len(chunk)  # [s, V]: this request's positions
            if i in prefilled:
                self.cache.advance(i, len(chunk), chunk)
                if not pending.get(i):  # its last prompt chunk: the first token
                    self._keep(run, emitted, i, [self._pick(rows[-1])], rows[-1:])
                continue
            seen = len(running[i].prompt) + len(run.tokens[i])  # tokens before this step, x₀ the last
            kept = self._accept(drafts.get(i, []), rows, q.get(i))
            m = len(kept) - 1  # drafts accepted
            self._commit(i, chunk, kept)
            if ks[i]:
                # the draft's pool holds those and d₁..d_{k−1}; of these it keeps the accepted ones
                rollback(self.draft_cache, i, seen + min(m, ks[i] - 1))
                self.stats["drafted"] += ks[i]
                self.stats["accepted"] += m
                self.stats["verifies"] += 1
                self.stats["verify_tokens"] += len(kept)
                self.stats["full"] += m == ks[i]
                accepted[i] = m
            self._keep(run, emitted, i, kept, rows[: len(kept)])
            if len(run.tokens[i]) == running[i].max_new and i in self.draft_cache.tables:
                self.draft_cache.release(i)
        self._last = {
            "drafted": {i: ks[i] for i in accepted},
            "accepted": accepted,
            "verify_tokens": sum(ks[i] + 1 for i in decoding),  # decode tokens through the target
            "draft_cpu_seconds": c1 - c0,  # this thread's CPU time in the draft's forwards (and their bookkeeping)
            "verify_cpu_seconds": c2 - c1,  # in the target's one forward
            # tokens × layers through the target's own (TP) layers while drafting: a self-draft's share
            "draft_layer_tokens": self._fed * len(self.draft.blocks)
            if getattr(self.draft, "shares_target", False)
            else 0,
        }
        return emitted

    def _commit(self, i: int, chunk: list[int], kept: list[int]) -> None:
        """The rollback: of the verified inputs x₀, d₁..d_k only those whose next token was kept
        (x₀, d₁..d_m) count as written, and the blocks past them go back to the pool."""
        self.cache.advance(i, len(kept), chunk[: len(kept)])
        self.cache.trim(i)

    def _keep(self, run: BatchRun, emitted: list, i: int, tokens: list[int], logits: torch.Tensor) -> None:
        run.tokens[i].extend(tokens)
        run.logits[i] = torch.cat([run.logits[i], logits]) if i in run.logits else logits
        emitted.extend([i] * len(tokens))  # a step can give a request several tokens

    def _record(self) -> dict:
        out, self._last = self._last, {}
        empty = {"drafted": {}, "accepted": {}, "verify_tokens": 0, "draft_layer_tokens": 0}
        empty.update(draft_cpu_seconds=0.0, verify_cpu_seconds=0.0)
        return {**empty, **out}


def acceptance(stats: dict) -> dict:
    """From a run's counts: the acceptance rate as vLLM reports it (accepted ÷ drafted), Leviathan et
    al.'s per-token α estimated with the censoring a verify imposes (accepted ÷ (accepted +
    rejections): a verify that kept fewer drafts than it proposed ended in exactly one rejection), and
    the tokens each verify emitted (accepted drafts + the target's one)."""
    drafted, accepted, verifies = stats["drafted"], stats["accepted"], stats["verifies"]
    trials = accepted + verifies - stats["full"]
    return {
        "acceptance_rate": accepted / drafted if drafted else float("nan"),
        "alpha": accepted / trials if trials else float("nan"),
        "tokens_per_verify": stats["verify_tokens"] / verifies if verifies else float("nan"),
        "verifies": verifies,
        "drafted": drafted,
        "accepted": accepted,
    }
