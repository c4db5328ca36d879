"""Data parallelism: every rank holds the whole model, trains on its own slice of each global
batch, and averages the gradients before the optimizer step.

    g = (1/n) · Σ_r g_r

With equal slices and a mean loss, that average *is* the gradient of the global batch, so n ranks
follow the single process step for step (up to the order of float additions). The price is one
all-reduce of every gradient per step: 4Ψ bytes in fp32, of which a ring all-reduce makes each
rank send 2·4Ψ·(n−1)/n (Patarasuk & Yuan 2009), however the gradients are grouped.

Grouping decides *when* and *how many times* we pay, not how many bytes:

1. **naive**: after backward, one blocking all-reduce per parameter tensor (t calls, each paying
   the collective's fixed latency, none overlapping compute);
2. **bucketed**: a hook on each parameter's gradient accumulation packs ready gradients into flat
   buckets (``playbook.theory.buckets.bucket_plan``) and starts each bucket's all-reduce
   asynchronously while backward goes on; we wait for all of them before the optimizer step
   (Li et al. 2020, "PyTorch Distributed", VLDB, arXiv:2006.15704, §3.2.3);
3. **gradient accumulation**: K micro-batches per step, gradients summed locally and reduced only
   after the last one (DDP's ``no_sync``): communication per step does not grow with K.

The native counterpart is ``torch.nn.parallel.DistributedDataParallel``: its C++ reducer does 2 and
3. Its all-reduces are issued from C++, invisible to our tracer, so we give it a communication
hook that issues the same all-reduce through ``torch.distributed`` (and notes each bucket's
parameters): its bytes and buckets are then measured like ours.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from functools import partial

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from playbook.cluster import default_backend, launch
from playbook.config import divisors, require_positive
from playbook.measure.memory import SavedActivations, gradient_bytes, optimizer_bytes, parameter_bytes
from playbook.measure.trace import Tracer, bytes_by_op, counts_by_op, recording
from playbook.model import GPT
from playbook.parallel.registry import register
from playbook.parallel.report import RunReport, compare, rel_l2_diff  # noqa: F401  (rel_l2_diff: part of this chapter's API)
from playbook.parallel.training import TrainResult, TrainSetup, train
from playbook.theory.buckets import bucket_cap_bytes, bucket_plan, parameter_shapes
from playbook.theory.comm import sent_bytes
from playbook.theory.memory import training_memory

VARIANTS = ("naive", "bucketed", "ddp")
DEFAULT_BUCKET_MB = 0.1  # MiB: four buckets for gpt-tiny (DDP's default, 25 MiB, would make one)


def micro_batch(setup: TrainSetup, world_size: int, accumulate: int = 1) -> int:
    """Rows per micro-batch: the global batch split into world_size × accumulate equal pieces."""
    require_positive(world_size=world_size, accumulate=accumulate)
    pieces, g = world_size * accumulate, setup.global_batch
    if g % pieces:
        fix = (f"world_size in {{{', '.join(map(str, divisors(g)))}}}" if g % world_size
               else f"accumulate in {{{', '.join(map(str, divisors(g // world_size)))}}}")  # fmt: skip
        raise ValueError(
            f"global_batch={g} does not split into world_size × accumulate = {world_size} × {accumulate} = "
            f"{pieces} equal micro-batches; try {fix}, or a global_batch that is a multiple of {pieces}"
        )
    return setup.global_batch // pieces


# ---- 1. naive: one all-reduce per gradient, after backward ------------------------------------
def allreduce_each(model: torch.nn.Module, group) -> None:
    """Average every gradient over ``group``: one blocking all-reduce (a sum) per parameter."""
    n = dist.get_world_size(group)
    for p in model.parameters():
        dist.all_reduce(p.grad, group=group)  # in place: the sum over ranks
        p.grad.div_(n)


# ---- 2. bucketed: all-reduce buckets during backward -------------------------------------------
class BucketedAllReduce:
    """Average gradients bucket by bucket, each bucket's all-reduce started during backward.

    ``register_post_accumulate_grad_hook`` tells us when a parameter's ``.grad`` is final for this
    backward; when every gradient of the next bucket is in, it is copied into that bucket's flat
    buffer and ``all_reduce(async_op=True)`` starts. Buckets start strictly in plan order, the same
    on every rank, as collectives must be. ``wait()`` (before the optimizer) waits for each, divides
    by n and copies the averages back into ``.grad``. While ``sync`` is False (micro-batches before
    the last one) the hooks do nothing and gradients just accumulate in ``.grad``.
    """

    def __init__(self, model: torch.nn.Module, cap_bytes: int, group, tracer: Tracer | None = None):
        named = list(model.named_parameters())
        self.params = dict(named)
        self.plan = bucket_plan([(n, p.numel()) for n, p in named], cap_bytes, element_bytes=named[0][1].element_size())
        self.bucket_of = {name: b.index for b in self.plan for name in b.names}
        self.group, self.n, self.tracer, self.sync = group, dist.get_world_size(group), tracer, True
        p0 = named[0][1]
        self.buffers = [torch.empty(b.numel, dtype=p0.dtype, device=p0.device) for b in self.plan]  # [bucket numel] each
        self.hooks = [p.register_post_accumulate_grad_hook(partial(self._ready, name)) for name, p in named]
        self._reset()

    def _reset(self) -> None:
        self.missing = [len(b.names) for b in self.plan]  # gradients still to come, per bucket
        self.works, self.next = [], 0

    def _ready(self, name: str, param: torch.Tensor) -> None:
        if not self.sync:
            return
        self.missing[self.bucket_of[name]] -= 1
        while self.next < len(self.plan) and self.missing[self.next] == 0:
            self._launch(self.next)
            self.next += 1

    def _launch(self, b: int) -> None:
        buffer, offset = self.buffers[b], 0  # [bucket numel]
        for name, k in zip(self.plan[b].names, self.plan[b].numels):
            buffer[offset : offset + k].copy_(self.params[name].grad.reshape(-1))  # [k]
            offset += k
        with recording(self.tracer) if self.tracer else nullcontext():  # hooks may run on autograd's own thread
            work = dist.all_reduce(buffer, group=self.group, async_op=True)
        self.works.append(work)  # the tracer stamps its span's end when the all-reduce completes

    def wait(self) -> None:
        if self.next < len(self.plan):
            late = [n for b in self.plan[self.next :] for n in b.names if self.params[n].grad is None]
            raise RuntimeError(f"bucket {self.next} never filled: no gradient for {late or 'some parameters'}; "
                               "every parameter must get a gradient in every backward (DDP: find_unused_parameters)")  # fmt: skip
        for b, work in enumerate(self.works):
            work.wait()
            buffer, offset = self.buffers[b].div_(self.n), 0  # the sum -> the mean
            for name, k in zip(self.plan[b].names, self.plan[b].numels):
                grad = self.params[name].grad
                grad.copy_(buffer[offset : offset + k].view_as(grad))
                offset += k
        self._reset()

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()


# ---- native: DistributedDataParallel, its all-reduces recorded by a communication hook ---------
@dataclass
class HookState:
    group: object
    tracer: Tracer | None
    names: dict[int, str]  # id(parameter) -> name
    step: int = 0
    buckets: list[tuple[int, int, list[str]]] = field(default_factory=list)  # (step, index, names)


def traced_allreduce_hook(state: HookState, bucket):  # no annotations: DDP checks them, and this module's are strings
    """DDP's default hook (divide by n, then all-reduce the bucket's flat buffer, a
    ``dist.GradBucket``), issued through ``torch.distributed`` so that the tracer sees it; returns
    a ``Future`` of the reduced buffer."""
    state.buckets.append((state.step, bucket.index(), [state.names[id(p)] for p in bucket.parameters()]))
    buffer = bucket.buffer().div_(dist.get_world_size(state.group))  # [bucket numel], flat
    with recording(state.tracer) if state.tracer else nullcontext():
        work = dist.all_reduce(buffer, group=state.group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])  # the tracer stamps the span's end


def wrap_ddp(model: torch.nn.Module, cap_bytes: int, group, tracer: Tracer | None) -> tuple[DDP, HookState]:
    device = next(model.parameters()).device
    ddp = DDP(model, device_ids=[device] if device.type == "cuda" else None, process_group=group,
              bucket_cap_mb=cap_bytes / 2**20, forward_sync_buffers=False)  # fmt: skip  (RoPE tables: constants)
    state = HookState(group, tracer, {id(p): n for n, p in model.named_parameters()})
    ddp.register_comm_hook(state, traced_allreduce_hook)
    return ddp, state


@contextmanager
def accumulating(model, reducer: BucketedAllReduce | None, skip_sync: bool):
    """Gradients of this micro-batch only accumulate (no communication) while ``skip_sync``."""
    if reducer is not None:
        reducer.sync = not skip_sync
    with model.no_sync() if skip_sync and isinstance(model, DDP) else nullcontext():
        yield


# ---- one training loop for all three, checked against training.train -------------------------
@dataclass
class DPResult(TrainResult):
    """A rank's run: TrainResult plus step times, the run's tracer spans, each step's
    (start, end) window (perf_counter seconds) and the buckets all-reduced in the last step."""

    step_seconds: list[float] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)
    spans: list[dict] = field(default_factory=list, repr=False)
    buckets: list[list[str]] = field(default_factory=list)
    first_buckets: list[list[str]] = field(default_factory=list)  # step 0's (DDP starts with one)


def train_dp(setup: TrainSetup, *, variant: str, group, device="cpu", cap_bytes: int = 2**20,
             accumulate: int = 1, tracer: Tracer | None = None, progress=None) -> DPResult:  # fmt: skip
    """``setup.steps`` AdamW steps of data parallelism over ``group``, as :func:`training.train`
    does in one process: same model, data, optimizer; this rank's rows split into ``accumulate``
    micro-batches; the loss reported is the global batch's."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    micro = micro_batch(setup, n, accumulate)
    tracer = tracer or Tracer(rank)
    net = GPT(setup.config(), seed=setup.seed).to(device)
    model, reducer, hook = net, None, None
    if variant == "bucketed":
        reducer = BucketedAllReduce(net, cap_bytes, group, tracer)
    elif variant == "ddp":
        model, hook = wrap_ddp(net, cap_bytes, group, tracer)
    optimizer = torch.optim.AdamW(net.parameters(), lr=setup.lr)
    task, first_span = setup.task(), len(tracer.spans)
    out = DPResult([], {}, {})
    for step in range(setup.steps):
        start = time.perf_counter()
        if hook is not None:
            hook.step = step
        tokens, targets = task.batch(step, setup.global_batch, setup.seq_len, rank, n, device=device)  # [G/n, seq]
        optimizer.zero_grad(set_to_none=True)
        loss = torch.zeros((), device=device)
        for k in range(accumulate):
            rows = slice(k * micro, (k + 1) * micro)
            with accumulating(model, reducer, skip_sync=k < accumulate - 1):
                saved = SavedActivations(net) if step == 0 and k == 0 else nullcontext()
                with tracer.span("forward"), saved:
                    _, micro_loss = model(tokens[rows], targets[rows])  # mean over [micro, seq]
                with tracer.span("backward"):
                    (micro_loss / accumulate).backward()
            loss += micro_loss.detach() / accumulate
            if step == 0 and k == 0:
                out.memory = {"params": parameter_bytes(net), "activations": saved.bytes}
        if variant == "naive":
            allreduce_each(net, group)
        elif variant == "bucketed":
            with tracer.span("wait"):
                reducer.wait()
        if step == 0:
            out.grads = {name: p.grad.detach().cpu().clone() for name, p in net.named_parameters()}
            out.memory["grads"] = gradient_bytes(net)
        with tracer.span("optimizer"):
            optimizer.step()
        if step == 0:
            out.memory["optimizer"] = optimizer_bytes(optimizer)
            out.memory["comm_buffers"] = sum(b.numel() * b.element_size() for b in reducer.buffers) if reducer else None
        dist.all_reduce(loss, group=group)  # the global batch's loss, for the report
        out.losses.append(float(loss / n))
        out.windows.append((start, time.perf_counter()))
        out.step_seconds.append(out.windows[-1][1] - start)
        if progress is not None:
            progress(step + 1, setup.steps)
    out.params = {name: p.detach().cpu().clone() for name, p in net.named_parameters()}
    out.spans = [s.as_dict() for s in tracer.spans[first_span:]]
    if reducer is not None:
        reducer.remove()
        out.buckets = out.first_buckets = [list(b.names) for b in reducer.plan]
    if hook is not None:
        by_step = lambda s: [names for st, _, names in sorted(hook.buckets, key=lambda x: x[1]) if st == s]  # noqa: E731
        out.first_buckets, out.buckets = by_step(0), by_step(setup.steps - 1)
    return out


def dp_on_rank(ctx, setup: TrainSetup, variant: str = "bucketed", bucket_mb: float = DEFAULT_BUCKET_MB,
               accumulate: int = 1) -> DPResult:  # fmt: skip
    """The rank function: ``ranks(n).run(dp_on_rank, setup, "bucketed")``."""
    return train_dp(setup, variant=variant, group=ctx.group, device=ctx.device, cap_bytes=bucket_cap_bytes(bucket_mb),
                    accumulate=accumulate, tracer=ctx.tracer, progress=ctx.progress)  # fmt: skip


# ---- predicted vs measured communication ------------------------------------------------------
def predicted_comm(setup: TrainSetup, world_size: int, variant: str, cap_bytes: int) -> dict[str, float]:
    """Per step on each rank: bytes sent by all-reduce (every fp32 gradient, 4Ψ, plus the 4-byte
    loss) under the ring formula, and the number of all-reduce calls (tensors or buckets, + 1)."""
    cfg = setup.config()
    buffer = 4 * cfg.num_params() + 4
    calls = cfg.num_param_tensors() if variant == "naive" else len(bucket_plan(parameter_shapes(cfg), cap_bytes))
    return {"all_reduce": sent_bytes("all_reduce", buffer, world_size), "all_reduce buffer": buffer, "all_reduce calls": calls + 1}


def measured_comm(result: DPResult, steps: int) -> dict[str, float]:
    """The same three numbers from a rank's tracer spans (calls: in the last step)."""
    first, last = result.windows[-1]
    in_last_step = [s for s in result.spans if first <= s["start"] <= last]
    return {
        "all_reduce": bytes_by_op(result.spans, per=steps).get("all_reduce", 0.0),
        "all_reduce buffer": bytes_by_op(result.spans, "bytes", per=steps).get("all_reduce", 0.0),
        "all_reduce calls": counts_by_op(in_last_step).get("all_reduce", 0),
    }


# ---- parity and scaling -----------------------------------------------------------------------
parity = compare  # loss, gradients, parameters (worst element and relative L2): see report.compare


def _median_after_first(values: list[float]) -> float:
    return statistics.median(values[1:] or values)  # step 0 warms up (allocations, DDP's first bucket pass)


def scaling_on_rank(ctx, setup: TrainSetup, sizes=(1, 2, 4), weak: bool = False, variant: str = "bucketed",
                    bucket_mb: float = DEFAULT_BUCKET_MB) -> list[dict]:  # fmt: skip
    """Train on the first n ranks of this world for each n in ``sizes`` (a subgroup each; the other
    ranks wait at a barrier). Strong scaling: ``setup.global_batch`` fixed. Weak (``weak=True``):
    ``setup.global_batch`` rows *per rank*. Rank 0 returns one row per n; the others []."""
    if max(sizes) > ctx.world_size:
        raise ValueError(f"sizes {sizes} exceed the {ctx.world_size} ranks running; use ranks({max(sizes)})")
    rows = []
    for n in sizes:
        group = dist.new_group(list(range(n)))  # every rank takes part in creating every group
        if ctx.rank < n:
            run = replace(setup, global_batch=setup.global_batch * n) if weak else setup
            r = train_dp(run, variant=variant, group=group, device=ctx.device, cap_bytes=bucket_cap_bytes(bucket_mb), tracer=ctx.tracer)
            compute = [sum(s["end"] - s["start"] for s in r.spans if s["name"] in ("forward", "backward") and a <= s["start"] <= b)
                       for a, b in r.windows]  # fmt: skip
            rows.append({"ranks": n, "global_batch": run.global_batch, "per_rank_batch": run.global_batch // n,
                         "step_s": _median_after_first(r.step_seconds), "compute_s": _median_after_first(compute)})  # fmt: skip
        dist.barrier(group=ctx.group)
    return rows if ctx.rank == 0 else []


def scaling_table(rows: list[dict], seq_len: int, weak: bool = False) -> list[dict]:
    """Add throughput (tokens/s of the global batch) and efficiency against the first row.
    Strong: speedup = T₁/Tₙ, efficiency = speedup/n. Weak: efficiency = T₁/Tₙ (same work per rank)."""
    base = rows[0]
    out = []
    for r in rows:
        speedup = base["step_s"] / r["step_s"]
        scale = r["ranks"] / base["ranks"]
        out.append({**r, "tokens_per_s": r["global_batch"] * seq_len / r["step_s"],
                    "speedup": speedup * (scale if weak else 1), "efficiency": speedup if weak else speedup / scale,
                    "compute_vs_base": r["compute_s"] / base["compute_s"]})  # fmt: skip
    return out


# ---- `playbook run dp` -------------------------------------------------------------------------
def with_ddp_on_rank(ctx, setup, variant, bucket_mb, accumulate):
    """Our variant, then DDP on the same ranks and data (once, if the variant is DDP)."""
    ours = dp_on_rank(ctx, setup, variant, bucket_mb, accumulate)
    return ours, (ours if variant == "ddp" else dp_on_rank(ctx, setup, "ddp", bucket_mb, accumulate))


def add_dp_arguments(parser) -> None:
    parser.add_argument("--variant", choices=VARIANTS, default="bucketed")
    parser.add_argument("--bucket-mb", type=float, default=DEFAULT_BUCKET_MB, help="bucket cap in MiB, as DDP's bucket_cap_mb")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step, reduced once (no_sync)")


@register("dp", help="data parallel: naive, bucketed with overlap, or DDP; --accumulate K micro-batches", arguments=add_dp_arguments)
def run_dp(setup: TrainSetup, *, world_size: int, backend: str = "auto", variant: str = "bucketed",
           bucket_mb: float = DEFAULT_BUCKET_MB, accumulate: int = 1) -> RunReport:  # fmt: skip
    if variant not in VARIANTS:
        raise ValueError(f"--variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    cap = bucket_cap_bytes(bucket_mb)
    micro = micro_batch(setup, world_size, accumulate)
    backend = default_backend(world_size) if backend == "auto" else backend
    ours, ddp = launch(with_ddp_on_rank, world_size, setup, variant, bucket_mb, accumulate, backend=backend)[0]
    cfg = setup.config()
    predicted = training_memory(cfg, seq_len=setup.seq_len, micro_batch=micro, precision="fp32", n_tensors=cfg.num_param_tensors()).as_dict()  # fmt: skip
    predicted["comm_buffers"] = 4 * cfg.num_params() if variant == "bucketed" else None
    step = lambda r: _median_after_first(r.step_seconds)  # noqa: E731
    native = None
    if variant != "ddp":
        native = {**parity(ours, ddp, "DistributedDataParallel, same ranks and data"),
                  "step_seconds": step(ddp), "step_time_ratio": step(ours) / step(ddp)}  # fmt: skip
    return RunReport(
        strategy="dp", world_size=world_size, backend=backend,
        parity=parity(ours, train(setup)), native=native,
        memory={"predicted": predicted, "measured": ours.memory},
        comm={"predicted": predicted_comm(setup, world_size, variant, cap), "measured": measured_comm(ours, setup.steps)},
        setup={**setup.as_dict(), "variant": variant, "bucket_mb": bucket_mb, "accumulate": accumulate,
               "micro_batch": micro, "step_seconds": step(ours), "buckets": ours.buckets},
        losses=ours.losses,
    )  # fmt: skip
