"""Gradient clipping across the mesh: one global norm from every rank's partial sum of squares.

Clipping by the global norm (Pascanu et al. 2013, "On the difficulty of training recurrent neural
networks", §3.2) scales every gradient by min(1, max_norm / ‖g‖), ‖g‖ the L2 norm of the whole
model's gradient, as ``torch.nn.utils.clip_grad_norm_`` does on one process. In a hybrid layout no
rank holds the whole gradient: tp ranks hold other rows of each shard, pipeline stages other layers,
ZeRO ranks other slices of each flat unit, ep ranks other experts; and some parts are held by several
ranks at once. Megatron-LM's ``clip_grad_norm_fp32`` / ``get_grad_norm_fp32`` (Shoeybi et al. 2019)
sums, on each rank, the squares of the gradients it holds, skipping the copies of another rank's
(``param_is_not_tensor_parallel_duplicate``), and one all-reduce adds the partial sums. Here the
copies are skipped by the class of ``parallel.grads``'s table, so each element counts exactly once:

- tp: a tensor-parallel shard counts on every tp rank (each holds other rows); a parameter replicated
  over tp (a norm without SP, a router, an expert under tp: its shard dim is None) on tp rank 0 only;
- data ranks without ZeRO: the gradient sums left every dp×cp rank (every expert replica) holding the
  same gradient, so it counts on the first of them; with ZeRO each rank holds a slice of every flat
  unit, the slices partition it, and every slice counts (its tp-replicated elements on tp rank 0);
- pp: each stage holds its own layers; a tied embedding's two copies count on the first stage only.

Then ‖g‖ = √(one all-reduce SUM over the world of the partials), traced on axis "norm", and every
rank scales every gradient it holds, copies too, by the same min(1, max_norm / (‖g‖ + 1e-6)).

This all-reduce is the step's one synchronisation beyond the gradient sums: no rank may step before
every rank's backward is done. Zero-bubble pipelines bypass it by post-validation: each rank steps at
once and rolls back if the global check, arriving later, says the step should have been clipped or
skipped (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", §4; chapter 4).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from playbook.cluster.trace import tracer as trace
from playbook.parallel.grads import EXPERT, TIED, classes, shard_dims

EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s: max_norm / (total + 1e-6)


def counted_names(model: nn.Module, mesh, *, sequence_parallel: bool, sharded: bool, tied_stage: int = 0) -> set[str]:
    """The parameters of this rank's ``model`` whose gradients (or, ``sharded`` by ZeRO, whose elements
    in this rank's slices) it counts in the global norm (module docstring). ``tied_stage``: the pipeline
    rank of the tied embedding's first copy."""
    split = shard_dims(model)
    out = set()
    for name, cls in classes(model, mesh.size("tp"), sequence_parallel).items():
        if split[name] is None and mesh.index("tp") != 0:
            continue  # replicated over tp: Megatron's tensor-parallel duplicate
        if not sharded and mesh.index("ep_replica" if cls is EXPERT else "dp_cp") != 0:
            continue  # a data rank's copy of a gradient already summed over its data ranks
        if cls is TIED and mesh.index("pp") != tied_stage:
            continue  # the last stage's copy of the tied embedding
        out.add(name)
    return out


class GlobalClip:
    """Clip by the global norm over ``mesh``; call it after the gradient sums, before the step.
    ``norms``: ‖g‖ of every step, before clipping (what ``clip_grad_norm_`` returns)."""

    def __init__(
        self,
        model: nn.Module,
        mesh,
        max_norm: float,
        *,
        sequence_parallel: bool,
        tied_stage: int = 0,
        sharded: bool = False,
    ):
        self.mesh, self.max_norm, self.norms = mesh, float(max_norm), []
        self.counted = counted_names(
            model, mesh, sequence_parallel=sequence_parallel, sharded=sharded, tied_stage=tied_stage
        )
        self._masks: dict[int, torch.Tensor] = {}  # ZeRO unit index -> [shard] 1.0 where counted

    def __call__(self, model: nn.Module | None = None, zero=None) -> float:
        """Clip ``model``'s gradients, or (``zero``) ZeRO's slices; returns ‖g‖."""
        if zero is not None:
            grads = [(u.opt_param.grad, self._mask(k, u)) for k, u in enumerate(zero.units)]
        else:
            grads = [(p.grad, 1.0 if n in self.counted else 0.0) for n, p in model.named_parameters()]
        grads = [(g, w) for g, w in grads if g is not None]  # an expert no token reached has none
        mine = torch.zeros((), dtype=torch.float32)
        for g, w in grads:
            mine += (g.float().pow(2) * w).sum()  # Σ g² over what this rank counts
        with trace.on_axis("norm"):
            dist.all_reduce(mine)  # [] over the world: Σ of every rank's partial
        total = float(mine.sqrt())
        coef = min(1.0, self.max_norm / (total + EPS))
        if coef < 1.0:
            for g, _ in grads:
                g.mul_(coef)
        self.norms.append(total)
        return total

    def _mask(self, k: int, unit) -> torch.Tensor:
        """[shard] 1.0 on the elements of this rank's slice of ``unit`` that it counts, 0.0 elsewhere
        (another rank's tp-duplicate, the tied copy on the last stage, the padding)."""
        if k not in self._masks:
            full = torch.zeros(unit.padded)  # [padded]
            start = 0
            for *_, numel, name in unit.specs:
                full[start : start + numel] = float(name in self.counted)
                start += numel
            self._masks[k] = full[unit.lo : unit.hi].to(unit.opt_param.device)  # [shard]
        return self._masks[k]

    def after(self, sync):
        """``sync`` (the loop's ``sync_grads`` hook), then the clip."""

        def sync_then_clip(model):
            sync(model)
            self(model)

        return sync_then_clip


def clip_reference(max_norm: float, norms: list):
    """The single process's clip as a ``sync_grads`` hook of ``parallel.training.train``: torch's own
    ``clip_grad_norm_``, its total norm of every step appended to ``norms``."""

    def clip(model):
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))

    return clip
