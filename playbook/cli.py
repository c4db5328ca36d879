"""``playbook`` on the command line: ``info``, ``memory`` and ``run STRATEGY``.

    playbook info
    playbook memory --model llama-3.1-70b --seq-len 4096 --dp 64 --zero 3 [--tp 8 --sequence-parallel] [--json]
    playbook run single --world-size 1 [--json]
    torchrun --nproc-per-node 4 -m playbook.cli run dp --world-size 4   (chapters that register dp)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

from playbook.config import Hardware, ModelConfig


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
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "default_backend_for_2_ranks": default_backend(2),
        "model_presets": ModelConfig.presets(),
        "hardware_profiles": Hardware.presets(),
    }
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            print(f"{k:>28}: {', '.join(map(str, v)) if isinstance(v, list) else v}")
    return 0


def cmd_memory(args) -> int:
    from playbook.theory.memory import bytes_to_gb, bytes_to_gib, inference_memory, training_memory

    cfg = ModelConfig.preset(args.model)
    train = training_memory(
        cfg, seq_len=args.seq_len, micro_batch=args.micro_batch, dp=args.dp, zero=args.zero, tp=args.tp,
        cp=args.cp, ep=args.ep, pp=args.pp, sequence_parallel=args.sequence_parallel, precision=args.precision,
        recompute=args.recompute, fp32_grad_accum=args.fp32_grad_accum,
    ).as_dict()  # fmt: skip
    serve = inference_memory(
        cfg, batch=args.micro_batch, seq_len=args.seq_len, tp=args.tp, pp=args.pp, ep=args.ep, dtype=args.serve_dtype
    ).as_dict()
    if args.json:
        print(json.dumps({"model": args.model, "num_params": cfg.num_params(), "training": train, "inference": serve}, indent=2))
        return 0
    print(f"{args.model}: {cfg.num_params():,} parameters; per rank, seq_len {args.seq_len}, micro-batch {args.micro_batch}")
    for title, budget in (("training", train), ("inference", serve)):
        print(f"  {title}")
        for k, v in budget.items():
            print(f"    {k:<12} {bytes_to_gb(v):>10.2f} GB {bytes_to_gib(v):>10.2f} GiB")
    return 0


def cmd_run(args) -> int:
    from playbook.parallel import TrainSetup, get

    strategy = get(args.strategy)
    setup = TrainSetup(model=args.model, steps=args.steps, global_batch=args.global_batch, seq_len=args.seq_len, lr=args.lr)
    common = {"strategy", "model", "steps", "global_batch", "seq_len", "lr", "json", "func", "command", "world_size", "backend"}
    options = {k: v for k, v in vars(args).items() if k not in common}
    report = strategy.run(setup, world_size=args.world_size, backend=args.backend, **options)
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() != 0:  # under torchrun only rank 0 prints
        return 0
    print(report.to_json() if args.json else report.summary())
    return 0


def build_parser() -> argparse.ArgumentParser:
    from playbook.parallel import get, names

    parser = argparse.ArgumentParser(prog="playbook", description="Parallelism Playbook: predict, run and measure.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="versions, backends, devices, presets")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("memory", help="predicted training and inference memory per rank")
    p.add_argument("--model", default="llama-3.1-8b", help=f"one of: {', '.join(ModelConfig.presets())}")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (training and serving)")
    p.add_argument("--sequence-parallel", action="store_true", help="with --tp: sequence parallelism")
    p.add_argument("--cp", type=int, default=1, help="context-parallel degree (training)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (training: 1F1B, the most loaded stage)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree (mixture-of-experts presets)")
    p.add_argument("--precision", default="mixed", choices=["mixed", "fp32"])
    p.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
    p.add_argument("--fp32-grad-accum", action="store_true",
                   help="with --precision mixed: an fp32 gradient-accumulation buffer, 4 more bytes per parameter")
    p.add_argument("--serve-dtype", default="bf16")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_memory)

    run = sub.add_parser("run", help="run a strategy on real ranks and compare with the reference")
    strategies = run.add_subparsers(dest="strategy", required=True)
    for name in names():
        s = get(name)
        p = strategies.add_parser(name, help=s.help)
        p.add_argument("--world-size", type=int, default=1)
        p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
        p.add_argument("--model", default="gpt-tiny")
        p.add_argument("--steps", type=int, default=3)
        p.add_argument("--global-batch", type=int, default=8)
        p.add_argument("--seq-len", type=int, default=32)
        p.add_argument("--lr", type=float, default=3e-3)
        p.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
        if s.arguments:
            s.arguments(p)
        p.set_defaults(func=cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, NotImplementedError) as e:  # bad input: one clear line, no traceback
        print(f"playbook: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
