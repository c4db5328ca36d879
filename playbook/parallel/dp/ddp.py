"""Data parallelism: every rank holds the whole model, trains on its own slice of each global
batch, and sums the gradients before the optimizer step.

    L_r = Σ_{t ∈ rank r} ℓ_t / N,   g = Σ_r ∇L_r        (N: the global batch's tokens)

Each rank's loss is its share of the global batch's mean (``model.gpt.lm_loss``, the package's one
convention, torchtitan's), so the sum *is* the gradient of the global batch and n ranks follow the
single process step for step (up to the order of float additions). DDP instead averages the ranks'
gradients of their own means, (1/n) · Σ_r ∇mean_r: with equal tokens per rank, mean_r / n = L_r and
the two are the same; with uneven tokens (padding, loss masks) only Σ / N is the global mean
(``parallel.valid_tokens``). The price is one
all-reduce of every gradient per step: 4Ψ bytes in fp32, of which a ring all-reduce makes each
rank send 2·4Ψ·(n−1)/n (Patarasuk & Yuan 2009), however the gradients are grouped.

Grouping decides *when* and *how many times* we pay, not how many bytes:

1. **naive**: after backward, one blocking all-reduce per parameter tensor (t calls, each paying
   the collective's fixed latency, none overlapping compute);
2. **bucketed**: a hook on each parameter's gradient accumulation packs ready gradients into flat
   buckets (``playbook.theory.dp.buckets.bucket_plan``) and starts each bucket's all-reduce
   asynchronously while backward goes on; we wait for all of them before the optimizer step
   (Li et al. 2020, "PyTorch Distributed", VLDB, arXiv:2006.15704, §3.2.3);
3. **gradient accumulation**: K micro-batches per step, gradients summed locally and reduced only
   after the last one (DDP's ``no_sync``): communication per step does not grow with K.

The native counterpart is ``torch.nn.parallel.DistributedDataParallel``: its C++ reducer does 2 and
3. Its all-reduces are issued from C++, invisible to our tracer, so we give it a communication
hook that issues the same all-reduce through ``torch.distributed`` (and notes each bucket's
parameters): its bytes and buckets are then measured like ours.

This module holds the three ways of synchronising gradients; ``dp.train`` trains a rank with them on
the one training loop, and ``dp.run`` (``playbook run dp``) measures the runs.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from playbook.config import divisors, require_positive
from playbook.cluster.trace.tracer import Tracer, recording
from playbook.parallel.training import TrainSetup
from playbook.theory.dp.buckets import bucket_plan

VARIANTS = ("naive", "bucketed", "ddp")


def micro_batch(setup: TrainSetup, world_size: int, accumulate: int = 1) -> int:
    """Rows per micro-batch: the global batch split into world_size × accumulate equal pieces."""
    require_positive(world_size=world_size, accumulate=accumulate)
    pieces, g = world_size * accumulate, setup.global_batch
    if g % pieces:
        fix = (
            f"world_size in {{{', '.join(map(str, divisors(g)))}}}"
            if g % world_size
            else f"accumulate in {{{', '.join(map(str, divisors(g // world_size)))}}}"
        )
        raise ValueError(
            f"global_batch={g} does not split into world_size × accumulate = {world_size} × {accumulate} = "
            f"{pieces} equal micro-batches; try {fix}, or a global_batch that is a multiple of {pieces}"
        )
    return setup.global_batch // pieces


# ---- 1. naive: one all-reduce per gradient, after backward ------------------------------------
def allreduce_each(model: torch.nn.Module, group) -> None:
    """Sum every gradient over ``group``: one blocking all-reduce per parameter."""
    for p in model.parameters():
        dist.all_reduce(p.grad, group=group)  # in place: the sum over ranks, the global batch's gradient


# ---- 2. bucketed: all-reduce buckets during backward -------------------------------------------
class BucketedAllReduce:
    """Sum gradients bucket by bucket, each bucket's all-reduce started during backward.

    ``register_post_accumulate_grad_hook`` tells us when a parameter's ``.grad`` is final for this
    backward; when every gradient of the next bucket is in, it is copied into that bucket's flat
    buffer and ``all_reduce(async_op=True)`` starts. Buckets start strictly in plan order, the same
    on every rank, as collectives must be. ``wait()`` (before the optimizer) waits for each and
    copies the sums back into ``.grad``. While ``sync`` is False (micro-batches before
    the last one) the hooks do nothing and gradients just accumulate in ``.grad``.
    """

    def __init__(self, model: torch.nn.Module, cap_bytes: int, group, tracer: Tracer | None = None):
        named = list(model.named_parameters())
        self.params = dict(named)
        self.plan = bucket_plan([(n, p.numel()) for n, p in named], cap_bytes, element_bytes=named[0][1].element_size())
        self.bucket_of = {name: b.index for b in self.plan for name in b.names}
        self.group, self.n, self.tracer, self.sync = group, dist.get_world_size(group), tracer, True
        p0 = named[0][1]
        self.buffers = [
            torch.empty(b.numel, dtype=p0.dtype, device=p0.device) for b in self.plan
        ]  # [bucket numel] each
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
            raise RuntimeError(
                f"bucket {self.next} never filled: no gradient for {late or 'some parameters'}; "
                "every parameter must get a gradient in every backward (DDP: find_unused_parameters)"
            )
        for b, work in enumerate(self.works):
            work.wait()
            buffer, offset = self.buffers[b], 0  # the sum over ranks
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
    """DDP's all-reduce of a bucket's flat buffer (a ``dist.GradBucket``), issued through
    ``torch.distributed`` so that the tracer sees it; returns a ``Future`` of the reduced buffer."""
    state.buckets.append((state.step, bucket.index(), [state.names[id(p)] for p in bucket.parameters()]))
    # DDP's default hook divides by n first: it averages gradients of per-rank *means*. Our loss is
    # already Σ / global tokens (``dp.train``), so the hook only sums, as torchtitan switches off FSDP's
    # division (``disable_fsdp_gradient_division``); with equal tokens per rank both give one gradient.
    buffer = bucket.buffer()  # [bucket numel], flat
    with recording(state.tracer) if state.tracer else nullcontext():
        work = dist.all_reduce(buffer, group=state.group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])  # the tracer stamps the span's end


def wrap_ddp(model: torch.nn.Module, cap_bytes: int, group, tracer: Tracer | None) -> tuple[DDP, HookState]:
    device = next(model.parameters()).device
    ddp = DDP(
        model,
        device_ids=[device] if device.type == "cuda" else None,
        process_group=group,
        bucket_cap_mb=cap_bytes / 2**20,
        forward_sync_buffers=False,
    )  # (RoPE tables: constants)
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
