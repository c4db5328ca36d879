"""The native counterpart of the hybrid mesh: PyTorch's FSDP2 over ``dp`` and DTensor TP over ``tp``.

The same two steps as ``parallel.hybrid.parallelize.parallelize`` followed by its data-parallel step, done by
PyTorch's own parallel APIs on one 2-D ``DeviceMesh`` (the ("pp", "dp", "cp", "tp") grid of
``Mesh.device_mesh``), in torchtitan's order (``parallelize_llama``: TP first, then FSDP):

    1. tensor parallelism: ``parallel.tp.native.dtensor_gpt`` applies ``tp_plan`` over the
       ``["tp"]`` slice (Megatron-LM, Shoeybi et al. 2019, arXiv:1909.08053; DTensor's
       ``parallelize_module``);
    2. data parallelism: ``fully_shard`` each block, then the root, over the ``["dp"]`` slice
       (``parallel.zero.fsdp2.shard_model``; Zhao et al. 2023, arXiv:2304.11277). Every parameter is then
       a DTensor on the 2-D (dp, tp) mesh: ``Shard(0)`` over dp on top of its TP placement.

FSDP2 accepts a TP-sharded parameter only when both meshes are slices of the same parent mesh,
which is why ``dtensor_gpt`` is given the ``["tp"]`` slice and not a mesh built from a process
group. Each rank reads rows ``dp_i`` of the global batch (as ``train_hybrid`` does); FSDP2's
reduce-scatter averages the gradients over dp, so the step is the global batch's mean loss.

Only dp × tp here (pp = cp = ep = 1). DTensor and FSDP2 issue their collectives partly as functional
collectives our tracer does not see: this module checks parity, not bytes.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from playbook.cluster import default_backend, launch
from playbook.dims import ParallelDims
from playbook.model.gpt import GPT
from playbook.parallel.zero.fsdp2 import shard_model
from playbook.theory.hybrid.plan import Plan
from playbook.parallel.hybrid.parallelize import global_loss, train_hybrid
from playbook.parallel.hybrid.merge import merge
from playbook.parallel.parity import reference
from playbook.parallel.report import compare
from playbook.parallel.tp.native import dtensor_gpt
from playbook.parallel.training import TrainResult, TrainSetup, train
from playbook.theory.tp.layout import valid_tp

NAME = "PyTorch FSDP2 over dp + DTensor TP over tp, same mesh and global batch"


def check_native(setup: TrainSetup, dims: ParallelDims, *, sequence_parallel: bool = False) -> None:
    """One ``ValueError`` naming the constraint and what works, before any rank starts."""
    if dims.pp > 1 or dims.cp > 1 or dims.ep > 1:
        n = dims.world
        same = [f"dp={n // t} tp={t}" for t in valid_tp(setup.config()) if n % t == 0]
        raise ValueError(
            f"layout {dims}: the native counterpart covers dp × tp only (pp = cp = ep = 1); "
            f"on the same {n} ranks try {', '.join(same)}"
        )
    if setup.config().is_moe:
        raise ValueError(f"{setup.model} is a mixture of experts; the native dp × tp run takes a dense preset")
    Plan(dims, sequence_parallel=sequence_parallel).check(setup)


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of the whole tensor: a DTensor's shards gathered over every mesh axis it spans."""
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()


def native_on_rank(
    ctx, setup: TrainSetup, *, dims: ParallelDims, sequence_parallel: bool = False, resume=None, save=None
) -> TrainResult:
    """Rank function: the reference GPT, DTensor-TP over ``tp`` then FSDP2 over ``dp`` of one
    ``DeviceMesh``, trained by the one loop; returns a TrainResult of whole tensors (every rank).
    ``resume``: a checkpoint folder (ours or native) to start from; ``save``: a folder to save to after
    the last step (``parallel.checkpoint.native``); the result's losses then span the whole run."""
    mesh = ctx.mesh_for(dims)
    device_mesh = mesh.device_mesh(ctx.device.type)
    model = GPT(setup.config(), seed=setup.seed).to(ctx.device)
    if dims.tp > 1:
        model = dtensor_gpt(model, device_mesh["tp"], ctx.device.type, sequence_parallel=sequence_parallel)
    if dims.dp > 1:
        model = shard_model(model, device_mesh["dp"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=setup.lr)  # after sharding: sees the DTensors
    task = setup.task()

    def batch(step):
        return task.batch(step, setup.global_batch, setup.seq_len, mesh.coords["dp"], dims.dp, device=ctx.device)

    def sync_loss(loss):  # the tp ranks agree (loss_parallel); FSDP2's ranks each hold their own mean
        return global_loss((loss.full_tensor() if isinstance(loss, DTensor) else loss) / dims.dp, mesh)

    start, before = 0, []
    if resume:
        from playbook.parallel.checkpoint import native as native_ck

        loaded = native_ck.load(model, optimizer, resume)
        start, before = loaded["start"], loaded["losses"]
    result = train(
        setup,
        start=start,
        model=model,
        optimizer=optimizer,
        batch=batch,
        sync_loss=sync_loss,
        collect=_whole,
        context=loss_parallel if dims.tp > 1 else nullcontext,
        measure=False,
        progress=ctx.progress,
        device=ctx.device,
    )
    result.losses = [*before, *result.losses]
    if save:
        from playbook.parallel.checkpoint import native as native_ck

        native_ck.save(
            model, optimizer, save, step=setup.steps, losses=result.losses, setup=setup, dims=dims, rank=ctx.rank
        )
    return result


def native_parity(
    setup: TrainSetup,
    dims: ParallelDims,
    backend: str = "auto",
    *,
    sequence_parallel: bool = False,
    ours: TrainResult | None = None,
    launch=launch,
) -> dict:
    """Run ``native_on_rank`` on ``dims.world`` fresh ranks (``launch``); compare it with ours (``train_hybrid``
    merged; run here unless ``ours`` is given) and with the single process on the same batch.

    Returns the ``RunReport.native`` shape: ``reference`` and the parity keys against ours, plus
    ``single`` (parity against the single process) and the native run's ``losses``."""

    check_native(setup, dims, sequence_parallel=sequence_parallel)
    backend = default_backend(dims.world) if backend == "auto" else backend
    native = launch(native_on_rank, dims.world, setup, dims=dims, sequence_parallel=sequence_parallel, backend=backend)[
        0
    ]
    if ours is None:
        plan = Plan(dims, sequence_parallel=sequence_parallel)
        ours = merge(launch(train_hybrid, dims.world, setup, plan, backend=backend), dims.tp)
    return {
        **compare(ours, native, NAME),  # as dp_run's DDP: ours against the native run
        "single": compare(native, reference(setup)),
        "losses": native.losses,
    }


def summary_line(native: dict) -> str:
    """One line for ``HybridReport.summary``: the native run against ours and the single process."""
    s = native["single"]
    return (
        f"  native ({native['reference']}): vs ours grads {native['max_rel_grad_diff']:.2e} (rel), params "
        f"{native['max_rel_l2_param_diff']:.2e} (rel L2); vs single process loss {s['max_abs_loss_diff']:.2e}, "
        f"grads {s['max_rel_grad_diff']:.2e}, params {s['max_rel_l2_param_diff']:.2e}"
    )
