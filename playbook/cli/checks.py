"""Everything ``playbook`` checks before it computes or starts a rank, in the order a user should
hear about it: each number against its range (:data:`LIMITS`), then the strategy's own
constraints (a degree that does not divide the heads is named before the global batch is), then
whether the run fits this machine.

A refusal is a :class:`BadInput` (or ``ValueError``): one ``playbook: error: ...`` line naming the
constraint and a value that works, exit status 2.
"""

from __future__ import annotations

import argparse
import math
import os

from playbook.config import ModelConfig

# Every numeric option of every command: dest -> (lowest, highest, example). Floats must also be
# finite. An option not listed here is checked for finiteness only. The highest values keep every
# loop short (a divisor search over --gpus, a serving loop over --requests) and every allocation
# sane (a KV pool of --blocks × --block-size); they are far above what a chapter or cluster uses.
LIMITS: dict[str, tuple[float, float, str]] = {
    "world_size": (1, math.inf, "2"),  # the machine's own limit: cluster.check_world_size
    "steps": (1, 10_000, "3"),
    "global_batch": (1, 10**7, "8"),
    "seq_len": (1, 10**8, "32"),
    "micro_batch": (1, 10**6, "1"),
    "lr": (1e-12, 1.0, "3e-3"),  # AdamW: beyond ~1 every step overshoots, and the losses go NaN
    "bucket_mb": (1e-6, 4096, "25"),
    "accumulate": (1, 1024, "2"),
    "experts": (1, 1024, "4"),
    "top_k": (1, 1024, "2"),
    "capacity_factor": (1e-6, 1024, "1.25"),
    "ep": (1, 10**6, "2"),
    "aux_alpha": (0, 10, "0.01"),
    "microbatches": (1, 4096, "4"),
    "chunks": (1, 64, "2"),
    "layers": (0, 1024, "4"),
    "stage": (0, 3, "3"),
    "dp": (1, 10**6, "8"),
    "tp": (1, 10**6, "8"),
    "cp": (1, 10**6, "2"),
    "pp": (1, 10**6, "4"),
    "gpus": (1, 10**6, "64"),
    "gpus_per_node": (1, 1024, "8"),
    "mem_util": (1e-6, 1.0, "0.9"),
    "block_size": (1, 4096, "16"),
    "blocks": (1, 10**6, "16"),
    "requests": (1, 1000, "6"),
    "max_batch": (1, 1024, "4"),
    "top": (1, 10**4, "5"),
    "timeout": (0.1, 86_400, "60"),
    "seed": (0, 2**63 - 1, "0"),  # torch.Generator.manual_seed takes a signed 64-bit integer
    "groups": (1, 1000, "2"),  # serve-bench's shared prefixes: as many as --requests can draw, at most
}


# Counts whose highest value only guards against huge input (no loop or allocation goes unbounded):
# below the range they are "a positive integer", above it "a positive integer at most N".
GUARDS = {
    "global_batch", "seq_len", "micro_batch", "ep", "dp", "tp", "cp", "pp", "gpus", "gpus_per_node",
    "block_size", "blocks", "requests", "max_batch", "top", "groups",
}  # fmt: skip


class BadInput(ValueError):
    """Input refused before anything starts: printed as one line, exit status 2."""


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_numbers(args: argparse.Namespace) -> None:
    """Refuse every numeric option that is not finite or not in its range, naming a value that works."""
    for dest, value in vars(args).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        low, high, example = LIMITS.get(dest, (-math.inf, math.inf, ""))
        if isinstance(value, float) and not math.isfinite(value):
            raise BadInput(
                f"{_flag(dest)} must be a finite number, got {value}"
                + (f"; e.g. {_flag(dest)} {example}" if example else "")
            )
        if not low <= value <= high:
            if dest in GUARDS:
                what = "a positive integer" if value < low else f"a positive integer at most {high:,}"
            elif low == 1 and high == math.inf:
                what = "a positive integer"
            elif high == math.inf:
                what = f"at least {low:g}"
            elif low > 0 and low < 1e-3:
                what = f"greater than 0 and at most {high:g}"
            elif isinstance(value, int) and high > 1e6:  # a seed's 2**63 − 1 in full, not 9.22337e+18
                what = f"between {low:,} and {high:,}"
            else:
                what = f"between {low:g} and {high:g}"
            raise BadInput(
                f"{_flag(dest)} must be {what}, got {value if isinstance(value, int) else f'{value:g}'}; e.g. {_flag(dest)} {example}"
            )


def check_before_run(args: argparse.Namespace, strategy) -> None:
    """``playbook run``'s checks after the numbers, before any rank starts, most specific first:
    how many ranks this machine can start, the strategy's own constraints, then the memory."""
    from playbook.cluster import check_world_size, default_backend, torchrun_env_problem

    problem = torchrun_env_problem()  # (under a whole torchrun environment none of this runs: cli.run)
    if problem:
        raise BadInput(problem)
    if strategy.check is not None:
        strategy.check(args)
    else:  # the rule every strategy without its own check has had: the batch splits over the ranks
        from playbook.data import rows_per_rank

        rows_per_rank(args.global_batch, min(args.world_size, args.global_batch))
    backend = default_backend(args.world_size) if args.backend == "auto" else args.backend
    check_world_size(args.world_size, backend)
    check_fits(args)


def available_memory() -> int | None:
    """Bytes this machine can still give (MemAvailable), None where it cannot tell."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e3:.0f} kB"


def check_fits(args: argparse.Namespace, available: int | None = None) -> None:
    """Refuse a run whose predicted memory cannot fit in this machine: the single-process reference
    (in this process) plus ``world_size`` ranks, each predicted as a full replica on its share of
    the batch (an upper bound for the sharding strategies), with our own exact prediction
    (``TrainSetup.predicted_memory``). Only values the user could type are suggested: a global
    batch that is a multiple of the ranks."""
    from playbook.parallel.training import TrainSetup

    available = available_memory() if available is None else available
    if not available:
        return

    def need(model: str, rows: int) -> tuple[float, float]:  # rows: sequences per rank
        per_rank = TrainSetup(model=model, steps=1, global_batch=rows, seq_len=args.seq_len).predicted_memory(1).total
        whole = TrainSetup(model=model, steps=1, global_batch=rows * args.world_size, seq_len=args.seq_len)
        return per_rank, whole.predicted_memory(1).total + args.world_size * per_rank

    rows = -(-args.global_batch // args.world_size)
    per_rank, total = need(args.model, rows)
    budget = 0.8 * available
    if total <= budget:
        return
    fixes = []
    lo, hi = 0, rows  # the most rows per rank that fit, by bisection
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need(args.model, mid)[1] <= budget else (lo, mid - 1)
    if lo >= 1:
        fixes.append(f"--global-batch {lo * args.world_size} or less")
    smaller = [
        m
        for m in ModelConfig.presets()
        if args.seq_len <= ModelConfig.preset(m).max_seq_len and need(m, rows)[1] <= budget
    ]
    if smaller:
        fixes.append(f"--model {' / '.join(smaller[:4])}")
    raise BadInput(
        f"{args.model} with --global-batch {args.global_batch} --seq-len {args.seq_len} needs {_size(per_rank)} per rank "
        f"(fp32 AdamW) on {args.world_size} rank(s) plus the single-process reference, {_size(total)} in all; "
        f"this machine has {_size(available)} available" + (f"; try {', or '.join(fixes)}" if fixes else "")
    )


def check_serving_fits(cfg, *, tp: int, dp: int, blocks: int, block_size: int, available=None) -> None:
    """Refuse, in one line before any rank starts, a serving run whose ``serve.checks.serving_bytes`` is more
    than 80 % of the memory this machine can still give (:func:`available_memory`, the share :func:`check_fits`
    allows a training run), naming the smaller presets that would fit."""
    from playbook.serve.checks import serving_bytes

    available = available_memory() if available is None else available
    if not available:
        return
    per_rank, total = serving_bytes(cfg, tp=tp, dp=dp, blocks=blocks, block_size=block_size)
    if total <= 0.8 * available:
        return
    fits = [
        m
        for m in ModelConfig.presets()
        if serving_bytes(ModelConfig.preset(m), tp=tp, dp=dp, blocks=blocks, block_size=block_size)[1]
        <= 0.8 * available
    ]
    raise ValueError(
        f"{cfg.name} on {dp * tp} rank(s) needs {_size(per_rank)} per rank (the fp32 reference, its tp shard and "
        f"{blocks} KV blocks of {block_size} tokens) plus {_size(4.0 * cfg.num_params())} for the reference "
        f"process, {_size(total)} in all; this machine has {_size(available)} available"
        + (f"; try --model {' / '.join(fits[:4])} or fewer --blocks" if fits else "; try fewer --blocks")
    )
