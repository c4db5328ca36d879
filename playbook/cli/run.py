"""``playbook run STRATEGY``: one subcommand per registered strategy, and running it on real ranks.

The strategies' modules are imported only here, when ``run`` is asked for, so ``info`` and ``memory``
start without torch.distributed's stacks.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from playbook.cli.checks import check_before_run
from playbook.cli.trace import check_trace_path, write_trace
from playbook.config import ModelConfig


COMMON = {"strategy", "model", "steps", "global_batch", "seq_len", "lr", "json", "func", "command", "world_size"}
COMMON |= {"backend", "trace", "timeout"}  # the options every run shares; the rest are the strategy's own


def cmd_run(args) -> int:
    from playbook.cluster import Launcher, under_torchrun
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
    options = {k: v for k, v in vars(args).items() if k not in COMMON}
    # With --json, stdout carries the JSON object alone (rank prints go to stderr) and there is no progress bar.
    launch = Launcher(timeout=args.timeout, progress=not args.json)
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        report = strategy.run(setup, world_size=args.world_size, backend=args.backend, launch=launch, **options)
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() != 0:  # under torchrun only rank 0 prints
        return 0
    print(report.to_json() if args.json else report.summary())
    if args.trace is not None:
        write_trace(args.trace, f"playbook run {args.strategy}", launch.traces)
    problem = report.problem()
    if problem:
        print(f"playbook: parity failed: {problem}", file=sys.stderr)
        return 1
    return 0


def add_strategies(run: argparse.ArgumentParser, formatter) -> None:
    """A subparser of ``run`` for every registered strategy, with the options every run shares and its own."""
    from playbook.parallel import get, names

    strategies_ = run.add_subparsers(dest="strategy", required=True)
    for name in names():
        s = get(name)
        p = strategies_.add_parser(name, help=s.help, description=s.help, formatter_class=formatter)
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


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Give options added without a help text one, so that ``--help`` shows their default too."""
    for action in parser._actions:
        if action.help is None and action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            action.help = "default: %(default)s"
