"""One forward over a step's mixed tokens: decode tokens and prefill chunks packed back to back.

A scheduler step of chunked prefill holds one new token of every decoding request and a chunk of
some prompts. Sarathi-Serve (Agrawal et al. 2024, "Taming Throughput-Latency Tradeoff in LLM
Inference with Sarathi-Serve", OSDI, §4, stall-free batching) computes them as *one* batch: the
decode tokens ride along with the prefill chunk, so the weights are read once for all of them and
the step's linear layers run at the chunk's arithmetic intensity. Engines lay such a batch out
flat, the T tokens of many sequences back to back with each sequence's start: every token-wise
operation (embedding, projections, MLP, TP's all-reduces, norms) runs once over all T tokens, and
only attention is per sequence, each segment's queries at its own positions over its own paged KV.

Here the T tokens are rows of one batch [T, 1, h], so the model's own layers (``GPT`` or
``TPGPT``) run on them unchanged; ``attend_packed`` splits them into segments for RoPE and
attention. With TP a step costs 2 all-reduces per layer of [T, 1, h], whatever the mix.
"""

from __future__ import annotations

from typing import Callable

import torch

from playbook.serve.generate import Store, cached_attention, full_logits


def attend_packed(attn, x: torch.Tensor, segments: list[tuple[int, int]], store: Store) -> torch.Tensor:
    """x [T, 1, h]: the new tokens of ``len(segments)`` sequences back to back, segment i being
    (start, length): ``length`` tokens at positions start..start+length−1 -> [T, 1, h]."""
    q, k, v = attn.project(x)  # [T, 1, a*d], [T, 1, g*d], [T, 1, g*d] (a, g: this rank's heads)
    T = q.shape[0]
    a, g, d = attn.n_heads, attn.kv_heads, attn.head_dim
    q = q.view(T, a, d).transpose(0, 1)  # [a, T, d]
    k = k.view(T, g, d).transpose(0, 1)  # [g, T, d]
    v = v.view(T, g, d).transpose(0, 1)  # [g, T, d]
    out, at = [], 0
    for row, (start, s) in enumerate(segments):
        pos = torch.arange(start, start + s)  # [s]
        qi = attn.rope(q[None, :, at : at + s], pos)  # [1, a, s, d]
        ki = attn.rope(k[None, :, at : at + s], pos)[0]  # [g, s, d]
        keys, values = store(row, ki, v[:, at : at + s])  # [g, start + s, d] each
        out.append(cached_attention(qi, keys[None], values[None], start)[0])  # [a, s, d]
        at += s
    y = torch.cat(out, 1).transpose(0, 1).reshape(T, 1, a * d)  # [T, 1, a*d]
    return attn.o_proj(y)  # [T, 1, h]; TP: one row-parallel all-reduce for every token of the step


def forward_packed(
    model, chunks: list[list[int]], starts: list[int], store_for: Callable[[int], Store], *, every: bool = False
) -> torch.Tensor:
    """Sequence i's new tokens ``chunks[i]`` at positions starts[i].., all in one forward ->
    logits [n, V] of each sequence's last new token (``every``: of every new token, [T, V], what a
    speculative verify reads, ``serve.speculative``); ``store_for(layer)`` keeps the KV."""
    if any(not c for c in chunks):
        raise ValueError("every packed sequence needs at least one new token")
    lengths = [len(c) for c in chunks]
    x = model.embed(torch.tensor([t for c in chunks for t in c])[:, None])  # [T, 1, h]
    segments = list(zip(starts, lengths))
    for layer, block in enumerate(model.blocks):
        x = x + attend_packed(block.attn, block.attn_norm(x), segments, store_for(layer))  # [T, 1, h]
        x = x + block.mlp(block.mlp_norm(x))  # [T, 1, h]
    if every:
        return full_logits(model, model.head(x))[:, 0]  # [T, 1, V] -> [T, V]
    last = torch.tensor(lengths).cumsum(0) - 1  # [n]: each sequence's last token
    return full_logits(model, model.head(x[last]))[:, 0]  # [n, 1, V] -> [n, V]
