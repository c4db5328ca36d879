"""Speculative decoding measured on this machine: acceptance per k, and the speed-up beside its prediction.

``measure`` serves one batch of requests (all arriving at step 0, so every step after the first only
decodes) by plain continuous batching and then speculatively for each k, with the same greedy
tokens (checked), and times the decode steps: the measured speed-up is plain decode seconds over
speculative decode seconds, counted as this thread's CPU time (``time.thread_time``: on cores
shared with other processes wall time counts their turns too, the CPU time only this work). The prediction is Leviathan et al.'s (2023, §3; ``theory.serving.speculative``)
from quantities measured apart: the per-token acceptance α of that run, and the costs of one draft
step (c) and of a verify of k + 1 tokens per sequence (v_k) in plain target steps, each the median of
``repeats`` forwards of the same batch over the paged cache (``step_costs``). What the formula leaves
out (the bookkeeping between forwards, the batch shrinking as requests finish) is the gap between them.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from playbook.serve.batching import ContinuousBatcher, make_requests
from playbook.serve.drafts import make_draft
from playbook.serve.kv import PagedKVCache
from playbook.serve.packed import forward_packed
from playbook.serve.speculative import SpeculativeBatcher, acceptance
from playbook.theory.serving.speculative import expected_tokens, speedup


def _pool(model, n_blocks: int, block_size: int) -> PagedKVCache:
    attn = model.blocks[0].attn
    return PagedKVCache(
        n_layers=len(model.blocks),
        kv_heads=attn.kv_heads,
        head_dim=attn.head_dim,
        n_blocks=n_blocks,
        block_size=block_size,
    )


def _store(cache, ids, starts):
    def store_for(layer):
        def store(row, k, v):
            cache.write(layer, ids[row], k, v)  # k, v: [g, s, d]
            return cache.read(layer, ids[row], starts[row] + k.shape[1])  # [g, n, d]

        return store

    return store_for


def timed_forward(model, *, batch: int, context: int, tokens: int, seed: int = 0):
    """A function that runs one packed forward of ``tokens`` new tokens for each of ``batch``
    sequences with ``context`` tokens cached (paged) and returns its CPU seconds (this thread's,
    ``time.thread_time``); the new tokens are never counted as written, so every call is the same."""
    bs = 4
    cache = _pool(model, batch * -(-(context + tokens) // bs), bs)
    gen = torch.Generator().manual_seed(seed)
    ids = list(range(batch))
    prompts = [torch.randint(0, model.cfg.vocab_size, (context,), generator=gen).tolist() for _ in ids]
    for i in ids:
        cache.add(i)
        cache.reserve(i, context + tokens)
    with torch.no_grad():
        forward_packed(model, prompts, [0] * batch, _store(cache, ids, [0] * batch))
    for i in ids:
        cache.advance(i, context)
    new = [p[:tokens] for p in prompts]

    @torch.no_grad()
    def run() -> float:
        t0 = time.thread_time()
        forward_packed(model, new, [context] * batch, _store(cache, ids, [context] * batch), every=True)
        return time.thread_time() - t0

    return run


def step_costs(model, draft, *, batch: int, context: int, ks, repeats: int = 11) -> dict:
    """The draft's step and each verify of k + 1 tokens, in plain target steps of the same batch:
    medians of ``repeats`` rounds, each round timing every forward once (so a change of load while
    measuring falls on all of them alike)."""
    runs = {"plain": timed_forward(model, batch=batch, context=context, tokens=1)}
    runs["draft"] = timed_forward(draft, batch=batch, context=context, tokens=1)
    for k in ks:
        runs[k] = timed_forward(model, batch=batch, context=context, tokens=k + 1)
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(run())
    med = {name: statistics.median(t) for name, t in times.items()}
    return {
        "plain_seconds": med["plain"],
        "draft_cost": med["draft"] / med["plain"],
        "verify_cost": {k: med[k] / med["plain"] for k in ks},
    }


def _breakdown(run, plain) -> dict:
    """A speculative decode step's CPU time in plain decode steps: in the draft's forwards, in the
    verify's, and the rest (choosing, accepting, rolling back, scheduling), which the formula leaves out."""
    steps = [s for s in run.steps if not s["prefill_tokens"]]
    unit = _decode_seconds(plain) / sum(1 for s in plain.steps if not s["prefill_tokens"])
    draft = sum(s["draft_cpu_seconds"] for s in steps) / len(steps) / unit
    check = sum(s["verify_cpu_seconds"] for s in steps) / len(steps) / unit
    return {
        "step_draft": draft,
        "step_verify": check,
        "step_other": _decode_seconds(run) / len(steps) / unit - draft - check,
    }


def _decode_seconds(run) -> float:
    return sum(s["cpu_seconds"] for s in run.steps if not s["prefill_tokens"])


@torch.no_grad()
def measure(
    model,
    *,
    draft: str,
    ks=(1, 2, 3, 4, 6),
    requests: int = 6,
    prompt=(4, 8),
    new=(24, 32),
    seed: int = 0,
    repeats: int = 11,
) -> dict:
    """Rows per k: acceptance rate, α, tokens per verify (measured and from α), speed-up measured and
    predicted, with c and v_k, and a speculative step's CPU time split (draft, verify, the rest) in
    plain steps; plain decoding's tokens/s; the load before and after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as on a rank
    try:
        before = os.getloadavg()[0]
        reqs = make_requests(requests, model.cfg.vocab_size, seed=seed, prompt=prompt, new=new, every=0)
        need = max(len(r.prompt) + r.max_new for r in reqs)
        pool = dict(n_blocks=requests * -(-need // 4), block_size=4, max_batch=requests)
        plain = ContinuousBatcher(model, **pool).run(reqs)
        base = _decode_seconds(plain)
        d = make_draft(draft, model, seed=seed)
        costs = step_costs(model, d, batch=requests, context=sum(prompt) // 2 + sum(new) // 4, ks=ks, repeats=repeats)
        rows = []
        for k in ks:
            b = SpeculativeBatcher(model, draft=d, k=k, seed=seed, **pool)
            run = b.run(reqs)
            if any(run.tokens[r.id] != plain.tokens[r.id] for r in reqs):
                raise AssertionError(f"speculative k={k} emitted other tokens than plain greedy decoding")
            a = acceptance(b.stats)
            rows.append(
                {
                    "k": k,
                    **a,
                    "tokens_per_verify_from_alpha": expected_tokens(a["alpha"], k),
                    "draft_cost": costs["draft_cost"],
                    "verify_cost": costs["verify_cost"][k],
                    "speedup_predicted": speedup(
                        a["alpha"], k, draft_cost=costs["draft_cost"], verify_cost=costs["verify_cost"][k]
                    ),
                    "speedup_measured": base / _decode_seconds(run),
                    **_breakdown(run, plain),
                }
            )
        decoded = sum(len(t) - 1 for t in plain.tokens.values())
        return {
            "draft": draft,
            "requests": requests,
            "rows": rows,
            "plain_tokens_per_s": decoded / base,
            "load": {"before": before, "after": os.getloadavg()[0]},
        }
    finally:
        torch.set_num_threads(threads)
