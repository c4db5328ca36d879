"""Greedy generation with a KV cache, for our GPT in one process and for its tensor-parallel shards.

A forward over new tokens only: each layer projects them (``Attention.project``: the reference's
own weights, or ``TPGPT``'s column shards entered through Megatron's f), rotates them at their
absolute positions (RoPE), appends their keys and values to the cache, attends over every cached
token, and leaves through ``o_proj`` (with TP, the row-parallel layer's all-reduce). The MLP and the
head are the model's own. So the same code decodes on one process and on t ranks; with TP each
decoded token costs two all-reduces of [batch, 1, hidden] per layer (Shoeybi et al. 2019; Pope et
al. 2022, arXiv:2211.05102, §3.2), plus one for the vocab-parallel embedding and an all-gather of
the logit shards for the argmax.

Prefill (the prompt in one forward) is compute-heavy; each decode step is one token per sequence.
``greedy_without_cache`` reruns the whole sequence each step, the check that the cache changes
nothing but the cost.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import torch

from playbook.cluster.trace import tracer as trace
from playbook.parallel.comm import all_gather
from playbook.serve.kv import KVCache

# store(row, k [g, s, d], v [g, s, d]) -> (K, V) [g, n, d]: every cached token of that row, these included
Store = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """softmax(q kᵀ/√d + mask) v for s new queries at positions start..start+s−1 over n = start + s
    cached keys. q: [b, a, s, d]; k, v: [b, g, n, d] (query head j reads KV head j // (a/g)).
    Same arithmetic as ``model.attention.causal_attention``, whose mask is this one with start = 0."""
    b, heads, s, d = q.shape
    kv_heads, n = k.shape[1], k.shape[2]
    k = k[:, :, None].expand(b, kv_heads, heads // kv_heads, n, d).reshape(b, heads, n, d)  # [b, a, n, d]
    v = v[:, :, None].expand(b, kv_heads, heads // kv_heads, n, d).reshape(b, heads, n, d)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))  # [b, a, s, n]
    future = torch.ones(s, n, dtype=torch.bool).triu(start + 1)  # key j > start + i is in query i's future
    return scores.masked_fill(future, float("-inf")).softmax(-1) @ v  # [b, a, s, d]


def attend(attn, x: torch.Tensor, starts: list[int], store: Store) -> torch.Tensor:
    """One attention block over cached keys: x [n, s, h] (n rows, s new tokens each, every row
    starting at position ``starts[0]``; rows at different positions go through ``serve.packed``)
    -> [n, s, h]. ``attn``: an ``Attention`` or a ``TPAttention``."""
    q, k, v = attn.project(x)  # [n, s, a*d], [n, s, g*d] (a, g: this rank's heads)
    n, s = q.shape[:2]
    a, g, d = attn.n_heads, attn.kv_heads, attn.head_dim
    q = q.view(n, s, a, d).transpose(1, 2)  # [n, a, s, d]
    k = k.view(n, s, g, d).transpose(1, 2)  # [n, g, s, d]
    v = v.view(n, s, g, d).transpose(1, 2)  # [n, g, s, d]
    if len(set(starts)) != 1:
        raise ValueError(f"rows at different positions {starts}: pack them with serve.packed.forward_packed")
    pos = torch.arange(starts[0], starts[0] + s)  # [s]
    q, k = attn.rope(q, pos), attn.rope(k, pos)  # [n, a, s, d], [n, g, s, d]
    cached = [store(i, k[i], v[i]) for i in range(n)]  # each ([g, N, d], [g, N, d]), N = starts[0] + s
    keys, values = torch.stack([c[0] for c in cached]), torch.stack([c[1] for c in cached])  # [n, g, N, d]
    y = cached_attention(q, keys, values, starts[0])  # [n, a, s, d]
    y = y.transpose(1, 2).reshape(n, s, a * d)  # [n, s, a*d]
    return attn.o_proj(y)  # [n, s, h]; TP: the row-parallel all-reduce


def full_logits(model, logits: torch.Tensor) -> torch.Tensor:
    """The whole vocabulary: a ``TPGPT``'s logit shards [n, s, V/t] are all-gathered along the vocabulary."""
    group = getattr(model, "group", None)
    if group is None:
        return logits  # [n, s, V]
    return all_gather(logits, 2, group, "head", "forward")  # [n, s, V]


def forward_step(model, tokens: torch.Tensor, starts: list[int], store_for: Callable[[int], Store]) -> torch.Tensor:
    """tokens [n, s] at positions starts[i].. -> logits [n, s, V]; ``store_for(layer)`` keeps the KV."""
    x = model.embed(tokens)  # [n, s, h]
    for layer, block in enumerate(model.blocks):
        x = x + attend(block.attn, block.attn_norm(x), starts, store_for(layer))  # [n, s, h]
        x = x + block.mlp(block.mlp_norm(x))  # [n, s, h]
    return full_logits(model, model.head(x))  # [n, s, V]


def contiguous_store(cache: KVCache, layer: int) -> Store:
    return lambda row, k, v: cache.extend(layer, row, k, v)


@dataclass
class Generation:
    """Greedy output of a batch: tokens [b, new], the logits each was chosen from [b, new, V], and
    wall seconds of the prefill and of each decode step."""

    tokens: torch.Tensor
    logits: torch.Tensor
    prefill_seconds: float = 0.0
    step_seconds: list[float] = field(default_factory=list)
    kv_bytes: int = 0


def _span(name: str):
    tracer = trace.current()
    return tracer.span(name) if tracer is not None else nullcontext()


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, new_tokens: int) -> Generation:
    """Prefill ``prompt`` [b, p], then ``new_tokens − 1`` decode steps of one token per row, each the
    argmax of the last logits. Traced as spans "prefill" and "decode k" (decode step k)."""
    b, p = prompt.shape
    if p + new_tokens - 1 > model.cfg.max_seq_len:
        raise ValueError(
            f"prompt {p} + {new_tokens} new tokens exceeds max_seq_len={model.cfg.max_seq_len}; "
            f"generate at most {model.cfg.max_seq_len - p + 1} tokens"
        )
    cache = KVCache(len(model.blocks), b)
    t0 = time.perf_counter()
    with _span("prefill"):
        logits = forward_step(model, prompt, [0] * b, lambda layer: contiguous_store(cache, layer))[:, -1]  # [b, V]
    prefill = time.perf_counter() - t0
    out, kept, steps = [logits.argmax(-1)], [logits], []
    for k in range(new_tokens - 1):
        t0 = time.perf_counter()
        with _span(f"decode {k}"):
            logits = forward_step(model, out[-1][:, None], [p + k] * b, lambda layer: contiguous_store(cache, layer))[
                :, -1
            ]
        steps.append(time.perf_counter() - t0)
        out.append(logits.argmax(-1))  # [b]
        kept.append(logits)
    return Generation(torch.stack(out, 1), torch.stack(kept, 1), prefill, steps, cache.nbytes())


@torch.no_grad()
def greedy_without_cache(model, prompt: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same greedy decoding by rerunning the reference ``GPT`` over the whole sequence every
    step (no cache): (tokens [b, new], logits [b, new, V])."""
    seq, out, kept = prompt, [], []
    for _ in range(new_tokens):
        logits = model(seq)[:, -1]  # [b, V]
        out.append(logits.argmax(-1))
        kept.append(logits)
        seq = torch.cat([seq, out[-1][:, None]], 1)  # [b, p + k + 1]
    return torch.stack(out, 1), torch.stack(kept, 1)
