"""``playbook serve-bench``: a seeded trace served on real ranks; TTFT, TPOT, e2e p50/p90/p99, goodput.

playbook serve-bench --tp 2 --dp 2 --requests 16 --rate 0.5 --slo-ttft-ms 200 --json
"""

from __future__ import annotations

import argparse
import json

from playbook.cli.checks import check_serving_fits
from playbook.theory.serving.quantized import KV_DTYPES
from playbook.theory.serving.weights import QUANTIZE
from playbook.config import ModelConfig
from playbook.validate import check_output_path, write_output

from playbook.serve.serve_bench import summary

_Formatter = argparse.ArgumentDefaultsHelpFormatter


def cmd_serve_bench(args) -> int:
    from playbook.serve.checks import check_quantized
    from playbook.serve.serve_bench import check, serve_bench

    if args.out:
        check_output_path("--out", args.out, "serve-bench.json", suffix=".json")  # before any rank starts
    cfg = ModelConfig.preset(args.model)
    sizes = dict(tp=args.tp, dp=args.dp, blocks=args.blocks, block_size=args.block_size)
    options = dict(requests=args.requests, max_batch=args.max_batch, token_budget=args.token_budget)
    spec = dict(speculative=args.speculative, draft=args.draft)
    check(
        cfg, **sizes, **options, **spec, slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms
    )  # the options first
    check_quantized(cfg, quantize=args.quantize, kv_dtype=args.kv_dtype, speculative=args.speculative)
    if args.attention_dp:
        from playbook.serve.dp_attention import check_attention_dp

        check_attention_dp(cfg, tp=args.tp, dp=args.dp)
    check_serving_fits(cfg, **sizes)  # then whether this machine holds the run
    report = serve_bench(
        cfg,
        tp=args.tp,
        dp=args.dp,
        seed=args.seed,
        requests=args.requests,
        rate=args.rate,
        groups=args.groups,
        prefix=args.prefix,
        suffix=tuple(args.suffix),
        new=tuple(args.new),
        router=args.router,
        prefix_cache=not args.no_prefix_cache,
        token_budget=args.token_budget,
        blocks=args.blocks,
        block_size=args.block_size,
        max_batch=args.max_batch,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms,
        quantize=args.quantize,
        kv_dtype=args.kv_dtype,
        **spec,
        attention_dp=args.attention_dp,
    )
    if args.out:
        write_output("--out", args.out, json.dumps(report, indent=2))
    print(json.dumps(report, indent=2) if args.json else summary(report))
    return 0 if report["tokens_identical"] else 1


def add_serve_bench(sub) -> None:
    from playbook.theory.serving.router import POLICIES

    p = sub.add_parser(
        "serve-bench",
        help="a seeded request trace on real ranks: latency percentiles, goodput",
        formatter_class=_Formatter,
    )
    p.add_argument("--model", default="gpt-tiny", help=f"one of: {', '.join(ModelConfig.presets())}")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per replica")
    p.add_argument("--dp", type=int, default=2, help="replicas")
    p.add_argument("--seed", type=int, default=0, help="draws the weights and the trace")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--rate", type=float, default=0.5, help="Poisson arrivals per scheduler step")
    p.add_argument("--groups", type=int, default=2, help="shared prompt prefixes")
    p.add_argument("--prefix", type=int, default=16, help="tokens of each shared prefix")
    p.add_argument("--suffix", type=int, nargs=2, default=[2, 12], metavar=("LO", "HI"), help="own prompt tokens")
    p.add_argument("--new", type=int, nargs=2, default=[4, 12], metavar=("LO", "HI"), help="tokens to generate")
    p.add_argument("--router", default="prefix", choices=POLICIES)
    p.add_argument("--no-prefix-cache", action="store_true")
    p.add_argument("--token-budget", type=int, default=None, help="tokens per step (chunked prefill); none: whole")
    p.add_argument("--blocks", type=int, default=64, help="KV blocks per replica")
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--slo-ttft-ms", type=float, default=None)
    p.add_argument("--slo-tpot-ms", type=float, default=None)
    p.add_argument(
        "--quantize",
        choices=QUANTIZE,
        default=None,
        help="block linears in int8/fp8 (per-output-channel scales); predicted latency reads those bytes",
    )
    p.add_argument(
        "--kv-dtype",
        choices=KV_DTYPES,
        default="fp32",
        help="paged KV storage, int8/fp8 with per-block scales; predicted at 16 bits unless 8-bit",
    )
    p.add_argument("--speculative", type=int, default=0, metavar="K", help="speculative decoding: K drafts per step")
    p.add_argument(
        "--draft",
        default=None,
        metavar="MODEL",
        help="with --speculative: self:E (the target's first E layers + its head; none: half its layers) "
        "or a preset with the same vocabulary",
    )
    p.add_argument(
        "--attention-dp",
        action="store_true",
        help="an MoE --model: the --dp replicas are DP-attention ranks (each its own requests' KV) with the experts "
        "split over all of them (ep = dp, all-to-all), MoE layers in lockstep",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", metavar="FILE.json", help="also write the JSON report here")
    p.set_defaults(func=cmd_serve_bench)
