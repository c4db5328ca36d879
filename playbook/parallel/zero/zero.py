"""ZeRO stages 1, 2 and 3 from scratch: shard the optimizer states, then the gradients, then the weights.

Rajbhandari et al. 2019, *ZeRO: Memory Optimizations Toward Training Trillion Parameter Models*
(arXiv:1910.02054), §5 and §7. Data parallelism keeps the whole model state on every one of N
ranks; ZeRO gives each rank one N-th of it and moves the rest in when needed:

- stage 1: each rank keeps AdamW's states for its slice only and updates only that slice; the
  gradients are reduce-scattered (each rank receives the sum of its slice) and the updated weights
  all-gathered. Sent per step: S(N-1)/N + S(N-1)/N, the same 2S(N-1)/N as DP's all-reduce.
- stage 2: the same collectives, but each unit's gradients are reduce-scattered *during* backward,
  as soon as they are complete, and the full gradient is dropped: only 1/N of it stays.
- stage 3: the weights too are kept as slices. A unit's weights are all-gathered just before its
  forward and freed after it, all-gathered again before its backward and freed after; the next
  unit's gather is issued early (prefetch) so that it can overlap compute. Sent: 3S(N-1)/N (1.5×).

The model is cut into *units* (the embedding, each block, the head: ``theory.zero.zero.zero_units``;
each routed expert is a unit of its own, sharded over its replicas: ``parallel.zero.flat_unit``),
each one flat fp32 buffer padded with zeros to a multiple of N so that every rank owns an equal
slice [r·s, (r+1)·s). Stage 0 (plain data parallelism, one all-reduce per unit) uses the same
buffers, for comparison. Exact bytes and volumes: ``playbook.theory.zero.zero``. A tied embedding is one
unit that the head reads too (ZeRO-3 keeps it gathered from the embedding's forward to the head's).

``Zero`` is the algorithm (its ``zero_grad`` and ``step`` make it the optimizer of the one training
loop); ``zero.run`` trains and measures it (``playbook run zero``), ``hybrid.zero`` puts it in a mesh.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch
import torch.distributed as dist

from playbook.measure.memory import optimizer_bytes
from playbook.measure.sharding import storage_bytes, storages
from playbook.cluster.trace.tracer import Span
from playbook.model.gpt import GPT
from playbook.parallel.zero.flat_unit import FlatUnit, Fed, build_units, gather_units, piece_map
from playbook.parallel.mixed import MixedPrecisionAdamW, check_precision
from playbook.theory.zero.zero import check_stage


class Zero:
    """Train ``model`` with ZeRO stage ``stage`` over ``group``: ``loss = zero.loss(tokens, targets)``,
    ``loss.backward()``, ``zero.sync()``, ``zero.step()``, ``zero.zero_grad()``: with ``zero_grad`` and
    ``step`` it is the optimizer of ``training.train``, ``loss`` its forward and ``sync`` its ``sync_grads``.

    ``precision="mixed"`` (the model already cast to bf16 by ``parallel.mixed.to_mixed``): the flat units,
    their gradients and every collective are bf16, and each rank keeps fp32 master weights and AdamW
    states for its slices only (``MixedPrecisionAdamW``): ZeRO's 2 + 2 + 12 bytes per parameter, §3.1,
    of which the 12 are sharded from stage 1 on."""

    def __init__(
        self,
        model: GPT,
        *,
        stage: int,
        group,
        lr: float,
        prefetch: bool = True,
        tracer=None,
        precision="fp32",
        pieces: range | None = None,
        expert_group=None,
        sum_first: tuple | None = None,
    ):
        check_stage(stage)
        check_precision(precision)
        self.model, self.stage, self.group, self.prefetch, self.tracer = model, stage, group, prefetch, tracer
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        # every rank's loss is its share of the global batch's mean (``loss``): gradients are summed, never divided
        self.units = build_units(model, pieces, self._layout(stage), group, expert_group)
        self._own_slices()
        # (group, names): gradients summed over ``group`` before any reduction over the data ranks:
        # under sequence parallelism the norms saw s/tp tokens each (Korthikanti et al. 2022, §4.2.2)
        self.sum_first = sum_first
        self.pieces, self.reads, self.last_read = piece_map(model, pieces, self.units)
        self.fed = Fed(model, pieces)  # which routed experts' units a token reached this step
        slices = [u.opt_param for u in self.units]
        self.optimizer = (
            MixedPrecisionAdamW(slices, lr=lr) if precision == "mixed" else torch.optim.AdamW(slices, lr=lr)
        )
        self.pending: dict[int, object] = {}  # unit -> in-flight all-gather
        self.peak_gathered = {"forward": 0, "backward": 0}
        self.gathered_log: list[tuple[float, str, int]] = []  # (time, phase, live bytes of whole units)
        self.phase, self.bwd_spans, self.ready = "forward", {}, [0] * len(self.units)
        for k, u in enumerate(self.units):
            self._prepare(k, u)

    # ---- what a pipeline's ZeRO (``parallel.zero.pipeline``) does differently ----
    def _layout(self, stage: int) -> int:
        """The stage whose buffers ``FlatUnit`` lays out (this one's own)."""
        return stage

    def _own_slices(self) -> None:
        """After the units are built, before the optimizer takes their slices: nothing to change here."""

    def _prepare(self, k: int, u: FlatUnit) -> None:
        """Where unit k's gradient goes: a flat buffer autograd accumulates into (stages 0-1), or hooks
        that reduce-scatter it during backward (2: when its weights' grads are all in; 3: its full buffer's).
        A routed expert's unit is reduced after backward at every stage (``sync``): whether a token
        reached it is known only then, and each replica must join its reduce-scatter, in unit order."""
        if self.stage <= 1 or (self.stage == 2 and k in self.fed.of):
            self._flat_grad(u)
        elif self.stage == 2:
            for p in u.parameters():
                p.register_post_accumulate_grad_hook(lambda p, k=k: self._grad_ready(k))
        else:
            done = self._release if k in self.fed.of else self._after_backward
            u.full.register_post_accumulate_grad_hook(lambda full, k=k: done(k))

    def _flat_grad(self, u: FlatUnit) -> None:
        """A zeroed flat gradient [padded] for unit ``u``, its parameters' grads views of it."""
        u.flat_grad = torch.zeros_like(u.flat)  # [padded]
        for p, view in zip(u.parameters(), u.views(u.flat_grad)):
            p.grad = view.view(p.shape)
        u.opt_param.grad = u.flat_grad if self.stage == 0 else u.flat_grad[u.lo : u.hi]

    # ---- forward: one unit at a time ----
    def loss(self, tokens: torch.Tensor, targets: torch.Tensor, global_tokens: int, positions=None) -> torch.Tensor:
        """The model's forward, unit by unit (the same ops as ``GPT.forward``), and the loss: Σ token losses /
        ``global_tokens``, the global batch's (``model.gpt.lm_loss``), this rank's share of the global mean;
        ``positions`` ([s/cp] int64): RoPE positions of this rank's tokens under context parallelism."""
        self.phase = "forward"
        x = self._run(0, self.model.embed, tokens)  # [batch, seq, hidden]
        for i, block in enumerate(self.model.blocks):
            x = self._run(i + 1, lambda x, block=block: block(x, positions), x)  # [batch, seq, hidden]
        logits = self._run(len(self.model.blocks) + 1, self.model.head, x)  # [batch, seq, vocab]
        self.phase = "backward"
        return self.model.loss(logits, targets, global_tokens)

    def _run(self, piece: int, fn, x: torch.Tensor) -> torch.Tensor:
        """Piece ``piece`` (0: embedding, i+1: block i, L+1: head) on x; stage 3 gathers its units first."""
        if self.stage < 3:
            return fn(x)
        self._gather_piece(piece)
        if self.prefetch:
            self._gather_piece(piece + 1, async_op=True)  # in flight while this piece computes
        for k in self.reads[piece]:
            self.units[k].bind()
        with self._span("forward"):
            out = fn(x)
        for k in self.reads[piece]:
            if self.last_read[k] == piece:  # a tied embedding stays gathered until the head has run
                self.units[k].free()  # autograd keeps views of full; its storage comes back before backward
        self._track()
        out.register_hook(lambda grad, piece=piece: self._before_backward(piece))
        return out

    def _gather_piece(self, piece: int, async_op: bool = False) -> None:
        for k in self.reads.get(piece, []):
            self._gather(k, async_op)

    def _gather(self, k: int, async_op: bool = False) -> None:
        """All-gather unit k's weights into its full buffer (or wait for the gather already in flight)."""
        unit = self.units[k]
        if k in self.pending:
            if not async_op:
                self.pending.pop(k).wait()
            return
        if unit.gathered:
            return
        unit.allocate()
        self._track()
        work = unit.all_gather(unit.full.data, unit.opt_param.detach(), async_op=async_op)
        if async_op and work is not None:
            self.pending[k] = work

    def _span(self, name: str):
        return self.tracer.span(name) if self.tracer is not None else nullcontext()

    def _track(self) -> None:
        """Measure the bytes of whole units held now (gathered weights + flat gradients) and log them."""
        live = sum(u.full.untyped_storage().nbytes() + storage_bytes([u.full.grad]) for u in self.units)
        self.peak_gathered[self.phase] = max(self.peak_gathered[self.phase], live)
        self.gathered_log.append((time.perf_counter(), self.phase, live))

    # ---- backward hooks ----
    def _before_backward(self, piece: int) -> None:
        self._gather_piece(piece)
        if self.prefetch:
            self._gather_piece(piece - 1, async_op=True)
        if self.tracer is not None:
            for k in self.pieces[piece]:
                self.bwd_spans[k] = Span(self.rank, "compute", "backward", time.perf_counter())
                self.tracer.spans.append(self.bwd_spans[k])

    def _release(self, k: int) -> None:
        """Stage 3: unit k's backward is done: its weights go (a routed expert keeps its gradient for ``sync``)."""
        if k in self.bwd_spans:
            self.bwd_spans.pop(k).end = time.perf_counter()
        self._track()
        self.units[k].free()

    def _after_backward(self, k: int) -> None:
        """Stage 3: unit k's flat gradient is complete: reduce-scatter it, keep our slice, free the rest."""
        unit = self.units[k]
        self._release(k)
        grad = unit.full.grad  # [padded], the sum over this rank's micro-batch; None: an expert no token reached here
        grad = torch.zeros(unit.padded, dtype=unit.full.dtype, device=unit.full.device) if grad is None else grad
        self._sum_first(unit, grad)
        unit.reduce_scatter(grad)  # in place: slice r gets Σ ranks
        unit.opt_param.grad = grad[unit.lo : unit.hi].clone()  # [shard], a new tensor: the sum over ranks
        unit.full.grad = None
        self._track()

    def _grad_ready(self, k: int) -> None:
        """Stage 2: when every weight of unit k has its gradient, reduce-scatter them and drop them."""
        unit = self.units[k]
        self.ready[k] += 1
        if self.ready[k] < len(unit.specs):
            return
        self.ready[k] = 0
        params = unit.parameters()
        pad = torch.zeros(unit.padded - unit.numel, device=unit.flat.device, dtype=unit.flat.dtype)
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [pad])  # [padded], transient
        self._sum_first(unit, flat)
        unit.reduce_scatter(flat)
        unit.opt_param.grad = flat[unit.lo : unit.hi].clone()  # [shard], its own storage
        for p in params:
            p.grad = None

    def sync(self) -> None:
        """After backward. Stage 0: all-reduce; stage 1: reduce-scatter each unit; 2 and 3: done during
        backward, but for the routed experts' units. An expert no token reached keeps no gradient (``Fed``)."""
        for k, u in enumerate(self.units):
            if self.stage <= 1:
                self._sum_first(u, u.flat_grad)
            if self.stage == 0:
                if u.n > 1:
                    dist.all_reduce(u.flat_grad, group=u.group)
            elif self.stage == 1:
                u.reduce_scatter(u.flat_grad)
            elif k in self.fed.of:  # a routed expert's unit, reduced now (``_prepare``)
                self._after_backward(k) if self.stage == 3 else self._reduce_flat(u)
            if self.fed.starved(k):
                u.opt_param.grad = None  # AdamW skips it, as the single process's AdamW skips a gradient-less expert

    def _reduce_flat(self, u: FlatUnit) -> None:
        """Stage 2, a routed expert: its whole flat gradient reduce-scattered; the slice stays, the rest goes."""
        u.reduce_scatter(u.flat_grad)
        u.opt_param.grad = u.flat_grad[u.lo : u.hi].clone()  # [shard], its own storage
        for p in u.parameters():
            p.grad = None
        del u.flat_grad

    def _sum_first(self, u: FlatUnit, flat: torch.Tensor) -> None:
        """Sum the gradients of ``sum_first``'s parameters in ``u``'s flat gradient over its group, in place."""
        if self.sum_first is not None:
            u.sum_over(flat, *self.sum_first)

    def step(self) -> None:
        """AdamW on this rank's slices; stages 1-2 then all-gather the updated weights (in place)."""
        self.optimizer.step()
        if self.stage in (1, 2):
            for u in self.units:
                if u.n > 1:
                    dist.all_gather_single(u.flat, u.flat[u.lo : u.hi], group=u.group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients, as an optimizer does (the one loop calls ``zero_grad(set_to_none=True)``);
        stages 0-1 zero their flat gradient buffer instead, which autograd accumulates into."""
        self.fed.clear()
        for k, u in enumerate(self.units):
            if self.stage <= 1:
                u.flat_grad.zero_()
                u.opt_param.grad = u.flat_grad if self.stage == 0 else u.flat_grad[u.lo : u.hi]  # after a starved step
            elif self.stage == 2 and k in self.fed.of:
                self._flat_grad(u)  # a routed expert's whole gradient, reduced after backward
            else:
                u.opt_param.grad = None

    # ---- measure and gather ----
    def held(self) -> dict[str, int]:
        """Bytes this rank holds now: params (3: slices; 0-2: flat buffers), grads, optimizer, gathered (3)."""
        units = self.units
        grads = [u.opt_param.grad for u in units] + [p.grad for p in self.model.parameters()]
        if self.stage == 3:
            grads += [u.full.grad for u in units]
        return {
            "params": storage_bytes([u.opt_param for u in units] if self.stage == 3 else [u.flat for u in units]),
            "grads": storage_bytes(grads),
            "optimizer": optimizer_bytes(self.optimizer),
            "gathered": sum(u.full.untyped_storage().nbytes() for u in units) if self.stage == 3 else 0,
        }

    def unit_buffers(self) -> set[int]:
        """Storages of the weights themselves (not activations): flat buffers, gathered buffers, RoPE tables."""
        return storages([u.full if self.stage == 3 else u.flat for u in self.units] + list(self.model.buffers()))

    def gather(self, slices: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Whole named tensors from one slice per unit (for parity checks; issues all-gathers)."""
        return gather_units(self.units, slices)
