"""Every collective the strategies use, in one place: traced ``torch.distributed`` calls, and the
differentiable ones as our own ``autograd.Function`` s.

Why our own: ``torch.distributed.nn.functional.all_gather`` returns wrong gradients on gloo for a
non-contiguous incoming gradient (the appendix's case 4: its backward's receive buffers are
``empty_like(grad)``, with the gradient's strides); here every buffer handed to a collective
is ``.contiguous()``, and every path is checked against a single process. Each call goes through
the ``torch.distributed`` namespace, so the tracer (``playbook.cluster.trace.tracer``) records it with its
group and mesh axis.

- Megatron's conjugate pair (Shoeybi et al. 2019, §3): ``f`` = identity forward, all-reduce
  backward; ``g`` = all-reduce forward, identity backward. With sequence parallelism (Korthikanti
  et al. 2022, §4.2.2) an all-gather along the sequence and its reduce-scatter take their place.
- ``AllToAll``: uneven all-to-all whose backward is the same exchange with the splits swapped
  (expert parallelism, GShard, Lepikhin et al. 2020).
- ``GatherRows`` / ``ScatterSumRows``: all-gather along rows, and its conjugate reduce-scatter.
- ``ring_pass``: one step of a ring (send to the next rank, receive from the previous), for ring
  attention (Liu et al. 2023).
- ``all_reduce_flat``: one flat all-reduce for a list of gradients, the way DDP buckets them.

Ranks given to point-to-point calls are global ranks (torch's convention), translated from
group-local ones by ``dist.get_global_rank`` or ``Mesh.global_rank``.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist

from playbook.cluster.trace import tracer as trace


# ---- collectives on traced dist.* calls (not differentiable) ----------------------------------
def _region(label: str, phase: str):
    """A labelled span around one collective. A forward collective issued while autograd runs a
    backward pass is activation recomputation (``recompute="full"``): labelled "recompute" (told by
    ``torch._C._current_graph_task_id``, private, the same test ``torch.utils.checkpoint`` uses)."""
    tracer = trace.current()
    if tracer is None:
        return nullcontext()
    if phase == "forward" and getattr(torch._C, "_current_graph_task_id", lambda: -1)() != -1:
        phase = "recompute"
    return tracer.span(f"tp:{label}:{phase}")


def all_reduce(x, group, label, phase, op=dist.ReduceOp.SUM):
    """Sum (or ``op``) of ``x`` over the group, into a new tensor."""
    out = x.contiguous().clone()
    with _region(label, phase):
        dist.all_reduce(out, op=op, group=group)
    return out


def all_gather(x, dim, group, label, phase):
    """Concatenate every rank's ``x`` along ``dim`` (rank order)."""
    t = dist.get_world_size(group)
    x = x.movedim(dim, 0).contiguous()  # [n, ...]: all_gather_single gathers along dim 0
    out = x.new_empty((t * x.shape[0], *x.shape[1:]))  # [t*n, ...]
    with _region(label, phase):
        dist.all_gather_single(out, x, group=group)
    return out.movedim(0, dim).contiguous()  # one [b, s, h] tensor, so q, k and v share one saved input


def reduce_scatter(x, dim, group, label, phase):
    """Sum ``x`` over the group and keep this rank's 1/t slice along ``dim``."""
    t = dist.get_world_size(group)
    x = x.movedim(dim, 0).contiguous()  # [t*n, ...]
    out = x.new_empty((x.shape[0] // t, *x.shape[1:]))  # [n, ...]
    with _region(label, phase):
        dist.reduce_scatter_single(out, x, group=group)
    return out.movedim(0, dim).contiguous()


# ---- the conjugate operators (names as in Megatron-LM's mappings.py) ----------------------------
class CopyToModelParallelRegion(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group, label):
        ctx.group, ctx.label = group, label
        return x

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.group, ctx.label, "backward"), None, None


class ReduceFromModelParallelRegion(torch.autograd.Function):
    """Megatron's g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group, label):
        return all_reduce(x, group, label, "forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    """Korthikanti's g (SP): all-gather the sequence forward, reduce-scatter the gradient backward.
    Sequence is dim 1 of our [batch, seq, hidden] activations."""

    @staticmethod
    def forward(ctx, x, group, label):
        ctx.group, ctx.label = group, label
        return all_gather(x, 1, group, label, "forward")

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter(grad, 1, ctx.group, ctx.label, "backward"), None, None


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Korthikanti's ḡ (SP): reduce-scatter to sequence shards forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, group, label):
        ctx.group, ctx.label = group, label
        return reduce_scatter(x, 1, group, label, "forward")

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, 1, ctx.group, ctx.label, "backward"), None, None


f, g = CopyToModelParallelRegion.apply, ReduceFromModelParallelRegion.apply


# ---- rows: all-to-all, all-gather and reduce-scatter with gradients ---------------------------
class AllToAll(torch.autograd.Function):
    """Rows [sum(send), ...] -> rows [sum(recv), ...]: ``send[i]`` rows go to rank i of the group,
    ``recv[i]`` arrive from it, in rank order. Backward: the same exchange with the splits swapped."""

    @staticmethod
    def forward(ctx, x, send: list[int], recv: list[int], group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))  # [R, h]
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))  # [S, h]
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out, None, None, None


def all_to_all(x: torch.Tensor, send: list[int], recv: list[int], group, native: bool = False) -> torch.Tensor:
    """Our :class:`AllToAll`, or PyTorch's own differentiable one (functional collectives), which
    the tracer does not see."""
    if native:
        from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

        return wait_tensor(all_to_all_single_autograd(x.contiguous(), recv, send, group))
    return AllToAll.apply(x, send, recv, group)


class GatherRows(torch.autograd.Function):
    """All-gather along rows (every rank the same count); backward: reduce-scatter (sum)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, n = group, dist.get_world_size(group)
        out = x.new_empty((n * x.shape[0], *x.shape[1:]))  # [n*T, h]
        dist.all_gather_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((grad.shape[0] // dist.get_world_size(ctx.group), *grad.shape[1:]))  # [T, h]
        dist.reduce_scatter_single(out, grad.contiguous(), group=ctx.group)
        return out, None


class ScatterSumRows(torch.autograd.Function):
    """Reduce-scatter (sum) along rows; backward: all-gather."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.new_empty((x.shape[0] // dist.get_world_size(group), *x.shape[1:]))  # [T, h]
        dist.reduce_scatter_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return GatherRows.apply(grad, ctx.group), None


def gather_shards(x: torch.Tensor, group) -> torch.Tensor:
    """x [...] on each rank -> [n, ...] in rank order (all-gather); backward: reduce-scatter, so each
    rank gets the sum of every rank's gradient for its own shard."""
    return GatherRows.apply(x[None], group)  # [n, ...]


def all_reduce_flat(tensors: list[torch.Tensor], group) -> None:
    """Sum a list of tensors over ``group`` in ONE all-reduce of a flat buffer (in place): every
    gradient reduction is a sum (``model.gpt.lm_loss``). One call instead of one per tensor:
    ~5 ms per gloo call at 4 ranks on a shared 2-core machine."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])  # [sum of numels]
    dist.all_reduce(flat, group=group)
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(part.view_as(t))


# ---- point to point: one step around a ring ------------------------------------------------------
def _neighbours(group) -> tuple[int, int, int, int]:
    """(rank in group, group size, global rank of the next rank, of the previous rank) on the ring."""
    r, n = dist.get_rank(group), dist.get_world_size(group)
    return r, n, dist.get_global_rank(group, (r + 1) % n), dist.get_global_rank(group, (r - 1) % n)


def ring_pass(send: torch.Tensor, group):
    """Start sending ``send`` to the next rank and receiving the previous rank's into a new buffer.
    Returns (buffer, works): wait on the works before reading the buffer."""
    _, _, nxt, prv = _neighbours(group)
    recv = torch.empty_like(send)
    ops = [dist.P2POp(dist.isend, send, nxt, group), dist.P2POp(dist.irecv, recv, prv, group)]
    return recv, dist.batch_isend_irecv(ops)


def _wait(works) -> None:
    for w in works:
        w.wait()
