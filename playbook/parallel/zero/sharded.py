"""A sharded run (our ZeRO, PyTorch's FSDP2) on the one training loop, measured as chapter 2 shows it.

``train_sharded`` is ``training.train`` with hooks: this rank's rows of each global batch, a
forward that saves activations besides the weights and a backward (``forward_backward``), what is
left to reduce after backward (``sync_grads``), the sharded optimizer, and the global batch's loss.
Around them it records what the rank holds at three moments of each step (:data:`MOMENTS`,
Rajbhandari et al. 2019, *ZeRO*, arXiv:1910.02054, §3's categories), bytes and calls per step by
collective, and the last step's spans. The strategies replace the gradients and parameters with
whole tensors gathered afterwards, once the step's traffic has been counted.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from playbook.cluster.trace.spans import comm_per_step, without_loop_steps
from playbook.measure.sharding import SavedActivationsBesides
from playbook.parallel.report import RunReport
from playbook.parallel.training import TrainResult, TrainSetup, train

MOMENTS = ("after forward", "after backward", "after step")


@dataclass
class ShardedResult(TrainResult):
    """A :class:`TrainResult` plus what one sharded rank measured (memory by moment, comm, timeline)."""

    moments: dict = field(default_factory=dict)  # moment -> category -> bytes (last step)
    comm: dict = field(default_factory=dict)  # op -> bytes sent per step
    counts: dict = field(default_factory=dict)  # op -> calls per step
    spans: list = field(default_factory=list)  # tracer spans of the last step (dicts)
    gathered_log: list = field(default_factory=list)  # ZeRO-3, last step: (time, phase, bytes of whole units)
    step_seconds: list = field(default_factory=list)


@dataclass
class ShardedReport(RunReport):
    """A :class:`RunReport` with notes (padding, transient buffers) printed under the summary."""

    notes: list = field(default_factory=list)

    def summary(self) -> str:
        return "\n".join([super().summary(), *(f"  note: {x}" for x in self.notes)])


class _Stepped:
    """The optimizer as the loop calls it, its step traced as ``step`` and followed by the moment
    ``after step``."""

    def __init__(self, optimizer, tracer, held, moments: dict):
        self.optimizer, self.tracer, self.held, self.moments = optimizer, tracer, held, moments

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        with self.tracer.span("step"):
            self.optimizer.step()
        self.moments["after step"] = self.held()


def train_sharded(
    ctx,
    setup: TrainSetup,
    *,
    model,
    optimizer,
    loss,
    held,
    weights,
    sync_grads=None,
    compute_spans: bool = True,
    collect=None,
) -> ShardedResult:
    """``setup.steps`` steps of ``training.train`` on this rank's rows, over ``ctx.mesh``'s dp group.

    - ``loss(tokens, targets, global_tokens)``: the sharded forward, Σ these rows' token losses / the
      global batch's tokens (``model.gpt.lm_loss``): this rank's share, its gradients summed over the ranks;
    - ``optimizer``: ``zero_grad()`` and ``step()`` (a ``Zero``, or AdamW over FSDP2's shards);
    - ``held()``: bytes held now by category; ``weights()``: the weights' storages now (not activations);
    - ``sync_grads(model)``: what is left to reduce after backward (None where backward did it);
    - ``compute_spans``: mark ``forward``/``backward`` (ZeRO-3 marks each unit itself);
    - ``collect``: what the loop keeps of a gradient or parameter (as ``training.train``).
    """
    group = ctx.mesh.group("dp")
    n, rank, spans = dist.get_world_size(group), dist.get_rank(group), ctx.tracer.spans
    task, moments, step_seconds, now = setup.task(), {}, [], {}
    span = ctx.tracer.span if compute_spans else (lambda name: nullcontext())
    first = len(spans)

    def batch(step):
        now["start"], now["t0"] = len(spans), time.perf_counter()
        return task.batch(step, setup.global_batch, setup.seq_len, rank, n, device=ctx.device)  # [G/n, seq] each

    def forward_backward(_, tokens, targets):
        with SavedActivationsBesides(weights) as saved, span("forward"):
            value = loss(tokens, targets, setup.global_batch * setup.seq_len)
        now["activations"] = saved.bytes
        moments["after forward"] = held()
        with span("backward"):
            value.backward()
        return value

    def after_backward(m):
        if sync_grads is not None:
            sync_grads(m)
        moments["after backward"] = held()

    def global_loss(value):  # the global batch's mean loss, the ranks' shares summed (fp32 whatever the model's dtype)
        total = value.detach().to(torch.float32, copy=True)
        dist.all_reduce(total, group=group)
        return float(total)

    def progress(done, total):
        step_seconds.append(time.perf_counter() - now["t0"])
        ctx.progress(done, total)

    result = train(
        setup,
        device=ctx.device,
        model=model,
        optimizer=_Stepped(optimizer, ctx.tracer, held, moments),
        batch=batch,
        forward_backward=forward_backward,
        sync_grads=after_backward,
        sync_loss=global_loss,
        collect=collect,
        progress=progress,
    )
    sent, calls = comm_per_step(spans[first:], setup.steps)
    memory = {**moments["after step"], "grads": moments["after backward"]["grads"], "activations": now["activations"]}
    return ShardedResult(
        result.losses,
        result.grads,
        result.params,
        memory,
        moments=moments,
        comm=sent,
        counts=calls,
        spans=without_loop_steps(spans[now["start"] :]),
        step_seconds=step_seconds,
    )
