"""``playbook plan`` and ``playbook serve-plan``: layouts for a cluster, predicted (no ranks start).

playbook plan --model llama-3.1-70b --gpus 64 --hardware h100-sxm --seq-len 8192 --global-batch 512
playbook plan --hf-config data/hf/Qwen2-7B.json --gpus 16
playbook plan --model llama-3.1-70b --gpus 64 --replay --replay-ranks 4   # + the shrunk layout on real ranks
playbook serve-plan --model llama-3.1-70b --gpus 8 --context 8192
"""

from __future__ import annotations

import argparse
import json

from playbook.cli.plan_layout import LABEL_KEY
from playbook.cli.plan_topology import ORDERS, add_topology_flag, mesh_order
from playbook.cli.checks import BadInput
from playbook.cli.plan_life import add_arguments as add_life_arguments, life_for, life_lines
from playbook.config import ModelConfig
from playbook.hardware import MEM_UTIL, Hardware
from playbook.theory.plan.cost import DEFAULT_OVERLAP, OVERLAP_PRESETS
from playbook.theory.plan.schedule import PLAN_SCHEDULES

_Formatter = argparse.ArgumentDefaultsHelpFormatter


def cmd_serve_plan(args) -> int:
    """Every tp × dp layout of ``--gpus`` that holds the model and one ``--context`` sequence: KV
    room, TTFT, time per token and tokens/s from ``playbook.theory.serving.serving``, and which to pick."""
    from playbook.theory.serving.serving import BY_SIZE, RING_STEP
    from playbook.theory.serving.layouts import compare_layouts, recommend

    if args.topology:  # tp priced where its group sits on the topology's levels (cli.plan_topology)
        from playbook.cli.plan_topology import cmd_serve_plan_topology

        return cmd_serve_plan_topology(args, ModelConfig.preset(args.model))
    cfg, hw = ModelConfig.preset(args.model), Hardware.preset(args.hardware)
    if not 1 <= args.context <= cfg.max_seq_len:  # --gpus, --mem-util, --block-size: cli.checks.LIMITS
        raise BadInput(
            f"--context {args.context} must be in 1..{cfg.max_seq_len} "
            f"({args.model}'s max_seq_len); try --context {min(8192, cfg.max_seq_len)}"
        )
    rows = compare_layouts(
        cfg,
        hw,
        gpus=args.gpus,
        context=args.context,
        mem_util=args.mem_util,
        block_size=args.block_size,
        dtype=args.dtype,
        latency=BY_SIZE if args.allreduce == "by-size" else RING_STEP,
    )
    from playbook.cli.serve_plan_moe import moe_json, moe_rows, print_moe

    moe, moe_reason = moe_rows(cfg, hw, args)  # an MoE model: TP against DP attention, experts over every GPU
    if not rows and not any(r["fits"] for r in moe):
        raise BadInput(
            f"{args.model} does not fit {args.gpus} × {args.hardware} with a {args.context}-token sequence at "
            f"any tp <= {hw.devices_per_node}; try more --gpus, a shorter --context or --dtype fp8"
        )
    best, why = recommend(rows) if rows else ({"layout": None}, "no tp × dp replica fits; see the MoE layouts")
    if args.json:
        print(
            json.dumps(
                {
                    "model": args.model,
                    "hardware": args.hardware,
                    "gpus": args.gpus,
                    "context": args.context,
                    "mem_util": args.mem_util,
                    "allreduce": args.allreduce,
                    "layouts": rows,
                    "recommended": best["layout"],
                    "why": why,
                    **moe_json(moe, args),
                },
                indent=2,
            )
        )
        return 0
    print(
        f"{args.model} on {args.gpus} × {args.hardware}, context {args.context}, {args.mem_util:g} of memory, "
        f"{args.dtype} (roofline: 50% of peak FLOP/s, 80% of HBM bandwidth; TP all-reduce: {args.allreduce})"
    )
    print(
        f"  {'layout':<9} {'weights/GPU':>11} {'KV/GPU':>9} {'seqs':>6} {'TTFT':>8} {'TPOT b=1':>9} {'TPOT':>8} "
        f"{'tokens/s':>9} {'per GPU':>8}"
    )
    for r in rows:
        print(
            f"  {r['layout']:<9} {r['weights_per_gpu'] / 1e9:>8.1f} GB {r['kv_per_gpu'] / 1e9:>6.1f} GB {r['seqs']:>6} "
            f"{r['ttft'] * 1e3:>6.0f}ms {r['tpot_batch1'] * 1e3:>7.1f}ms {r['tpot'] * 1e3:>6.1f}ms "
            f"{r['tokens_per_s']:>9,.0f} {r['tokens_per_s_per_gpu']:>8,.0f}"
        )
    print(f"  seqs: sequences of {args.context} tokens whose KV fits, in all; TPOT at that batch")
    print(f"recommended: {best['layout']}: {why}")
    print_moe(moe, args, moe_reason)
    return 0


def add_serve_plan(sub) -> None:
    p = sub.add_parser(
        "serve-plan",
        help="serving layouts (tp × dp) on N GPUs: KV room, latency, throughput",
        formatter_class=_Formatter,
    )
    p.add_argument("--model", default="llama-3.1-70b", help=f"one of: {', '.join(ModelConfig.presets())}")
    p.add_argument("--gpus", type=int, default=8, help="GPUs to split into tp × dp")
    p.add_argument("--hardware", default="h100-sxm", help=f"one of: {', '.join(Hardware.presets())}")
    p.add_argument("--context", type=int, default=8192, help="tokens per sequence (prompt + output)")
    p.add_argument(
        "--mem-util",
        type=float,
        default=MEM_UTIL,
        help="share of the memory the device reports for weights, activations and KV (vLLM's gpu_memory_utilization)",
    )
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (paged cache)")
    p.add_argument(
        "--dtype", default="bf16", choices=["bf16", "fp16", "fp8", "int8", "fp32"], help="weights and KV cache"
    )
    p.add_argument(
        "--allreduce",
        default="ring",
        choices=["ring", "by-size"],
        help="TP all-reduce cost: a ring of 5 µs steps, or the algorithm a library picks by message size "
        "(one-shot, two-shot or ring: theory.allreduce_algo)",
    )
    add_topology_flag(p)
    p.add_argument(
        "--attention-dp",
        action="store_true",
        help="an MoE model: report DP attention (each GPU its own requests' whole KV, experts over all GPUs by "
        "all-to-all) against the best MoE layout; the MoE table is printed for any MoE model",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_serve_plan)


def _plan_inputs(args) -> tuple[ModelConfig, Hardware]:
    """The model (a preset or a Hugging Face config.json, exactly one) and the hardware, or one line."""
    if args.model and args.hf_config:
        raise BadInput(f"--model {args.model} and --hf-config {args.hf_config} both name the model; give one of them")
    if not (args.model or args.hf_config):
        raise BadInput(
            f"name the model: --model NAME (one of {', '.join(ModelConfig.presets())}) or --hf-config "
            "path/to/config.json (examples in data/hf/)"
        )
    # --top, --gpus, --gpus-per-node, --seq-len, --global-batch: their ranges are cli.checks.LIMITS
    if args.gpus_per_node is not None and args.gpus_per_node > args.gpus:
        # the same rule as a count that is not whole nodes: the flags must describe one real cluster
        raise BadInput(
            f"--gpus-per-node {args.gpus_per_node} is more than --gpus {args.gpus}: a node cannot hold more GPUs "
            f"than the job has; try --gpus-per-node {min(8, args.gpus)} (or omit it: the hardware profile's)"
        )
    hw = Hardware.preset(args.hardware)
    return ModelConfig.from_hf_config(args.hf_config) if args.hf_config else ModelConfig.preset(args.model), hw


def cmd_plan(args) -> int:
    """Every layout of ``--gpus`` GPUs for training ``--model``: rejections by reason, the fastest
    that fit (memory, step time, MFU, tokens/s; ``playbook.theory.plan.planner``) and launch text."""
    from playbook.theory.plan.launch import sbatch_script, torchrun_command
    from playbook.theory.plan.planner import plan
    from playbook.theory.plan.shrink import first_shrinkable

    if not 2 <= args.replay_ranks <= 8:
        raise BadInput(f"--replay-ranks must be in 2..8 (local ranks), got {args.replay_ranks}; try --replay-ranks 4")
    cfg, hw = _plan_inputs(args)
    life = life_for(cfg, hw, args)  # checkpoint, save, MTBF, interval, goodput (cli.plan_life)
    # what a search and a one-layout costing both take from the flags
    options = dict(gpus_per_node=args.gpus_per_node, mem_util=args.mem_util, activations=args.activations)
    options |= dict(overlap=args.overlap, precision=args.precision, mesh_order=args.mesh_order)
    if args.topology:  # every axis priced on the topology's levels (cli.plan_topology)
        from playbook.cli.plan_topology import cmd_plan_topology

        return cmd_plan_topology(args, cfg, options)
    options["mesh_order"] = mesh_order(args)
    if args.layout:
        from playbook.cli.plan_layout import one_layout

        return one_layout(cfg, hw, args, options, life)
    result = plan(
        cfg,
        hw,
        gpus=args.gpus,
        seq_len=args.seq_len,
        global_batch=args.global_batch,
        attention=args.attention,
        schedules=tuple(x for x in args.schedules.split(",") if x),
        **options,
    )
    best = result.candidates[0].layout
    where = dict(
        model=cfg.name, seq_len=args.seq_len, global_batch=args.global_batch, gpus_per_node=result.gpus_per_node
    )
    launch = {"torchrun": torchrun_command(best, **where), "sbatch": sbatch_script(best, **where), "replay": None}
    try:
        index, small = first_shrinkable(result, max_ranks=args.replay_ranks)
        launch |= {"replay": small.command(), "replay_candidate": index + 1, "replay_notes": list(small.notes)}
    except ValueError as e:
        if args.replay:
            raise BadInput(str(e)) from None
        launch["replay_notes"] = [str(e)]
    measured = _replay(small) if args.replay else None
    if args.json:
        print(
            json.dumps({**result.as_dict(top=args.top), "launch": launch, "replayed": measured, "life": life}, indent=2)
        )
        return 0 if measured is None or measured["exact"] else 1
    if args.hf_config:
        print(f"{cfg.name}: {cfg.num_params():,} parameters from {cfg.source}")
    print(
        f"{cfg.name} on {args.gpus} × {args.hardware} ({result.gpus_per_node} per node), seq {args.seq_len}, "
        f"global batch {args.global_batch}, {args.attention} attention, {args.activations} activations, overlap {args.overlap}, {args.precision}; {len(result.candidates)} layouts fit, "
        f"{result.dominated} slower variants of them skipped"
    )
    if result.rope_scaling:
        print(f"  ({result.rope_scaling})")
    print(f"  {'layout':<40} {'memory/GPU':>10} {'step':>8} {'bubble':>7} {'exposed':>8} {'MFU':>6} {'tokens/s':>11}")
    for c in result.candidates[: args.top]:
        print(
            f"  {str(c.layout):<40} {c.memory / 1e9:>7.1f} GB {c.cost.total:>7.2f}s {c.cost.bubble:>6.2f}s "
            f"{c.cost.exposed:>7.2f}s {c.mfu:>6.1%} {c.tokens_per_s:>11,.0f}"
        )
    print(f"  ({LABEL_KEY})")
    print("\n".join(life_lines(life, result.candidates[0].cost.total)))  # at the fastest layout's step
    print("rejected:")
    for kind, (count, example) in result.rejected.items():
        print(f"  {kind}: {count}, e.g. {example}")
    print(f"torchrun:\n  {launch['torchrun']}\nsbatch:\n{launch['sbatch']}")
    if launch["replay"]:
        print(f"replay on this machine (candidate #{launch['replay_candidate']}, shrunk):\n  {launch['replay']}")
    for note in launch["replay_notes"]:
        print(f"    {note}")
    if measured is None:
        return 0
    print(f"replayed on {small.dims.world} real ranks: predicted / measured bytes")
    for r in measured["rows"]:
        flag = "" if r["predicted"] == r["measured"] else "  <- differs"
        print(
            f"  rank {r['rank']} {r['what']:<10} {r['key']:<12} {_num(r['predicted']):>12} / {_num(r['measured'])}{flag}"
        )
    print(f"every number predicted == measured: {measured['exact']}")
    return 0 if measured["exact"] else 1


def _num(x) -> str:
    return "—" if x is None else f"{x:,}"


def _replay(small) -> dict:
    """Run the shrunk candidate on fresh ranks (``parallel.hybrid.replay``): rows and parity."""
    from playbook.parallel.hybrid.replay import replay

    done = replay(small)
    return {"layout": str(small), "rows": done.rows, "exact": done.exact, "parity": done.parity}


def add_plan(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="training layouts (dp × tp × pp × cp, ZeRO, micro-batches, recomputation) on N GPUs",
        formatter_class=_Formatter,
        description="Every layout of N GPUs ranked by predicted step time; " + LABEL_KEY + ".",
    )
    p.add_argument("--model", help=f"a preset, one of: {', '.join(ModelConfig.presets())}")
    p.add_argument(
        "--hf-config",
        metavar="CONFIG_JSON",
        help="instead of --model: a Hugging Face config.json (or its folder) of a Llama, Mistral, Mixtral, Qwen2 "
        "or DeepSeek-V2/V3 model; examples in data/hf/",
    )
    p.add_argument("--gpus", type=int, default=64, help="GPUs in all")
    p.add_argument("--gpus-per-node", type=int, default=None, help="default: the hardware profile's devices_per_node")
    p.add_argument("--hardware", default="h100-sxm", help=f"one of: {', '.join(Hardware.presets())}")
    p.add_argument("--seq-len", type=int, default=8192, help="tokens per sequence")
    p.add_argument("--global-batch", type=int, default=512, help="sequences per step")
    p.add_argument("--mem-util", type=float, default=MEM_UTIL, help="share of GPU memory a layout may fill")
    p.add_argument(
        "--attention",
        default="flash",
        choices=["flash", "eager"],
        help="attention kernel whose activations are counted: flash (a fused FlashAttention kernel, what real "
        "clusters run: no [s, s] scores kept, an fp32 log-sum-exp instead) or eager (our teaching model's "
        "softmax, [b, heads, s, s] kept per layer)",
    )
    p.add_argument(
        "--activations",
        choices=("production", "ours"),
        default="production",
        help="whose kernels' saved tensors are counted: production (fused norm and SwiGLU, flash attention, "
        "SP-sharded inputs as Megatron-LM saves them; the default) or ours (the teaching GPT's, exact on real ranks)",
    )
    p.add_argument(
        "--schedules",
        default=",".join(PLAN_SCHEDULES),
        help=f"pipeline schedules searched, comma-separated (default: all of {', '.join(PLAN_SCHEDULES)})",
    )
    p.add_argument(
        "--overlap",
        choices=tuple(OVERLAP_PRESETS),
        default=DEFAULT_OVERLAP,
        help=f"communication hidden behind compute: none (all exposed), dp (gradient buckets behind the backward, "
        f"gathers ahead of use), megatron-tp (dp, and tp's collective matmuls: all but 1/t hidden) or deepseek-ep "
        f"(also ep's all-to-all and pp's sends); default {DEFAULT_OVERLAP}",
    )
    p.add_argument(
        "--precision",
        choices=("bf16", "fp8"),
        default="bf16",
        help="the linear layers' precision: bf16, or fp8 as DeepSeek-V3 trains (FP8 GEMMs at the profile's "
        "peak_fp8_flops, ep dispatch in FP8; attention, head and router in BF16); MFU stays against BF16 peak",
    )
    p.add_argument(
        "--mesh-order",
        choices=ORDERS,
        default=None,
        help="rank order, fastest axis first: Megatron-LM's tp-cp-dp-pp (ep inside dp; the default) or "
        "Llama 3's tp-cp-pp-dp (pp inside dp): which groups fit in a node, so which links each axis crosses; "
        "the other four need --topology, which searches all six when this is omitted",
    )
    add_topology_flag(p)
    p.add_argument(
        "--layout",
        default=None,
        help='cost one layout instead of searching, e.g. "dp=64 tp=8 pp=16 zero=1 b=1 m=32 schedule=interleaved v=2"',
    )
    p.add_argument("--top", type=int, default=5, help="layouts to show")
    p.add_argument(
        "--replay", action="store_true", help="run the fastest candidate that shrinks to --replay-ranks real ranks"
    )
    p.add_argument("--replay-ranks", type=int, default=8, help="most local ranks a shrunk replay may use")
    add_life_arguments(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)
