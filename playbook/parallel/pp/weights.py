"""W of a split backward (ZB-H1, ZB-V, DualPipe-V; Qi et al. 2023, arXiv:2401.10241, §2): a
layer's weight gradients from its input and its output gradient alone, so that a micro-batch
between B and W keeps those two tensors, not its graph (``parallel.pp.executor``).

- ``nn.Linear`` and tensor parallelism's row-parallel layer: dW = gᵀ x (the row layer's partial sum
  gets g back through its exit, all-gathered over the sequence under SP, as autograd would send it);
- a norm or an embedding (no matmul, no communication in their forward): its forward replayed on
  its input, one autograd node deep; so is any other layer whose forward does not communicate
  (tensor parallelism's column layer);
- a layer inside a block that full recomputation reruns (Chen et al. 2016, ``parallel.hybrid.recompute``):
  its input as B's recomputation saw it (:func:`recomputed` names them).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from playbook.model.gpt import RMSNorm
from playbook.parallel.comm import all_gather
from playbook.parallel.tp.layers import RowParallelLinear

REPLAYED = (nn.Embedding, RMSNorm)  # no matmul and no communication in their forward: W replays it


def recomputed(chunk: nn.Module) -> set:
    """The modules inside blocks that full recomputation reruns in backward (``parallel.hybrid.recompute``
    marks them ``checkpointed``): their insides are not kept from F; B recomputes them once and keeps
    what W needs until W (Qi et al. 2023, §2; Chen et al. 2016)."""
    return {
        mod
        for block in getattr(chunk, "blocks", {}).values()
        if getattr(block, "checkpointed", False)
        for mod in block.modules()
    }


def weight_grads(mod: nn.Module, own: list, x: torch.Tensor, g: torch.Tensor) -> tuple:
    """The parameter gradients of ``mod`` from its input ``x`` and output gradient ``g`` alone."""
    if isinstance(mod, RowParallelLinear):  # z = leave(x Wᵀ): the partial sum's gradient is g (TP's
        # all-reduce), or g all-gathered over the sequence (SP's reduce-scatter), as autograd sends it
        region = mod.region
        g = all_gather(g, 1, region.group, region.label, "backward") if region.sequence_parallel else g
    if type(mod) is nn.Linear or isinstance(mod, RowParallelLinear):  # y = x Wᵀ (+ b): dW = gᵀ x, db = Σ g
        g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])  # [rows, out], [rows, in]
        return (g2.T @ x2, *([g2.sum(0)] if getattr(mod, "bias", None) is not None else []))  # [out, in], [out]
    with torch.enable_grad():
        return torch.autograd.grad(mod(x), own, g)


def accumulate(p: torch.Tensor, g: torch.Tensor) -> None:
    """Add ``g`` to ``p.grad`` in place, as autograd does: a grad that is a view of a flat buffer
    (ZeRO's, ``parallel.zero.zero``) stays one."""
    if p.grad is None:
        p.grad = g
    else:
        p.grad.add_(g)


def compact(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a copy of it when it is a view into a larger storage: what W keeps must not pin the
    rest (ring attention's dV, with one key/value head per rank, is a view of one buffer with dK)."""
    return t.clone() if t.untyped_storage().nbytes() > t.numel() * t.element_size() else t
