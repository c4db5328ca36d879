"""Disaggregated prefill and decode: one rank prefills, another decodes, the KV blocks sent between them.

Prefill is compute-bound and decode memory-bound; on the same GPUs a long prefill stalls the
decodes (chapter 7 §4c) and the two phases want different parallel layouts. DistServe (Zhong et
al. 2024, "DistServe: Disaggregating Prefill and Decoding for Goodput-optimized LLM Serving",
OSDI) and Splitwise (Patel et al. 2024, "Splitwise: Efficient Generative LLM Inference Using Phase
Splitting", ISCA) run them on separate GPUs: a prefill instance computes the prompt's KV cache and
first token and ships the cache to a decode instance. The price is that transfer: every layer's
keys and values of the prompt, ``paged_kv_bytes`` for whole blocks (``theory.serving.serving``); it pays
when the link moves it faster than the decode steps a co-located prefill would stall (DistServe §3).

``disagg_on_rank`` on 2 ranks: rank 0 prefills each request into its paged cache and sends the
request's blocks (k and v, [layers, blocks, g, block_size, d] each) and its first token with
``isend``; rank 1 receives them into its own paged cache and decodes greedily. The tracer's isend
bytes of the blocks are the measurement.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from playbook.model.gpt import GPT
from playbook.serve.generate import forward_step
from playbook.serve.kv import PagedKVCache


def paged_store(cache: PagedKVCache, seq: int, start: int):
    """``store_for(layer)`` of ``forward_step`` writing one sequence's new k, v into ``cache``."""

    def store_for(layer):
        def store(row, k, v):  # k, v: [g, s, d]
            cache.write(layer, seq, k, v)
            return cache.read(layer, seq, start + k.shape[1])  # [g, start + s, d]

        return store

    return store_for


@torch.no_grad()
def disagg_on_rank(ctx, *, cfg, seed: int, requests, n_blocks: int = 32, block_size: int = 4) -> dict:
    """Rank 0 prefills and sends, rank 1 receives and decodes; returns tokens (rank 1) and the bytes of
    KV blocks sent (rank 0, from the tracer)."""
    if ctx.world_size != 2:
        raise ValueError(f"disaggregated serving here runs on 2 ranks (prefill, decode), got {ctx.world_size}")
    model = GPT(cfg, seed=seed).eval()
    attn = model.blocks[0].attn
    cache = PagedKVCache(
        n_layers=cfg.n_layers, kv_heads=attn.kv_heads, head_dim=attn.head_dim, n_blocks=n_blocks, block_size=block_size
    )
    shape = lambda nb: (cfg.n_layers, nb, attn.kv_heads, block_size, attn.head_dim)  # noqa: E731
    tokens = {}
    for r in requests:
        p = len(r.prompt)
        cache.add(r.id)
        cache.reserve(r.id, p)
        blocks = torch.tensor(cache.tables[r.id])
        if ctx.rank == 0:
            logits = forward_step(model, torch.tensor([r.prompt]), [0], paged_store(cache, r.id, 0))[0, -1]  # [V]
            k, v = cache.k[:, blocks].contiguous(), cache.v[:, blocks].contiguous()  # [L, nb, g, bs, d]
            first = logits.argmax().reshape(1)  # [1]
            for t in (k, v, first):
                dist.isend(t, 1).wait()
        else:
            k, v, first = (
                torch.empty(shape(len(blocks))),
                torch.empty(shape(len(blocks))),
                torch.empty(1, dtype=torch.long),
            )
            for t in (k, v, first):
                dist.recv(t, 0)
            cache.k[:, blocks], cache.v[:, blocks] = k, v
            cache.advance(r.id, p)
            out = [int(first)]
            for _ in range(r.max_new - 1):
                start = cache.lengths[r.id]
                cache.reserve(r.id, 1)
                step = forward_step(model, torch.tensor([[out[-1]]]), [start], paged_store(cache, r.id, start))
                cache.advance(r.id, 1)
                out.append(int(step[0, -1].argmax()))
            tokens[r.id] = out
        cache.release(r.id)
    sent = [s for s in ctx.tracer.spans if s.kind == "comm" and s.name == "isend"]
    kv_sent = sum(s.sent_bytes for s in sent if s.dtype == "torch.float32")  # the blocks; first tokens are int64
    return {"rank": ctx.rank, "tokens": tokens, "kv_bytes_sent": kv_sent, "sends": len(sent)}
