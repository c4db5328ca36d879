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
4Ψ/N + 4Ψ/N + 8Ψ/N, plus one AdamW ``step`` per parameter tensor (``theory.zero.zero.fsdp2_state_bytes``).
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from playbook.cluster import default_backend, launch
from playbook.measure.sharding import held_bytes, local, storages
from playbook.model.gpt import GPT
from playbook.parallel.registry import register
from playbook.parallel.zero.sharded import MOMENTS, ShardedReport, ShardedResult, train_sharded
from playbook.parallel.training import TrainSetup
from playbook.parallel.parity import against_single
from playbook.theory.zero.sharded import fsdp2_comm_per_step
from playbook.theory.zero.zero import fsdp2_state_bytes


def shard_model(model: GPT, mesh, *, reshard_after_forward: bool = True) -> GPT:
    """``fully_shard`` each block, then the root: one all-gather group per block, one for the rest."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def _whole(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu()  # all-gathers a DTensor's shards


def on_rank(ctx, setup: TrainSetup, *, reshard_after_forward: bool = True) -> ShardedResult:
    """Rank function: ``setup.steps`` AdamW steps with FSDP2 over the dp axis of ``ctx.mesh``
    (its ``DeviceMesh``); gradients (first step) and parameters (last) come back whole."""
    mesh = ctx.mesh.device_mesh(ctx.device.type)["dp"]
    model = shard_model(
        GPT(setup.config(), seed=setup.seed).to(ctx.device), mesh, reshard_after_forward=reshard_after_forward
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=setup.lr)  # after sharding: sees the DTensor shards

    def undo_average(m) -> None:
        # FSDP2 divides its reduce-scattered sums by n: it averages gradients of per-rank *means*. Our
        # loss is Σ / global tokens, whose gradients add up, so × n undoes the average (exact for n a
        # power of two). torchtitan instead calls ``set_gradient_divide_factor(1.0)``, a PREMUL_SUM gloo lacks.
        for p in m.parameters():
            if p.grad is not None:
                p.grad.mul_(mesh.size())

    def weights() -> set[int]:  # as they are now: shards, or whole during their group's forward; RoPE tables
        return storages([*(local(p) for p in model.parameters()), *model.buffers()])

    result = train_sharded(
        ctx,
        setup,
        model=model,
        optimizer=optimizer,
        loss=lambda x, y, tokens: model.loss(model(x), y, tokens),  # Σ / the global batch's tokens
        sync_grads=undo_average,
        held=lambda: held_bytes(model, optimizer),
        weights=weights,
        collect=lambda t: t.detach().clone(),
    )  # (DTensors: gathered below, uncounted)
    result.grads = {k: _whole(g) for k, g in result.grads.items()}
    result.params = {k: _whole(p) for k, p in result.params.items()}
    return result


@register(
    "fsdp2",
    help="PyTorch FSDP2 fully_shard (per block, then root): the native counterpart of ZeRO-3",
    on_rank=on_rank,
    predict=fsdp2_comm_per_step,
)
def run_fsdp2(setup: TrainSetup, *, world_size: int, backend: str = "auto", launch=launch) -> ShardedReport:
    setup.local_batch(world_size)
    backend = default_backend(world_size) if backend == "auto" else backend
    predicted_state = fsdp2_state_bytes(setup.config(), world_size=world_size).as_dict()
    predicted_state.pop("total")
    r0 = launch(on_rank, world_size, setup, backend=backend)[0]
    return ShardedReport(
        strategy="fsdp2",
        world_size=world_size,
        backend=backend,
        parity=against_single(r0, setup),
        memory={
            "predicted": {**predicted_state, "activations": setup.predicted_memory(world_size).activations},
            "measured": r0.memory,
            "by_moment": {"measured": {m: r0.moments[m] for m in MOMENTS}},
        },
        comm={"predicted": fsdp2_comm_per_step(setup, world_size=world_size), "measured": r0.comm},
        setup=setup.as_dict(),
        losses=r0.losses,
        notes=[
            "FSDP2's all-gathers and reduce-scatters are recorded by our tracer (torch 2.13 issues them "
            "through torch.distributed.all_gather_single / reduce_scatter_single)"
        ],
    )
