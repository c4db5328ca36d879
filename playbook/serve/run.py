"""``playbook run serve``: tensor-parallel replicas serving requests on real ranks (``--tp T --dp D``).

The ranks form a ``ParallelDims(dp=D, tp=T)`` mesh. Each of the D replicas serves its own requests
(request i goes to replica i mod D) with continuous batching over a paged KV cache
(``playbook.serve.batching``); inside a replica the T ranks hold ``TPGPT`` shards of the reference
GPT (Megatron TP: heads and ffn channels split, two all-reduces per layer per step). Data-parallel
replicas never talk to each other while serving: DP buys requests served, TP buys latency and room
(Pope et al. 2022, arXiv:2211.05102, §3: the TP×DP trade of serving).

Checked against the single process: every request's tokens equal greedy decoding of the reference
``GPT`` without a cache, logits within 1e-5; the tracer's all-reduce bytes per token per
layer equal ``theory.serving.serving.tp_allreduce_bytes``; KV bytes held at every step equal the paged
prediction (whole blocks of each sequence's tokens). The ranks' work: ``serve.ranks``; the
comparison and the report: ``serve.report``.
"""

from __future__ import annotations

from playbook.cluster import default_backend, launch
from playbook.parallel.registry import register
from playbook.serve.checks import _check_alone, _check_attention_dp, check_options, check_quantized, check_serve
from playbook.serve.ranks import serve_on_rank
from playbook.parallel.report import Report
from playbook.serve.report import ParallelDecodeReport, ServeReport, merge, reference
from playbook.serve import quant_ref
from playbook.serve.kv_quant import KV_DTYPES
from playbook.theory.serving.weights import QUANTIZE


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
    parser.add_argument(
        "--quantize", choices=QUANTIZE, default=None, help="block linears in int8 or fp8, one scale per output channel"
    )
    parser.add_argument(
        "--kv-dtype", choices=KV_DTYPES, default="fp32", help="paged KV cache storage; int8/fp8 with per-block scales"
    )
    parser.add_argument(
        "--speculative", type=int, default=0, metavar="K", help="speculative decoding: K draft tokens verified per step"
    )
    parser.add_argument(
        "--draft",
        default=None,
        metavar="MODEL",
        help="with --speculative: self:E (the target's first E layers + its head; default half its layers) "
        "or a preset with the same vocabulary",
    )
    parser.add_argument(
        "--attention-dp",
        action="store_true",
        help="MoE serving layouts (with --ep N, an MoE --model): DP attention (each rank its own requests' whole "
        "KV, experts over all-to-all) beside TP attention (heads split, KV heads replicated past n_kv_heads), "
        "the experts over the same N ranks in both",
    )
    parser.set_defaults(world_size=None)  # implied by the degrees


def implied_world_size(options: dict) -> int:
    if options.get("attention_dp"):
        return options.get("ep", 1)
    return options["dp"] * options["tp"] * options.get("pp", 1) * options.get("ep", 1)


def on_rank(ctx, setup, **options):
    """Rank function in the registry's shape: ``serve_on_rank`` of the setup's model and seed."""
    return serve_on_rank(ctx, cfg=setup.config(), seed=setup.seed, **options)


@register(
    "serve",
    help="serving on real ranks: --tp T --dp D replicas, continuous batching over a paged KV cache",
    arguments=add_arguments,
    world_size=implied_world_size,
    on_rank=on_rank,
    check=check_options,
)
def run_serve(
    setup,
    *,
    world_size: int | None = None,
    backend: str = "auto",
    launch=launch,
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
    quantize: str | None = None,
    kv_dtype: str = "fp32",
    speculative: int = 0,
    draft: str | None = None,
    attention_dp: bool = False,
) -> Report:
    """Serve ``requests`` synthetic requests of ``setup.model`` on dp × tp ranks and compare with the
    reference; ``setup.seed`` draws the weights and the requests. ``pp`` or ``ep`` > 1 (alone):
    pipeline or expert-parallel decoding instead (``serve.pipeline``, ``serve.experts``);
    ``attention_dp``: the MoE serving layouts over ``ep`` ranks (``serve.moe_layouts``). ``quantize``,
    ``kv_dtype``: quantized weights and KV cache, checked against one process running the same
    quantized model (``serve.quant_ref``)."""
    check_quantized(setup.config(), quantize=quantize, kv_dtype=kv_dtype, pp=pp, ep=ep, speculative=speculative)
    if (pp > 1 or ep > 1) and (speculative or draft):
        raise ValueError("--speculative decodes on TP shards in DP replicas here, not with --pp or --ep; drop one")
    if attention_dp:
        from playbook.serve.moe_layouts import MoELayoutsReport, serve_moe_layouts

        _check_attention_dp(world_size, tp=tp, dp=dp, pp=pp, ep=ep)
        result = serve_moe_layouts(setup.config(), ep=ep, seed=setup.seed, rows=requests, launch=launch)
        return MoELayoutsReport("serve attention-dp", ep, result)
    if pp > 1 or ep > 1:
        return _pipeline_or_experts(setup, world_size, tp=tp, dp=dp, pp=pp, ep=ep, launch=launch)
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
        speculative=speculative,
        draft=draft,
    )
    from playbook.serve.drafts import check_speculative
    from playbook.theory.serving.router import route

    draft = check_speculative(cfg, speculative, draft, max_batch=max_batch, token_budget=token_budget)

    backend = default_backend(dims.world) if backend == "auto" else backend
    assign = route([r.prompt for r in reqs], dp=dp, block_size=block_size, policy=router)
    answers = launch(
        on_rank,
        dims.world,
        setup,
        dims=dims,
        requests=reqs,
        n_blocks=blocks,
        block_size=block_size,
        max_batch=max_batch,
        prefix_cache=prefix_cache,
        assign=assign,
        token_budget=token_budget,
        quantize=quantize,
        kv_dtype=kv_dtype,
        speculative=speculative,
        draft=draft,
        backend=backend,
    )
    if quant_ref.is_quantized(quantize, kv_dtype):
        batcher = dict(
            n_blocks=blocks,
            block_size=block_size,
            max_batch=max_batch,
            token_budget=token_budget,
            prefix_cache=prefix_cache,
        )
        want = quant_ref.reference(
            cfg, setup.seed, reqs, assign=assign, dp=dp, quantize=quantize, kv_dtype=kv_dtype, **batcher
        )
        parity = merge(answers, cfg, dims, want)
        parity |= quant_ref.bytes_parity(
            answers, cfg, dims, quantize=quantize, kv_dtype=kv_dtype, block_size=block_size
        )
    else:
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
            "quantize": quantize,
            "kv_dtype": kv_dtype,
            "speculative": speculative,
            "draft": draft,
        },
        replicas,
        speculation(answers) if speculative else None,
    )


def speculation(answers: list[dict]) -> dict:
    """Every replica's drafted, accepted and verify counts summed (one rank per replica), as rates."""
    from playbook.serve.speculative import acceptance

    leads = [a["speculative"] for a in answers if a["coords"]["tp"] == 0]
    return acceptance({k: sum(s[k] for s in leads) for k in leads[0]})


def _pipeline_or_experts(setup, world_size, *, tp: int, dp: int, pp: int, ep: int, launch) -> ParallelDecodeReport:
    _check_alone(world_size, tp=tp, dp=dp, pp=pp, ep=ep)
    if pp > 1:
        from playbook.serve.pipeline import serve_pp

        return ParallelDecodeReport("serve pp", pp, pp, serve_pp(setup.config(), pp=pp, seed=setup.seed, launch=launch))
    from playbook.serve.experts import serve_ep

    return ParallelDecodeReport("serve ep", ep, ep, serve_ep(setup.config(), ep=ep, seed=setup.seed, launch=launch))
