"""What each rank does in ``playbook run serve``: build its model (the seeded reference GPT, or its
``TPGPT`` shard over the mesh's tp group), then greedy-decode (``greedy_on_rank``) or serve by
continuous batching (``serve_on_rank``) the requests of its replica, and count the bytes its TP
layers all-reduced (``layer_allreduce_bytes``).
"""

from __future__ import annotations

import functools

import torch

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.model.gpt import GPT
from playbook.serve.batching import ContinuousBatcher, Request
from playbook.serve.generate import greedy
from playbook.serve.quant import quantize_model, weight_bytes


@functools.lru_cache(maxsize=2)
def _reference_model(cfg: ModelConfig, seed: int) -> GPT:
    """The seeded reference GPT, built once per rank process: a ``Ranks`` pool serving several
    layouts in turn slices every TP shard from the same weights instead of initialising them again.
    Serving never writes to it (inference only, ``torch.no_grad``)."""
    return GPT(cfg, seed=seed).eval()


def build(ctx, cfg: ModelConfig, seed: int, dims: ParallelDims):
    """This rank's model: the reference GPT, or its TPGPT shard over the mesh's tp group."""
    mesh = ctx.mesh_for(dims)
    ref = _reference_model(cfg, seed)
    if dims.tp == 1:
        return ref, mesh
    from playbook.parallel.tp.model import TPGPT

    return TPGPT(ref, mesh.group("tp")).eval(), mesh


def layer_allreduce_bytes(spans, window: str = "decode") -> float:
    """Bytes this rank sent in all-reduces inside TP layer regions (``tp:layer...`` spans) during
    the compute spans whose name starts with ``window``: the per-layer traffic of decoding."""
    spans = [s if isinstance(s, dict) else s.as_dict() for s in spans]
    windows = [s for s in spans if s["kind"] == "compute" and s["name"].startswith(window + " ")]
    layers = [s for s in spans if s["kind"] == "compute" and s["name"].startswith("tp:layer")]
    total = 0.0
    for c in spans:
        if c["kind"] != "comm" or c["name"] != "all_reduce":
            continue
        if any(w["start"] <= c["start"] <= w["end"] for w in windows) and any(
            r["start"] <= c["start"] and c["end"] <= r["end"] for r in layers
        ):
            total += c["sent_bytes"]
    return total


def greedy_on_rank(ctx, *, cfg: ModelConfig, seed: int, dims: ParallelDims, prompts: torch.Tensor, new_tokens: int):
    """Each replica greedy-decodes its rows of ``prompts`` [R, p] (row i on replica i mod dp) with a
    contiguous KV cache; returns its rows' tokens and logits, timings and the layer all-reduce bytes."""
    model, mesh = build(ctx, cfg, seed, dims)
    rows = [i for i in range(prompts.shape[0]) if i % dims.dp == mesh.coords["dp"]]
    out = greedy(model, prompts[rows], new_tokens)
    return {
        "rank": ctx.rank,
        "coords": mesh.coords,
        "rows": rows,
        "tokens": out.tokens,
        "logits": out.logits,
        "prefill_seconds": out.prefill_seconds,
        "step_seconds": out.step_seconds,
        "kv_bytes": out.kv_bytes,
        "decoded": len(rows) * (new_tokens - 1),
        "layer_bytes": layer_allreduce_bytes(ctx.tracer.spans),
    }


def serve_on_rank(
    ctx,
    *,
    cfg: ModelConfig,
    seed: int,
    dims: ParallelDims,
    requests: list[Request],
    n_blocks: int,
    block_size: int,
    max_batch: int,
    prefix_cache: bool = False,
    assign: list[int] | None = None,
    token_budget: int | None = None,
    quantize: str | None = None,
    kv_dtype: str = "fp32",
    speculative: int = 0,
    draft: str | None = None,
    temperature: float = 0.0,
):
    """Each replica serves its requests (``assign[i]``, a router's choice; default i mod dp) by
    continuous batching, with a prefix cache of its own if asked, and with ``speculative`` k > 0
    speculative decode steps drafted by ``draft`` (``serve.speculative``; ``temperature`` > 0 samples
    by the rejection rule instead of greedy); returns tokens, logits, prompt
    tokens found cached and the step records of this rank, and its layer all-reduce bytes while decoding.
    ``quantize`` ("int8", "fp8"): the block linears quantized from the whole reference
    (``serve.quant``); ``kv_dtype``: the paged cache's storage (``serve.kv_quant``)."""
    model, mesh = build(ctx, cfg, seed, dims)
    if quantize:
        model = quantize_model(model, quantize, reference=_reference_model(cfg, seed))
    where = assign if assign is not None else [r.id % dims.dp for r in requests]
    mine = [r for r in requests if where[r.id] == mesh.coords["dp"]]
    options = dict(
        n_blocks=n_blocks,
        block_size=block_size,
        max_batch=max_batch,
        prefix_cache=prefix_cache,
        token_budget=token_budget,
        kv_dtype=kv_dtype,
    )
    if speculative:
        from playbook.serve.drafts import make_draft
        from playbook.serve.speculative import SpeculativeBatcher

        batcher = SpeculativeBatcher(
            model,
            draft=make_draft(draft, model, seed=seed),
            k=speculative,
            temperature=temperature,
            seed=seed + mesh.coords["dp"],  # one stream per replica, the same on each of its TP ranks
            **options,
        )
    else:
        batcher = ContinuousBatcher(model, **options)
    run = batcher.run(mine)
    return {
        "rank": ctx.rank,
        "coords": mesh.coords,
        "tokens": run.tokens,
        "logits": run.logits,
        "cached": run.cached,
        "evictions": getattr(batcher.cache, "evictions", 0),
        "steps": run.steps,
        "decoded": sum(len(s["decoded"]) for s in run.steps),
        # tokens through the target's layers, in whole-model units: a speculative step's k + 1 per decoding
        # request, and a self-draft's tokens × its share of the layers
        "computed": sum(
            s.get("verify_tokens", len(s["decoded"]))
            + s["prefill_tokens"]
            + s.get("draft_layer_tokens", 0) / cfg.n_layers
            for s in run.steps
        ),
        "layer_bytes": layer_allreduce_bytes(ctx.tracer.spans, window="step"),  # every token of every step
        "weight_bytes": weight_bytes(model),  # measured off the tensors, quantized or not
        "block_bytes": batcher.cache.block_bytes,
        "speculative": getattr(batcher, "stats", None),  # drafted, accepted, verifies (``serve.speculative``)
    }
