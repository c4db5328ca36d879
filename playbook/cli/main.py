"""``playbook`` on the command line: the parser, ``info`` and ``memory`` (``run`` in ``cli.run``, ``plan`` and ``serve-plan`` in ``cli.plan``, ``calibrate`` in ``cli.calibrate``).

    playbook info
    playbook memory --model llama-3.1-70b --seq-len 4096 --dp 64 --zero 3 [--tp 8 --sequence-parallel] [--json]
    playbook run single --world-size 1 [--json]
    playbook checkpoint inspect DIR
    torchrun --nproc-per-node 4 -m playbook.cli run dp --world-size 4   (chapters that register dp)

Every number is checked in one place (:func:`check_numbers`) before any rank starts: a bad one
gets one ``playbook: error: ...`` line naming the constraint and a value that works, and exit
status 2. ``info`` and ``memory`` never import the strategies (nor torch.distributed's stacks):
the ``run`` subcommands are built only when ``run`` is asked for.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import threading

from playbook.config import ModelConfig
from playbook.hardware import MEM_UTIL, Hardware

from playbook.cli.checks import BadInput, check_numbers
from playbook.cli.run import add_strategies


def cmd_info(args) -> int:
    import torch
    import torch.distributed as dist

    from playbook import __version__
    from playbook.cluster import default_backend, max_local_ranks

    info = {
        "playbook": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_cores": os.cpu_count(),
        "max_local_ranks": max_local_ranks(),
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] or "none",
        "default_backend_for_2_ranks": default_backend(2),
        "model_presets": ModelConfig.presets(),
        "hardware_profiles": Hardware.presets(),
    }
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        notes = {
            "max_local_ranks": "(the most ranks `playbook run` starts on this machine: 4 per CPU core, at least 16)"
        }
        for k, v in info.items():
            print(f"{k:>28}: {', '.join(map(str, v)) if isinstance(v, list) else v} {notes.get(k, '')}".rstrip())
    return 0


def cmd_memory(args) -> int:
    from playbook.theory.inventory.model_state import bytes_to_gb, bytes_to_gib
    from playbook.theory.hybrid.memory import inference_memory, training_memory

    from playbook.cli.fit import device_fit, memory_model

    cfg = memory_model(args)
    rope = cfg.rope_scaling_note(args.seq_len)  # past max_position_embeddings: said, not refused (issue 41)
    degrees = {
        k: getattr(args, k)
        for k in (
            "dp",
            "zero",
            "tp",
            "cp",
            "ep",
            "pp",
            "sequence_parallel",
            "precision",
            "recompute",
            "fp32_grad_accum",
            "attention",
        )
    }
    stages = []
    if args.pp > 1:  # every stage's bytes per rank; training_memory reports the most loaded one
        from playbook.theory.hybrid.stages import layout_stage_memory, most_loaded_stage

        stages = layout_stage_memory(cfg, seq_len=args.seq_len, micro_batch=args.micro_batch, **degrees)
        train = stages[most_loaded_stage(stages)].memory.as_dict()
    else:
        train = training_memory(cfg, seq_len=args.seq_len, micro_batch=args.micro_batch, **degrees).as_dict()
    serve = inference_memory(
        cfg, batch=args.micro_batch, seq_len=args.seq_len, tp=args.tp, pp=args.pp, ep=args.ep, dtype=args.serve_dtype
    ).as_dict()
    fit = device_fit(args.hardware, {"training": train["total"], "inference": serve["total"]}, args.mem_util)
    would_fit = []
    if not fit["training"]["fits"]:
        from playbook.cli.advice import what_would_fit

        options = dict(seq_len=args.seq_len, micro_batch=args.micro_batch, **degrees)
        would_fit = what_would_fit(cfg, options, fit["allowed_bytes"])
    if args.json:
        report = {"model": cfg.name, "num_params": cfg.num_params(), "attention": args.attention, "rope_scaling": rope}
        report |= {"training": train, "inference": serve, "device": fit}
        report["training_would_fit"] = [
            {"flags": c.flags, "total_bytes": c.total_bytes, "fits": c.fits} for c in would_fit
        ]
        if stages:
            report["training_stages"] = [st.as_dict() for st in stages]
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{cfg.name}: {cfg.num_params():,} parameters; per rank, seq_len {args.seq_len}, micro-batch "
        f"{args.micro_batch}, {args.attention} attention"
    )
    if rope:
        print(f"  ({rope})")
    for title, budget in (("training (the most loaded rank)", train), ("inference", serve)):
        what = title.split()[0]
        verdict = "fits" if fit[what]["fits"] else "does NOT fit"
        print(f"  {title}: {verdict} {args.hardware}, margin {bytes_to_gb(fit[what]['margin_bytes']):+.2f} GB")
        for k, v in budget.items():
            print(f"    {k:<12} {bytes_to_gb(v):>10.2f} GB {bytes_to_gib(v):>10.2f} GiB")
        if what == "training" and would_fit:
            alone = would_fit[0].flags.count("--") == 1 or len(would_fit) > 1
            head = (
                "what would fit"
                if alone
                else "no one flag fits; these together"
                if would_fit[0].fits
                else "even all of"
            )
            print(f"    {head} (cheapest first): " + "; ".join(c.line() for c in would_fit))
    print(
        f"  {args.hardware}: {args.mem_util:g} × {bytes_to_gb(fit['capacity_bytes']):.1f} GB the device reports "
        f"= {bytes_to_gb(fit['allowed_bytes']):.1f} GB allowed"
    )
    if stages:
        print("  training, per pipeline stage (GB per rank): layers, micro-batches in flight, total")
        for st in stages:
            ends = " + embedding" * st.embedding + " + head" * st.head
            print(
                f"    stage {st.stage:>3}: layers {st.first_layer}-{st.first_layer + st.n_layers - 1}{ends}, "
                f"{st.in_flight} in flight, {bytes_to_gb(st.memory.total):.2f} GB"
            )
    return 0


_Formatter = argparse.ArgumentDefaultsHelpFormatter


def build_parser(strategies: bool = True) -> argparse.ArgumentParser:
    """The whole parser. ``strategies=False`` leaves ``run``'s subcommands out, so that ``info``
    and ``memory`` start without importing the strategy modules (torch.distributed and friends)."""
    parser = argparse.ArgumentParser(
        prog="playbook", description="Parallelism Playbook: predict, run and measure.", formatter_class=_Formatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="versions, backends, devices, presets", formatter_class=_Formatter)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("memory", help="predicted training and inference memory per rank", formatter_class=_Formatter)
    p.add_argument("--model", help=f"default llama-3.1-8b; one of: {', '.join(ModelConfig.presets())}")
    p.add_argument("--hf-config", metavar="CONFIG_JSON", help="instead of --model: a Hugging Face config.json")
    p.add_argument("--hardware", default="h100-sxm", help=f"the device to fit: {', '.join(Hardware.presets())}")
    p.add_argument("--mem-util", type=float, default=MEM_UTIL, help="share of the device's memory a rank may fill")
    p.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence (at most the model's max_seq_len)")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per rank per micro-batch")
    p.add_argument("--dp", type=int, default=1, help="data-parallel degree")
    p.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3], help="ZeRO stage")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (training and serving)")
    p.add_argument("--sequence-parallel", action="store_true", help="with --tp: sequence parallelism")
    p.add_argument("--cp", type=int, default=1, help="context-parallel degree (training)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (training: 1F1B, the most loaded stage)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree (mixture-of-experts presets)")
    p.add_argument("--precision", default="mixed", choices=["mixed", "fp32"], help="training precision")
    p.add_argument(
        "--recompute", default="none", choices=["none", "selective", "full"], help="activation recomputation"
    )
    p.add_argument(
        "--fp32-grad-accum",
        nargs="?",
        const="both",
        default=False,
        choices=["main_grad", "both"],
        help="with --precision mixed: accumulate gradients in fp32; main_grad (Megatron-LM) replaces the "
        "bf16 gradient (18 bytes per parameter), both (the default when given bare) keeps it too (20)",
    )
    p.add_argument(
        "--attention",
        default="eager",
        choices=["eager", "flash"],
        help="training activations of: eager (our model's softmax, [b, heads, s, s] per layer, what the chapters "
        "measure) or flash (a fused FlashAttention kernel as real clusters run: an fp32 log-sum-exp instead)",
    )
    p.add_argument("--serve-dtype", default="bf16", help="dtype of the served weights and KV cache")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_memory)

    from playbook.cli.calibrate import add_calibrate
    from playbook.cli.checkpoint import add_checkpoint
    from playbook.cli.plan import add_plan, add_serve_plan
    from playbook.cli.serve_bench import add_serve_bench

    add_serve_plan(sub)
    add_serve_bench(sub)
    add_plan(sub)
    add_calibrate(sub)
    add_checkpoint(sub)

    run = sub.add_parser(
        "run", help="run a strategy on real ranks and compare with the reference", formatter_class=_Formatter
    )
    if not strategies:
        run.add_argument("strategy", nargs="?", help="a strategy (playbook run --help lists them)")
        return parser
    add_strategies(run, _Formatter)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, ``kill``, Slurm) arrived: unwound like Ctrl-C, so every rank is stopped."""


def _on_sigterm(signum, frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(strategies=argv[:1] == ["run"]).parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
        return _main(args)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _main(args) -> int:
    from playbook.cluster import RankError, RankTimeout

    try:
        check_numbers(args)
        return args.func(args)
    except (ValueError, NotImplementedError) as e:  # bad input: one clear line, no traceback
        print(f"playbook: error: {str(e).splitlines()[0] if isinstance(e, BadInput) else e}", file=sys.stderr)
        return 2
    except (RankError, RankTimeout) as e:  # a fault on the ranks: its message says which rank and where
        print(f"playbook: {e}", file=sys.stderr)
        return 1
    except Terminated:
        print("playbook: terminated (SIGTERM); every rank was stopped", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("playbook: interrupted; every rank was stopped", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `playbook ... | head`: the reader left, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
