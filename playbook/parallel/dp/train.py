"""One data-parallel rank's training: a variant of ``parallel.dp.ddp`` (naive, bucketed, DDP) plugged
into ``training.train`` as hooks (the micro-batches of a step and their forward and backward, then
the gradient all-reduce or the wait for the buckets), recording step times, tracer spans, the
buckets and memory by category (Li et al. 2020, arXiv:2006.15704).
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from playbook.cluster.trace.spans import without_loop_steps
from playbook.measure.memory import SavedActivations, gradient_bytes, optimizer_bytes, parameter_bytes
from playbook.cluster.trace.tracer import Tracer
from playbook.model.gpt import GPT
from playbook.parallel.dp.ddp import VARIANTS, BucketedAllReduce, accumulating, allreduce_each, micro_batch, wrap_ddp
from playbook.parallel.mixed import check_precision, optimizer_for, to_mixed
from playbook.parallel.training import TrainResult, TrainSetup, train


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
    micro-batches, each one's loss Σ token losses / the global batch's tokens (``lm_loss``), so that
    every backward adds this rank's share and the all-reduce sums; the loss reported is the global batch's. Memory is measured in the first step.
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
        loss, global_tokens = torch.zeros((), device=device), setup.global_batch * setup.seq_len
        for k in range(accumulate):
            rows, first = slice(k * micro, (k + 1) * micro), now["step"] == 0 and k == 0
            with accumulating(model, reducer, skip_sync=k < accumulate - 1):
                saved = SavedActivations(net) if first else nullcontext()
                with tracer.span("forward"), saved:
                    logits = model(tokens[rows])  # [micro, seq, vocab]
                    micro_loss = net.loss(logits, targets[rows], global_tokens)  # Σ over [micro, seq] / N
                with tracer.span("backward"):
                    micro_loss.backward()
            loss += micro_loss.detach()
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

    def global_loss(loss):  # the global batch's loss, for the report: the ranks' shares summed
        dist.all_reduce(loss, group=group)
        return loss

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


def median_after_first(values: list[float]) -> float:
    """The median step time, leaving out step 0 when there are others."""
    return statistics.median(values[1:] or values)  # step 0 warms up (allocations, DDP's first bucket pass)
