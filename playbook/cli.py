"""``playbook`` on the command line: ``info``, ``memory`` and ``run STRATEGY`` (``plan`` and ``serve-plan`` in ``cli_plan``, ``calibrate`` in ``cli_calibrate``).

    playbook info
    playbook memory --model llama-3.1-70b --seq-len 4096 --dp 64 --zero 3 [--tp 8 --sequence-parallel] [--json]
    playbook run single --world-size 1 [--json]
    torchrun --nproc-per-node 4 -m playbook.cli run dp --world-size 4   (chapters that register dp)

Every number is checked in one place (:func:`check_numbers`) before any rank starts: a bad one
gets one ``playbook: error: ...`` line naming the constraint and a value that works, and exit
status 2. ``info`` and ``memory`` never import the strategies (nor torch.distributed's stacks):
the ``run`` subcommands are built only when ``run`` is asked for.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import sys
import threading

from playbook.cli_trace import check_trace_path, write_trace
from playbook.config import Hardware, ModelConfig

from playbook.cli_checks import BadInput, check_before_run, check_numbers


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
        "cpu_cores": __import__("os").cpu_count(),
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
    from playbook.theory.memory import bytes_to_gb, bytes_to_gib, inference_memory, training_memory

    from playbook.cli_fit import device_fit, memory_model

    cfg = memory_model(args)
    if args.seq_len > cfg.max_seq_len:
        raise BadInput(
            f"--seq-len {args.seq_len} exceeds {cfg.name}'s max_seq_len={cfg.max_seq_len}; "
            f"try --seq-len {min(4096, cfg.max_seq_len)} (at most {cfg.max_seq_len})"
        )
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
        from playbook.theory.stages import layout_stage_memory, most_loaded_stage

        stages = layout_stage_memory(cfg, seq_len=args.seq_len, micro_batch=args.micro_batch, **degrees)
        train = stages[most_loaded_stage(stages)].memory.as_dict()
    else:
        train = training_memory(cfg, seq_len=args.seq_len, micro_batch=args.micro_batch, **degrees).as_dict()
    serve = inference_memory(
        cfg, batch=args.micro_batch, seq_len=args.seq_len, tp=args.tp, pp=args.pp, ep=args.ep, dtype=args.serve_dtype
    ).as_dict()
    fit = device_fit(args.hardware, {"training": train["total"], "inference": serve["total"]}, args.mem_util)
    if args.json:
        report = {"model": cfg.name, "num_params": cfg.num_params(), "attention": args.attention}
        report |= {"training": train, "inference": serve, "device": fit}
        if stages:
            report["training_stages"] = [st.as_dict() for st in stages]
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{cfg.name}: {cfg.num_params():,} parameters; per rank, seq_len {args.seq_len}, micro-batch "
        f"{args.micro_batch}, {args.attention} attention"
    )
    for title, budget in (("training (the most loaded rank)", train), ("inference", serve)):
        what = title.split()[0]
        verdict = "fits" if fit[what]["fits"] else "does NOT fit"
        print(f"  {title}: {verdict} {args.hardware}, margin {bytes_to_gb(fit[what]['margin_bytes']):+.2f} GB")
        for k, v in budget.items():
            print(f"    {k:<12} {bytes_to_gb(v):>10.2f} GB {bytes_to_gib(v):>10.2f} GiB")
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


def cmd_run(args) -> int:
    from playbook.cluster import LAUNCHED_TRACES, launch_timeout, no_progress, under_torchrun
    from playbook.parallel import TrainSetup, get

    strategy = get(args.strategy)
    setup = TrainSetup(
        model=args.model, steps=args.steps, global_batch=args.global_batch, seq_len=args.seq_len, lr=args.lr
    )
    if args.world_size is None:  # implied by the strategy's own options (hybrid: the product of the degrees)
        args.world_size = strategy.world_size(vars(args))
    if not under_torchrun():
        check_before_run(args, strategy)
    if args.trace is not None:
        check_trace_path(args.trace)
    common = {
        "strategy",
        "model",
        "steps",
        "global_batch",
        "seq_len",
        "lr",
        "json",
        "func",
        "command",
        "world_size",
        "backend",
        "trace",
        "timeout",
    }
    options = {k: v for k, v in vars(args).items() if k not in common}
    # With --json, stdout carries the JSON object alone: anything else (rank prints) goes to stderr.
    # and progress bars go nowhere.
    with (
        contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext(),
        no_progress() if args.json else contextlib.nullcontext(),
        launch_timeout(args.timeout),
    ):
        LAUNCHED_TRACES.clear()
        report = strategy.run(setup, world_size=args.world_size, backend=args.backend, **options)
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() != 0:  # under torchrun only rank 0 prints
        return 0
    print(report.to_json() if args.json else report.summary())
    if args.trace is not None:
        write_trace(args.trace, f"playbook run {args.strategy}")
    problem = report.problem() if hasattr(report, "problem") else None
    if problem:
        print(f"playbook: parity failed: {problem}", file=sys.stderr)
        return 1
    return 0


_Formatter = argparse.ArgumentDefaultsHelpFormatter


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Give options added without a help text one, so that ``--help`` shows their default too."""
    for action in parser._actions:
        if action.help is None and action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            action.help = "default: %(default)s"


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
    p.add_argument("--mem-util", type=float, default=0.9, help="share of the device's memory a rank may fill")
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

    from playbook.cli_calibrate import add_calibrate
    from playbook.cli_plan import add_plan, add_serve_plan
    from playbook.cli_serve_bench import add_serve_bench

    add_serve_plan(sub)
    add_serve_bench(sub)
    add_plan(sub)
    add_calibrate(sub)

    run = sub.add_parser(
        "run", help="run a strategy on real ranks and compare with the reference", formatter_class=_Formatter
    )
    if not strategies:
        run.add_argument("strategy", nargs="?", help="a strategy (playbook run --help lists them)")
        return parser
    from playbook.parallel import get, names

    strategies_ = run.add_subparsers(dest="strategy", required=True)
    for name in names():
        s = get(name)
        p = strategies_.add_parser(name, help=s.help, description=s.help, formatter_class=_Formatter)
        p.add_argument(
            "--world-size", type=int, default=1 if name == "single" else 2, help="ranks (processes) to start"
        )
        p.add_argument(
            "--backend",
            default="auto",
            choices=["auto", "gloo", "nccl"],
            help="auto: NCCL with one GPU per rank when there are enough GPUs, else gloo",
        )
        p.add_argument("--model", default="gpt-tiny", help=f"one of: {', '.join(ModelConfig.presets())}")
        p.add_argument("--steps", type=int, default=3, help="AdamW steps")
        p.add_argument("--global-batch", type=int, default=8, help="sequences per step, over all ranks")
        p.add_argument("--seq-len", type=int, default=32, help="tokens per sequence")
        p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
        p.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
        p.add_argument(
            "--trace",
            metavar="FILE.json",
            help="write the measured timeline (Chrome trace format: Perfetto, chrome://tracing)",
        )
        p.add_argument(
            "--timeout",
            type=float,
            default=300.0,
            help="seconds to wait for every rank's result before the ranks are stopped and named "
            "(a rank the OS has stopped is reported at once)",
        )
        if s.arguments:
            s.arguments(p)
        _show_defaults(p)
        p.set_defaults(func=cmd_run)
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


if __name__ == "__main__":
    sys.exit(main())
