"""FSDP2, PyTorch's ``fully_shard``: the native counterpart of our ZeRO-3.

Zhao et al. 2023, *PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel*
(arXiv:2304.11277); FSDP2 is its per-parameter rewrite (``torch.distributed.fsdp.fully_shard``).
The same idea as ZeRO-3, with one difference in the bookkeeping: every parameter becomes a
``DTensor`` split on its first dimension over the mesh (``Shard(0)``), instead of a slice of one
flat buffer. Each module passed to ``fully_shard`` is one *group*: its parameters are all-gathered
together before its forward and backward and its gradients reduce-scattered together. We shard
every block, then the root (embedding, final norm, head), bottom-up as the docs ask, and build the
optimizer afterwards so that it sees the sharded parameters.

FSDP2 issues its all-gathers and reduce-scatters through ``torch.distributed``'s
``all_gather_single`` / ``reduce_scatter_single`` (torch 2.13), so our tracer records them like
our own. What it keeps per rank, in fp32, when the ranks divide each weight's first dimension:
4Ψ/N + 4Ψ/N + 8Ψ/N, plus one AdamW ``step`` per parameter tensor (``theory.zero.fsdp2_state_bytes``).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from playbook.cluster import default_backend, launch
from playbook.measure.memory import SavedActivations
from playbook.model import GPT
from playbook.parallel.registry import register
from playbook.parallel.report import compare
from playbook.parallel.training import TrainSetup, train
from playbook.parallel.zero import MOMENTS, ShardedReport, ShardedResult, comm_per_step, storage_bytes
from playbook.theory.zero import fsdp2_state_bytes


def shard_model(model: GPT, mesh, *, reshard_after_forward: bool = True) -> GPT:
    """``fully_shard`` each block, then the root: one all-gather group per block, one for the rest."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def _local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds: the storages behind the parameters (sharded, or whole while gathered),
    their gradients, and AdamW's states (local shards of DTensors, plus the ``step`` scalars)."""
    params = list(model.parameters())
    states = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {
        "params": storage_bytes([_local(p) for p in params]),
        "grads": storage_bytes([_local(p.grad) for p in params if p.grad is not None]),
        "optimizer": storage_bytes([_local(v) for v in states]),
    }


class _Activations(SavedActivations):
    """Saved activations, leaving out the storages of the weights (and views of them, such as the
    transposed weight a matmul saves) as they are when saved: FSDP2's gathered weights during the
    forward of their group, and the RoPE tables."""

    def __init__(self, model: nn.Module):
        super().__init__(None)
        self.model = model

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        weights = [*(_local(p) for p in self.model.parameters()), *self.model.buffers()]
        if t.untyped_storage().data_ptr() in {w.untyped_storage().data_ptr() for w in weights}:
            return t
        return super()._pack(t)


def train_fsdp2(ctx, setup: TrainSetup, reshard_after_forward: bool = True) -> ShardedResult:
    """Rank function: ``setup.steps`` AdamW steps with FSDP2 on a 1-D mesh over all ranks."""
    n, rank = ctx.world_size, ctx.rank
    mesh = init_device_mesh(ctx.device.type, (n,))
    model = shard_model(GPT(setup.config(), seed=setup.seed).to(ctx.device), mesh,
                        reshard_after_forward=reshard_after_forward)  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=setup.lr)  # after sharding: sees the DTensor shards
    task, spans = setup.task(), ctx.tracer.spans
    losses, moments, first, step_seconds = [], {}, len(spans), []
    for step in range(setup.steps):
        tokens, targets = task.batch(step, setup.global_batch, setup.seq_len, rank, n, device=ctx.device)
        start, t0 = len(spans), time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with _Activations(model) as saved, ctx.tracer.span("forward"):
            _, loss = model(tokens, targets)
        moments["after forward"] = held_bytes(model, optimizer)
        with ctx.tracer.span("backward"):
            loss.backward()
        moments["after backward"] = held_bytes(model, optimizer)
        if step == 0:
            first_grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
        with ctx.tracer.span("step"):
            optimizer.step()
        moments["after step"] = held_bytes(model, optimizer)
        reported = loss.detach().clone()
        dist.all_reduce(reported, group=ctx.group)
        losses.append(float(reported) / n)
        step_seconds.append(time.perf_counter() - t0)
        ctx.progress(step + 1, setup.steps)
    sent, calls = comm_per_step(spans[first:], setup.steps)
    last = [s.as_dict() for s in spans[start:]]
    grads = {k: _local(g.full_tensor() if isinstance(g, DTensor) else g).cpu() for k, g in first_grads.items()}
    params = {k: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu() for k, p in model.named_parameters()}
    memory = {**moments["after step"], "grads": moments["after backward"]["grads"], "activations": saved.bytes}
    return ShardedResult(losses, grads, params, memory, moments=moments, comm=sent, counts=calls, spans=last,
                         gathered_log=[], step_seconds=step_seconds)


def fsdp2_comm_per_step(setup: TrainSetup, world_size: int) -> dict[str, float]:
    """Bytes one rank sends per step under FSDP2 with our grouping (ring formulas, ``theory.comm``).

    Like our ZeRO-3: every group (each block, and the root: embedding, final norm, head) is
    all-gathered before its forward and again before its backward, and its gradients are
    reduce-scattered once; plus the loss all-reduce. No padding when the ranks divide every
    weight's first dimension (``fsdp2_state_bytes`` checks that).
    """
    from playbook.theory.comm import sent_bytes

    cfg, n = setup.config(), world_size
    total = 4 * cfg.num_params()
    return {
        "all_gather": 2 * sent_bytes("all_gather", total, n),
        "reduce_scatter": sent_bytes("reduce_scatter", total, n),
        "all_reduce": sent_bytes("all_reduce", 4, n),
    }


@register("fsdp2", help="PyTorch FSDP2 fully_shard (per block, then root): the native counterpart of ZeRO-3")
def run_fsdp2(setup: TrainSetup, *, world_size: int, backend: str = "auto") -> ShardedReport:
    setup.local_batch(world_size)
    backend = default_backend(world_size) if backend == "auto" else backend
    predicted_state = fsdp2_state_bytes(setup.config(), world_size=world_size).as_dict()
    predicted_state.pop("total")
    r0 = launch(train_fsdp2, world_size, setup, backend=backend)[0]
    return ShardedReport(
        strategy="fsdp2", world_size=world_size, backend=backend,
        parity=compare(r0, train(setup)),
        memory={"predicted": {**predicted_state, "activations": setup.predicted_memory(world_size).activations},
                "measured": r0.memory, "by_moment": {"measured": {m: r0.moments[m] for m in MOMENTS}}},
        comm={"predicted": fsdp2_comm_per_step(setup, world_size), "measured": r0.comm},
        setup=setup.as_dict(), losses=r0.losses,
        notes=["FSDP2's all-gathers and reduce-scatters are recorded by our tracer (torch 2.13 issues them "
               "through torch.distributed.all_gather_single / reduce_scatter_single)"],
    )  # fmt: skip
