"""The native counterpart of ``playbook/parallel/tp/model.py``: PyTorch's DTensor tensor parallelism.

``parallelize_module`` takes the *unmodified* reference GPT and a plan naming, for each submodule,
how its weight is laid out on a 1-D ``DeviceMesh`` of the t ranks and what layout its inputs and
outputs have (torch.distributed.tensor.parallel; the plan below follows torchtitan's Llama plan):

- ``ColwiseParallel``: weight ``Shard(0)`` (output channels), input ``Replicate`` — our column layer;
- ``RowwiseParallel``: weight ``Shard(1)``, output ``Partial`` made ``Replicate`` by an all-reduce
  (our g), or ``Shard(1)`` of the sequence by a reduce-scatter with sequence parallelism;
- ``RowwiseParallel`` on ``nn.Embedding`` shards the vocabulary rows (our vocab-parallel embedding);
- ``SequenceParallel`` runs the norms on ``Shard(1)`` sequence shards; ``PrepareModuleInput``
  all-gathers them where attention and the MLP start;
- ``loss_parallel()`` computes the cross-entropy from vocabulary-sharded logits ``Shard(-1)``.

The model's modules read ``n_heads``/``kv_heads`` to reshape, so those become the local head counts.
DTensor issues its collectives as functional collectives, which ``playbook.cluster.trace.tracer`` does not
see: compare this version for parity and for time only.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from playbook.dims import ParallelDims
from playbook.model.gpt import GPT
from playbook.parallel.training import TrainSetup, train
from playbook.theory.tp.layout import check_tp


def tp_plan(n_layers: int, sequence_parallel: bool = False) -> dict:
    """Module name -> ParallelStyle for our GPT (torchtitan's Llama plan, adapted to our names)."""
    seq = Shard(1)  # [batch, seq, hidden]: sequence shards
    plan = {
        "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq if sequence_parallel else Replicate()),
        "lm_head": ColwiseParallel(
            input_layouts=seq if sequence_parallel else Replicate(), output_layouts=Shard(-1), use_local_output=False
        ),  # for loss_parallel
    }
    if sequence_parallel:
        plan["norm"] = SequenceParallel()
    for i in range(n_layers):
        p = f"blocks.{i}."
        plan |= {p + f"attn.{n}": ColwiseParallel() for n in ("q_proj", "k_proj", "v_proj")}
        plan |= {p + f"mlp.{n}": ColwiseParallel() for n in ("gate_proj", "up_proj")}
        out = {"output_layouts": seq} if sequence_parallel else {}
        plan |= {p + "attn.o_proj": RowwiseParallel(**out), p + "mlp.down_proj": RowwiseParallel(**out)}
        if sequence_parallel:
            plan |= {p + "attn_norm": SequenceParallel(), p + "mlp_norm": SequenceParallel()}
            plan[p + "attn"] = PrepareModuleInput(input_layouts=(seq, None), desired_input_layouts=(Replicate(), None))
            plan[p + "mlp"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
    return plan


def dtensor_gpt(model: GPT, group, device_type: str, *, sequence_parallel: bool = False) -> GPT:
    """Parallelize ``model`` in place over the ranks of ``group`` and return it. ``group`` may also
    be a 1-D ``DeviceMesh``, such as the ``["tp"]`` slice of a larger mesh: FSDP2 composes with TP
    only when both axes are slices of the same mesh (``parallel.hybrid.native``)."""
    t = group.size()
    check_tp(model.cfg, t)
    mesh = group if isinstance(group, DeviceMesh) else DeviceMesh.from_group(group, device_type)
    for block in model.blocks:  # each rank reshapes its own heads
        block.attn.n_heads, block.attn.kv_heads = block.attn.n_heads // t, block.attn.kv_heads // t
    return parallelize_module(model, mesh, tp_plan(model.cfg.n_layers, sequence_parallel))


def _full(x):
    """A CPU copy of the whole tensor (gathered from the ranks if it is a DTensor)."""
    return (x.full_tensor() if isinstance(x, DTensor) else x).detach().cpu().clone()


def train_dtensor(ctx, setup: TrainSetup, *, sequence_parallel: bool = False):
    """Rank function: the reference GPT parallelized by DTensor, trained by the same loop as ours,
    the whole step inside ``loss_parallel()``; returns a TrainResult of full tensors."""
    check_tp(setup.config(), ctx.world_size, seq_len=setup.seq_len, sequence_parallel=sequence_parallel)
    model = dtensor_gpt(
        GPT(setup.config(), seed=setup.seed).to(ctx.device),
        ctx.mesh_for(ParallelDims(tp=ctx.world_size)).group("tp"),  # the chapter's layout: every rank on tp
        ctx.device.type,
        sequence_parallel=sequence_parallel,
    )
    return train(
        setup,
        model=model,
        device=ctx.device,
        context=loss_parallel,
        measure=False,
        collect=_full,
        progress=ctx.progress,
    )
