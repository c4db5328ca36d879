"""``playbook run serve``: tensor-parallel replicas serving requests on real ranks (``--tp T --dp D``).

The ranks form a ``ParallelDims(dp=D, tp=T)`` mesh. Each of the D replicas serves its own requests
(request i goes to replica i mod D) with continuous batching over a paged KV cache
(``playbook.serve.batching``); inside a replica the T ranks hold ``TPGPT`` shards of the reference
GPT (Megatron TP: heads and ffn channels split, two all-reduces per layer per step). Data-parallel
replicas never talk to each other while serving: DP buys requests served, TP buys latency and room
(Pope et al. 2022, arXiv:2211.05102, §3: the TP×DP trade of serving).

Checked against the single process: every request's tokens equal greedy decoding of the reference
``GPT`` without a cache, logits within 1e-5; the tracer's all-reduce bytes per token per
layer equal ``theory.serving.tp_allreduce_bytes``; KV bytes held at every step equal the paged
prediction (whole blocks of each sequence's tokens).
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field

import torch

from playbook.cluster import default_backend, launch
from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.model import GPT
from playbook.parallel.registry import register
from playbook.parallel.serve_checks import _check_alone, check_options, check_serve
from playbook.serve.batching import ContinuousBatcher, Request
from playbook.serve.generate import greedy, greedy_without_cache
from playbook.theory.serving import tp_allreduce_bytes

LOGIT_TOLERANCE = 1e-5


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
):
    """Each replica serves its requests (``assign[i]``, a router's choice; default i mod dp) by
    continuous batching, with a prefix cache of its own if asked; returns tokens, logits, prompt
    tokens found cached and the step records of this rank, and its layer all-reduce bytes while decoding."""
    model, mesh = build(ctx, cfg, seed, dims)
    where = assign if assign is not None else [r.id % dims.dp for r in requests]
    mine = [r for r in requests if where[r.id] == mesh.coords["dp"]]
    batcher = ContinuousBatcher(
        model,
        n_blocks=n_blocks,
        block_size=block_size,
        max_batch=max_batch,
        prefix_cache=prefix_cache,
        token_budget=token_budget,
    )
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
        "computed": sum(len(s["decoded"]) + s["prefill_tokens"] for s in run.steps),  # through the steps' forwards
        "layer_bytes": layer_allreduce_bytes(ctx.tracer.spans, window="step"),  # every token of every step
    }


def reference(cfg: ModelConfig, seed: int, requests: list[Request]) -> dict[int, tuple[list[int], torch.Tensor]]:
    """Greedy decoding of each request by the reference GPT in this process, without a cache."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = GPT(cfg, seed=seed).eval()
        out = {}
        for r in requests:
            tokens, logits = greedy_without_cache(model, torch.tensor([r.prompt]), r.max_new)
            out[r.id] = (tokens[0].tolist(), logits[0])
        return out
    finally:
        torch.set_num_threads(threads)


def merge(answers: list[dict], cfg: ModelConfig, dims: ParallelDims, want: dict) -> dict:
    """Rank results against the reference: token agreement, worst logit difference, all-reduce bytes
    per token per layer measured (every rank, over every step's tokens) and predicted, KV bytes per step."""
    per_layer = tp_allreduce_bytes(cfg, tokens=1, tp=dims.tp, act_bytes=4)
    mismatched, worst, kv = [], 0.0, []
    for a in answers:
        for rid, tokens in a["tokens"].items():
            if tokens != want[rid][0]:
                mismatched.append(rid)
            worst = max(worst, float((a["logits"][rid] - want[rid][1]).abs().max()))
        for s in a["steps"]:
            kv.append(s["kv_predicted"] is None or s["kv_bytes"] == s["kv_predicted"])
    measured = [a["layer_bytes"] / max(a["computed"], 1) / cfg.n_layers for a in answers]
    return {
        "requests": len(want),
        "tokens_identical": not mismatched,
        "mismatched_requests": sorted(set(mismatched)),
        "max_abs_logit_diff": worst,
        "tp_bytes_per_token_per_layer": {"predicted": per_layer, "measured": measured},
        "kv_bytes_match_every_step": all(kv),
        "steps": max(len(a["steps"]) for a in answers),
    }


@dataclass
class ServeReport:
    """What ``playbook run serve --json`` prints."""

    strategy: str
    world_size: int
    backend: str
    layout: str
    parity: dict
    setup: dict = field(default_factory=dict)
    replicas: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def problem(self) -> str | None:
        p = self.parity
        if not p["tokens_identical"]:
            return f"requests {p['mismatched_requests']} generated other tokens than the reference"
        if not p["max_abs_logit_diff"] <= LOGIT_TOLERANCE:
            return f"logits differ by {p['max_abs_logit_diff']:.2e} > {LOGIT_TOLERANCE:g}"
        if not p["kv_bytes_match_every_step"]:
            return "KV bytes held differ from the paged prediction at some step"
        return None

    def summary(self) -> str:
        p, b = self.parity, self.parity["tp_bytes_per_token_per_layer"]
        lines = [
            f"serve {self.layout} on {self.world_size} rank(s), backend {self.backend}: {p['requests']} requests "
            f"in {p['steps']} scheduler steps",
            f"  tokens identical to the reference (greedy, no cache): {p['tokens_identical']}; "
            f"max |logit diff| {p['max_abs_logit_diff']:.2e}",
            f"  TP all-reduce bytes per token per layer: predicted {b['predicted']:,.0f}, measured "
            + ", ".join(f"{x:,.0f}" for x in b["measured"]),
            f"  KV bytes held == paged prediction at every step: {p['kv_bytes_match_every_step']}",
        ]
        for r in self.replicas:
            lines.append(
                f"  replica {r['dp']}: requests {r['requests']}, {r['decoded']} tokens decoded, "
                f"{r['cached']} prompt tokens found cached"
            )
        if self.problem():
            lines.insert(1, f"  PARITY FAILED: {self.problem()}")
        return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per replica")
    parser.add_argument("--dp", type=int, default=1, help="replicas, each serving its own requests")
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages: micro-batched decode (alone)")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel ranks for an MoE model (alone)")
    parser.add_argument("--requests", type=int, default=6, help="requests to serve, one arriving per step")
    parser.add_argument("--blocks", type=int, default=16, help="KV blocks per rank (paged cache)")
    parser.add_argument("--block-size", type=int, default=4, help="tokens per KV block")
    parser.add_argument("--max-batch", type=int, default=4, help="requests decoded together per replica")
    parser.add_argument("--prefix-cache", action="store_true", help="reuse KV blocks of prompt prefixes (vLLM APC)")
    parser.add_argument("--router", default="round-robin", help="which replica serves a request: round-robin, prefix")
    parser.add_argument("--shared-prefix", type=int, default=0, help="tokens of one system prompt before every request")
    parser.add_argument("--token-budget", type=int, default=None, help="tokens per step, chunking long prefills")
    parser.set_defaults(world_size=None)  # implied by the degrees


def implied_world_size(options: dict) -> int:
    return options["dp"] * options["tp"] * options.get("pp", 1) * options.get("ep", 1)


@register(
    "serve",
    help="serving on real ranks: --tp T --dp D replicas, continuous batching over a paged KV cache",
    arguments=add_arguments,
    world_size=implied_world_size,
    on_rank=serve_on_rank,
    predict=tp_allreduce_bytes,
    check=check_options,
)
def run_serve(
    setup,
    *,
    world_size: int | None = None,
    backend: str = "auto",
    tp: int = 1,
    dp: int = 1,
    pp: int = 1,
    ep: int = 1,
    requests: int = 6,
    blocks: int = 16,
    block_size: int = 4,
    max_batch: int = 4,
    prefix_cache: bool = False,
    router: str = "round-robin",
    token_budget: int | None = None,
    shared_prefix: int = 0,
) -> ServeReport:
    """Serve ``requests`` synthetic requests of ``setup.model`` on dp × tp ranks and compare with the
    reference; ``setup.seed`` draws the weights and the requests. ``pp`` or ``ep`` > 1 (alone):
    pipeline or expert-parallel decoding instead (``serve.pipeline``, ``serve.experts``)."""
    if pp > 1 or ep > 1:
        return _pipeline_or_experts(setup, world_size, tp=tp, dp=dp, pp=pp, ep=ep)
    dims, cfg, reqs = check_serve(
        setup,
        world_size,
        tp,
        dp,
        requests,
        blocks,
        block_size,
        max_batch,
        router=router,
        token_budget=token_budget,
        shared_prefix=shared_prefix,
    )
    from playbook.serve.router import route

    backend = default_backend(dims.world) if backend == "auto" else backend
    answers = launch(
        serve_on_rank,
        dims.world,
        cfg=cfg,
        seed=setup.seed,
        dims=dims,
        requests=reqs,
        n_blocks=blocks,
        block_size=block_size,
        max_batch=max_batch,
        prefix_cache=prefix_cache,
        assign=route([r.prompt for r in reqs], dp=dp, block_size=block_size, policy=router),
        token_budget=token_budget,
        backend=backend,
    )
    parity = merge(answers, cfg, dims, reference(cfg, setup.seed, reqs))
    replicas = [
        {
            "dp": a["coords"]["dp"],
            "requests": sorted(a["tokens"]),
            "decoded": a["decoded"],
            "cached": sum(a["cached"].values()),
        }
        for a in answers
        if a["coords"]["tp"] == 0
    ]
    return ServeReport(
        "serve",
        dims.world,
        backend,
        str(dims),
        parity,
        {
            "model": setup.model,
            "seed": setup.seed,
            "tp": tp,
            "dp": dp,
            "requests": requests,
            "blocks": blocks,
            "block_size": block_size,
            "max_batch": max_batch,
            "prefix_cache": prefix_cache,
            "router": router,
            "token_budget": token_budget,
            "shared_prefix": shared_prefix,
        },
        replicas,
    )


def _pipeline_or_experts(setup, world_size, *, tp: int, dp: int, pp: int, ep: int):
    from playbook.serve.report import ParallelDecodeReport

    _check_alone(world_size, tp=tp, dp=dp, pp=pp, ep=ep)
    if pp > 1:
        from playbook.serve.pipeline import serve_pp

        return ParallelDecodeReport("serve pp", pp, pp, serve_pp(setup.config(), pp=pp, seed=setup.seed))
    from playbook.serve.experts import serve_ep

    return ParallelDecodeReport("serve ep", ep, ep, serve_ep(setup.config(), ep=ep, seed=setup.seed))
