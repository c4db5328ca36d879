"""``playbook run dp``: data parallelism (``parallel.dp.ddp``) on real ranks, on the one training loop.

Each rank trains ``GPT(cfg, seed)`` on its rows of every global batch with ``training.train``; the
variant plugs in as hooks: the micro-batches of a step and their forward and backward
(``forward_backward``), then the all-reduce of every gradient or the wait for the buckets
(``sync_grads``). The report puts the run beside the single process and beside DDP (parity), and
its bytes and calls per step beside ``theory.dp`` (Li et al. 2020, arXiv:2006.15704). Scaling runs
the same on the first 1, 2, 4 ranks of the world.
"""

from __future__ import annotations

import functools

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from playbook.cluster import default_backend, launch
from playbook.measure.collectives import measured_comm, without_loop_steps
from playbook.measure.memory import SavedActivations, gradient_bytes, optimizer_bytes, parameter_bytes
from playbook.measure.trace import Tracer
from playbook.model import GPT
from playbook.parallel.dp.ddp import VARIANTS, BucketedAllReduce, accumulating, allreduce_each, micro_batch, wrap_ddp
from playbook.parallel.mixed import PRECISIONS, check_precision, optimizer_for, to_mixed, train_mixed
from playbook.parallel.registry import register
from playbook.parallel.report import RunReport, compare, rel_l2_diff  # noqa: F401  (rel_l2_diff: part of this chapter's API)
from playbook.parallel.training import TrainResult, TrainSetup, train
from playbook.parallel.parity import gated
from playbook.parallel.parity import reference as single_process
from playbook.theory.buckets import bucket_cap_bytes
from playbook.theory.dp import predicted_comm
from playbook.theory.memory import training_memory

DEFAULT_BUCKET_MB = 0.1  # MiB: four buckets for gpt-tiny (DDP's default, 25 MiB, would make one)


@dataclass
class DPResult(TrainResult):
    """A rank's run: TrainResult plus step times, the run's tracer spans, each step's
    (start, end) window (perf_counter seconds) and the buckets all-reduced in the last step."""

    step_seconds: list[float] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)
    spans: list[dict] = field(default_factory=list, repr=False)
    buckets: list[list[str]] = field(default_factory=list)
    first_buckets: list[list[str]] = field(default_factory=list)  # step 0's (DDP starts with one)


class _Traced:
    """AdamW as the loop calls it, its step marked ``optimizer`` on the timeline."""

    def __init__(self, optimizer, tracer):
        self.optimizer, self.tracer = optimizer, tracer

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        with self.tracer.span("optimizer"):
            self.optimizer.step()


def train_dp(
    setup: TrainSetup,
    *,
    variant: str,
    group,
    device="cpu",
    cap_bytes: int = 2**20,
    accumulate: int = 1,
    tracer: Tracer | None = None,
    progress=None,
    precision: str = "fp32",
) -> DPResult:
    """``setup.steps`` AdamW steps of data parallelism over ``group`` on ``training.train``: same
    model, data, optimizer as the single process; this rank's rows split into ``accumulate``
    micro-batches; the loss reported is the global batch's. Memory is measured in the first step.
    ``precision="mixed"``: the model in bf16 (so are its gradients and the all-reduced buckets),
    AdamW on fp32 masters (``parallel.mixed``)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    check_precision(precision)
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    micro = micro_batch(setup, n, accumulate)
    tracer = tracer or Tracer(rank)
    net = GPT(setup.config(), seed=setup.seed).to(device)
    if precision == "mixed":
        to_mixed(net)
    model, reducer, hook = net, None, None  # model: what the forward calls (DDP wraps net)
    if variant == "bucketed":
        reducer = BucketedAllReduce(net, cap_bytes, group, tracer)
    elif variant == "ddp":
        model, hook = wrap_ddp(net, cap_bytes, group, tracer)
    optimizer = optimizer_for(net, setup, precision)
    task, first_span = setup.task(), len(tracer.spans)
    out, now = DPResult([], {}, {}), {}

    def batch(step):
        now["step"], now["start"] = step, time.perf_counter()
        if hook is not None:
            hook.step = step
        return task.batch(step, setup.global_batch, setup.seq_len, rank, n, device=device)  # [G/n, seq] each

    def forward_backward(_, tokens, targets):
        loss = torch.zeros((), device=device)
        for k in range(accumulate):
            rows, first = slice(k * micro, (k + 1) * micro), now["step"] == 0 and k == 0
            with accumulating(model, reducer, skip_sync=k < accumulate - 1):
                saved = SavedActivations(net) if first else nullcontext()
                with tracer.span("forward"), saved:
                    _, micro_loss = model(tokens[rows], targets[rows])  # mean over [micro, seq]
                with tracer.span("backward"):
                    (micro_loss / accumulate).backward()
            loss += micro_loss.detach() / accumulate
            if first:
                out.memory = {"params": parameter_bytes(net), "activations": saved.bytes}
        return loss

    def sync_grads(_):
        if variant == "naive":
            allreduce_each(net, group)
        elif variant == "bucketed":
            with tracer.span("wait"):
                reducer.wait()
        if now["step"] == 0:
            out.memory["grads"] = gradient_bytes(net)

    def global_loss(loss):  # the global batch's loss, for the report
        dist.all_reduce(loss, group=group)
        return loss / n

    def step_done(done, total):
        out.windows.append((now["start"], time.perf_counter()))
        out.step_seconds.append(out.windows[-1][1] - now["start"])
        if progress is not None:
            progress(done, total)

    result = train(
        setup,
        device=device,
        model=net,
        optimizer=_Traced(optimizer, tracer),
        batch=batch,
        forward_backward=forward_backward,
        sync_grads=sync_grads,
        sync_loss=global_loss,
        progress=step_done,
    )
    out.losses, out.grads, out.params = result.losses, result.grads, result.params
    out.memory["optimizer"] = optimizer_bytes(optimizer)  # AdamW's states (and masters) are whole from step 1 on
    out.memory["comm_buffers"] = sum(b.numel() * b.element_size() for b in reducer.buffers) if reducer else None
    out.spans = without_loop_steps(tracer.spans[first_span:])
    if reducer is not None:
        reducer.remove()
        out.buckets = out.first_buckets = [list(b.names) for b in reducer.plan]
    if hook is not None:
        by_step = lambda s: [names for st, _, names in sorted(hook.buckets, key=lambda x: x[1]) if st == s]  # noqa: E731
        out.first_buckets, out.buckets = by_step(0), by_step(setup.steps - 1)
    return out


def on_rank(
    ctx,
    setup: TrainSetup,
    *,
    variant: str = "bucketed",
    bucket_mb: float = DEFAULT_BUCKET_MB,
    accumulate: int = 1,
    precision: str = "fp32",
) -> DPResult:
    """The rank function: ``ranks(n).run(on_rank, setup, variant="bucketed")``, over ``ctx.mesh``'s dp group."""
    return train_dp(
        setup,
        variant=variant,
        group=ctx.mesh.group("dp"),
        device=ctx.device,
        cap_bytes=bucket_cap_bytes(bucket_mb),
        accumulate=accumulate,
        tracer=ctx.tracer,
        progress=ctx.progress,
        precision=precision,
    )


# ---- parity and scaling -----------------------------------------------------------------------
parity = compare  # loss, gradients, parameters (worst element and relative L2): see report.compare


def _median_after_first(values: list[float]) -> float:
    return statistics.median(values[1:] or values)  # step 0 warms up (allocations, DDP's first bucket pass)


def scaling_on_rank(
    ctx,
    setup: TrainSetup,
    *,
    sizes=(1, 2, 4),
    weak: bool = False,
    variant: str = "bucketed",
    bucket_mb: float = DEFAULT_BUCKET_MB,
) -> list[dict]:
    """Train on the first n ranks of this world for each n in ``sizes`` (a subgroup each; the other
    ranks wait at a barrier). Strong scaling: ``setup.global_batch`` fixed. Weak (``weak=True``):
    ``setup.global_batch`` rows *per rank*. Rank 0 returns one row per n; the others []."""
    if max(sizes) > ctx.world_size:
        raise ValueError(f"sizes {sizes} exceed the {ctx.world_size} ranks running; use ranks({max(sizes)})")
    world, rows = ctx.mesh.group("dp"), []
    for n in sizes:
        # The first n ranks of the world: no layout of this world is that group (a layout covers every
        # rank), so it is made here, per call and by every rank, outside the timed steps.
        group = dist.new_group(list(range(n)))
        if ctx.rank < n:
            run = replace(setup, global_batch=setup.global_batch * n) if weak else setup
            r = train_dp(
                run,
                variant=variant,
                group=group,
                device=ctx.device,
                cap_bytes=bucket_cap_bytes(bucket_mb),
                tracer=ctx.tracer,
            )
            compute = [
                sum(
                    s["end"] - s["start"]
                    for s in r.spans
                    if s["name"] in ("forward", "backward") and a <= s["start"] <= b
                )
                for a, b in r.windows
            ]
            rows.append(
                {
                    "ranks": n,
                    "global_batch": run.global_batch,
                    "per_rank_batch": run.global_batch // n,
                    "step_s": _median_after_first(r.step_seconds),
                    "compute_s": _median_after_first(compute),
                }
            )
        dist.barrier(group=world)
    return rows if ctx.rank == 0 else []


def scaling_table(rows: list[dict], seq_len: int, weak: bool = False) -> list[dict]:
    """Add throughput (tokens/s of the global batch) and efficiency against the first row.
    Strong: speedup = T₁/Tₙ, efficiency = speedup/n. Weak: efficiency = T₁/Tₙ (same work per rank)."""
    base = rows[0]
    out = []
    for r in rows:
        speedup = base["step_s"] / r["step_s"]
        scale = r["ranks"] / base["ranks"]
        out.append(
            {
                **r,
                "tokens_per_s": r["global_batch"] * seq_len / r["step_s"],
                "speedup": speedup * (scale if weak else 1),
                "efficiency": speedup if weak else speedup / scale,
                "compute_vs_base": r["compute_s"] / base["compute_s"],
            }
        )
    return out


# ---- `playbook run dp` -------------------------------------------------------------------------
def with_ddp_on_rank(ctx, setup: TrainSetup, *, variant: str, bucket_mb: float, accumulate: int, precision="fp32"):
    """Our variant, then DDP on the same ranks and data (once, if the variant is DDP)."""
    options = dict(bucket_mb=bucket_mb, accumulate=accumulate, precision=precision)
    ours = on_rank(ctx, setup, variant=variant, **options)
    return ours, (ours if variant == "ddp" else on_rank(ctx, setup, variant="ddp", **options))


def add_arguments(parser) -> None:
    parser.add_argument("--variant", choices=VARIANTS, default="bucketed")
    parser.add_argument(
        "--bucket-mb", type=float, default=DEFAULT_BUCKET_MB, help="bucket cap in MiB, as DDP's bucket_cap_mb"
    )
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step, reduced once (no_sync)")
    parser.add_argument(
        "--precision", choices=PRECISIONS, default="fp32", help="mixed: bf16 model and gradients, fp32 master + AdamW"
    )


@register(
    "dp",
    help="data parallel: naive, bucketed with overlap, or DDP; --accumulate K micro-batches",
    arguments=add_arguments,
    on_rank=on_rank,
    predict=predicted_comm,
)
def run_dp(
    setup: TrainSetup,
    *,
    world_size: int,
    backend: str = "auto",
    variant: str = "bucketed",
    bucket_mb: float = DEFAULT_BUCKET_MB,
    accumulate: int = 1,
    precision: str = "fp32",
) -> RunReport:
    if variant not in VARIANTS:
        raise ValueError(f"--variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    check_precision(precision)
    cap = bucket_cap_bytes(bucket_mb)
    micro = micro_batch(setup, world_size, accumulate)
    backend = default_backend(world_size) if backend == "auto" else backend
    ours, ddp = launch(
        with_ddp_on_rank,
        world_size,
        setup,
        variant=variant,
        bucket_mb=bucket_mb,
        accumulate=accumulate,
        precision=precision,
        backend=backend,
    )[0]
    cfg = setup.config()
    predicted = training_memory(
        cfg, seq_len=setup.seq_len, micro_batch=micro, precision=precision, n_tensors=cfg.num_param_tensors()
    ).as_dict()
    grad_bytes = 2 if precision == "mixed" else 4
    predicted["comm_buffers"] = grad_bytes * cfg.num_params() if variant == "bucketed" else None
    comm = functools.partial(predicted_comm, element_bytes=grad_bytes)
    reference = train_mixed(setup) if precision == "mixed" else single_process(setup)
    step = lambda r: _median_after_first(r.step_seconds)  # noqa: E731
    native = None
    if variant != "ddp":
        native = {
            **parity(ours, ddp, "DistributedDataParallel, same ranks and data"),
            "step_seconds": step(ddp),
            "step_time_ratio": step(ours) / step(ddp),
        }
    return RunReport(
        strategy="dp",
        world_size=world_size,
        backend=backend,
        parity=parity(ours, reference, "single process in mixed precision, same global batch")
        if precision == "mixed"
        else gated(parity(ours, reference), setup),
        native=native,
        memory={"predicted": predicted, "measured": ours.memory},
        comm={
            "predicted": comm(setup, world_size=world_size, variant=variant, cap_bytes=cap),
            "measured": measured_comm(ours, setup.steps),
        },
        setup={
            **setup.as_dict(),
            "variant": variant,
            "bucket_mb": bucket_mb,
            "accumulate": accumulate,
            "precision": precision,
            "micro_batch": micro,
            "step_seconds": step(ours),
            "buckets": ours.buckets,
        },
        losses=ours.losses,
    )
