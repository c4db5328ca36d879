"""ZeRO-2 and ZeRO-3 inside a pipeline: reduce on the last micro-batch, weights gathered once a step.

A pipeline stage runs m micro-batches forward and backward per step, interleaved by its schedule
(one stage with m > 1 too: the hybrid's gradient accumulation at pp = 1, ``hybrid.pipeline``).
ZeRO-2's reduce-scatter *during* backward would run m times a step, and ZeRO-3's gather before every
forward and every backward 2m times. So, as torchtitan does with FSDP under PP (Liang et al. 2024,
*TorchTitan*: parameters not resharded after forward, gradients reduced on the last micro-batch):

- every micro-batch's gradients sum into one whole flat buffer per unit (ZeRO-1's), reduce-scattered
  once per step after the last backward; then only this rank's slice is kept until the next step;
- ZeRO-3 all-gathers each unit once, before the step's first forward, keeps it gathered through all
  m micro-batches, and frees it after the reduce-scatter: between steps only the slice is held.

The bytes sent are then ZeRO-1's (one reduce-scatter and one all-gather of every unit per step),
and the peak of model state inside the step is ZeRO-1's too: whole weights and whole gradients are
alive together while the micro-batches run, and ZeRO-3 holds its slice on top (the copy that
survives between steps). So inside a pipeline ZeRO-2/3 save memory only *between* steps, never at
the step's peak: this is why DeepSpeed's pipeline engine accepts ZeRO-1 only (it asserts the stage is
below 2: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"); under a pipeline what
ZeRO saves at the peak is the optimizer states, ZeRO-1's share. ``theory.hybrid.zero.pipeline_peak_state`` predicts that peak.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from playbook.measure.memory import optimizer_bytes
from playbook.measure.sharding import storage_bytes
from playbook.parallel.zero.flat_unit import FlatUnit
from playbook.parallel.zero.zero import Zero


class PipelineZero(Zero):
    """``Zero`` stage 2 or 3 for a pipeline stage's units; the pipeline calls ``begin_step`` before its
    first forward, the loop ``sync`` after its last backward, then ``step`` and ``zero_grad``."""

    def __init__(self, model, *, stage: int, **kw):
        if stage not in (2, 3):
            raise ValueError(f"a pipeline reduces on the last micro-batch from ZeRO-2 on; stage {stage} runs as Zero")
        super().__init__(model, stage=stage, **kw)

    def _layout(self, stage: int) -> int:
        return 2  # whole flat weights (views as parameters) while the step runs, for every micro-batch

    def _own_slices(self) -> None:
        if self.stage == 3:  # the slice is the only copy that outlives the step
            for u in self.units:
                u.opt_param = nn.Parameter(u.flat[u.lo : u.hi].clone())  # [shard]
                u.flat.untyped_storage().resize_(0)

    def _prepare(self, k: int, u: FlatUnit) -> None:
        self._flat_grad(u)  # the m micro-batches accumulate into one whole flat gradient

    def begin_step(self) -> set[int]:
        """ZeRO-3: gather every unit of the stage for the whole step; returns the storages of the
        gathered weights (not activations, for ``HeldActivations``)."""
        if self.stage == 3:
            for u in self.units:
                u.flat.untyped_storage().resize_(u.padded * u.flat.element_size())
                u.all_gather(u.flat, u.opt_param.detach())
        return {u.flat.untyped_storage().data_ptr() for u in self.units}

    def sync(self) -> None:
        """After the last micro-batch: sum, reduce-scatter, keep this rank's slice, drop the rest."""
        for k, u in enumerate(self.units):
            self._sum_first(u, u.flat_grad)
            u.reduce_scatter(u.flat_grad)
            u.opt_param.grad = u.flat_grad[u.lo : u.hi].clone()  # [shard], own storage: the sum over ranks
            u.opt_param.grad = None if self.fed.starved(k) else u.opt_param.grad  # no token reached it
            for p in u.parameters():
                p.grad = None
            del u.flat_grad  # the whole gradient goes: 1/N of it is held until the next step
            if self.stage == 3:
                u.flat.untyped_storage().resize_(0)  # and so do the whole weights

    def step(self) -> None:
        self.optimizer.step()
        if self.stage == 2:  # ZeRO-2 keeps whole weights: the updated slices all-gathered, as stage 1
            for u in self.units:
                if u.n > 1:
                    dist.all_gather_single(u.flat, u.flat[u.lo : u.hi], group=u.group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.fed.clear()
        for u in self.units:
            self._flat_grad(u)  # the next step's micro-batches accumulate into a fresh buffer

    def held(self) -> dict[str, int]:
        units = self.units
        grads = [u.opt_param.grad for u in units] + [getattr(u, "flat_grad", None) for u in units]
        gathered = sum(u.flat.untyped_storage().nbytes() for u in units) if self.stage == 3 else 0
        return {
            "params": storage_bytes([u.opt_param if self.stage == 3 else u.flat for u in units]),
            "grads": storage_bytes(grads),
            "optimizer": optimizer_bytes(self.optimizer),
            "gathered": gathered,
        }


def readable(x: torch.Tensor) -> torch.Tensor:
    """The training loop's ``collect`` for a stage whose weights are freed between steps: a CPU copy,
    or an empty tensor for a weight whose storage is gone (the parity check gathers the slices)."""
    return x.detach().cpu().clone() if x.untyped_storage().nbytes() else torch.empty(0)
