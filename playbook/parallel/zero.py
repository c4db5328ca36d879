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

The model is cut into *units* (the embedding, each block, the head: ``theory.zero.zero_units``),
each one flat fp32 buffer padded with zeros to a multiple of N so that every rank owns an equal
slice [r·s, (r+1)·s). Stage 0 (plain data parallelism, one all-reduce per unit) uses the same
buffers, for comparison. Exact bytes and volumes: ``playbook.theory.zero``.
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from playbook.cluster import default_backend, launch
from playbook.measure.memory import SavedActivations, optimizer_bytes
from playbook.measure.trace import Span, bytes_by_op, counts_by_op
from playbook.model import GPT
from playbook.parallel.registry import register
from playbook.parallel.report import RunReport, compare
from playbook.parallel.training import TrainResult, TrainSetup, train
from playbook.theory.zero import (check_stage, padding_elements, zero3_gathered_peak, zero_comm_per_step,
                                  zero_memory_by_moment, zero_state_bytes, zero_units)  # fmt: skip

MOMENTS = ("after forward", "after backward", "after step")


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one buffer count once; None and freed skip)."""
    seen = {}
    for t in tensors:
        if t is not None and t.untyped_storage().nbytes():
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


class FlatUnit:
    """Some modules' parameters as one flat buffer [padded], padded so that n ranks own equal slices.

    Stages 0-2: ``flat`` holds every weight and the modules' parameters are views into it; the
    optimizer updates ``opt_param`` (all of ``flat`` for stage 0, this rank's slice otherwise, a view:
    no copy). Stage 3: only ``opt_param`` (this rank's slice) persists; ``full`` [padded] gets its
    storage when gathered and loses it when freed, and the modules read views of it.
    """

    def __init__(self, name: str, modules: list[nn.Module], names: dict, stage: int, rank: int, n: int):
        self.name, self.stage = name, stage
        self.specs = [(m, attr, p.shape, p.numel(), names[id(p)]) for mod in modules
                      for m in mod.modules() for attr, p in m.named_parameters(recurse=False)]  # fmt: skip
        self.numel = sum(s[3] for s in self.specs)
        self.padded = -(-self.numel // n) * n
        self.shard = self.padded // n
        self.lo, self.hi = rank * self.shard, (rank + 1) * self.shard
        params = [getattr(m, attr) for m, attr, *_ in self.specs]
        pad = torch.zeros(self.padded - self.numel, device=params[0].device)
        flat = torch.cat([p.detach().reshape(-1) for p in params] + [pad])  # [padded]
        if stage <= 2:
            self.flat = flat
            for (m, attr, shape, *_), view in zip(self.specs, self.views(flat)):
                setattr(m, attr, nn.Parameter(view.view(shape)))  # a view of flat: no copy
            self.opt_param = nn.Parameter(flat if stage == 0 else flat[self.lo : self.hi])  # [padded] or [shard]
        else:
            self.opt_param = nn.Parameter(flat[self.lo : self.hi].clone())  # [shard], the only copy kept
            self.full = torch.empty(self.padded, device=flat.device, requires_grad=True)  # [padded]
            self.full.untyped_storage().resize_(0)
            for m, attr, *_ in self.specs:
                del m._parameters[attr]  # the module now reads a plain tensor set by bind()

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """One view per parameter (the padding chunk dropped); one SplitBackward gathers their grads."""
        return list(torch.split(flat, [s[3] for s in self.specs] + [self.padded - self.numel]))[:-1]

    def parameters(self) -> list[torch.Tensor]:
        return [getattr(m, attr) for m, attr, *_ in self.specs]

    # stage 3 only
    @property
    def gathered(self) -> bool:
        return self.full.untyped_storage().nbytes() > 0

    def allocate(self) -> None:
        self.full.untyped_storage().resize_(self.padded * self.full.element_size())

    def free(self) -> None:
        self.full.untyped_storage().resize_(0)

    def bind(self) -> None:
        """Point the modules' weights at views of the gathered buffer (autograd sees them as slices of ``full``)."""
        for (m, attr, shape, *_), view in zip(self.specs, self.views(self.full)):
            setattr(m, attr, view.view(shape))

    def split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {s[4]: v.view(s[2]).clone() for s, v in zip(self.specs, self.views(flat))}


class Zero:
    """Train ``model`` with ZeRO stage ``stage`` over ``group``: ``loss = zero.loss(tokens, targets)``,
    ``loss.backward()``, ``zero.sync()``, ``zero.step()``, ``zero.zero_grad()``."""

    def __init__(self, model: GPT, *, stage: int, group, lr: float, prefetch: bool = True, tracer=None):
        check_stage(stage)
        zero_units(model.cfg)  # refuses configs our units cannot hold (a tied head)
        self.model, self.stage, self.group, self.prefetch, self.tracer = model, stage, group, prefetch, tracer
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        names = {id(p): name for name, p in model.named_parameters()}
        parts = [("embed", [model.tok_emb])] + [(f"block{i}", [b]) for i, b in enumerate(model.blocks)]
        parts.append(("head", [model.norm, model.lm_head]))
        self.units = [FlatUnit(name, mods, names, stage, self.rank, self.n) for name, mods in parts]
        self.optimizer = torch.optim.AdamW([u.opt_param for u in self.units], lr=lr)
        self.pending: dict[int, object] = {}  # unit -> in-flight all-gather
        self.peak_gathered = {"forward": 0, "backward": 0}
        self.gathered_log: list[tuple[float, str, int]] = []  # (time, phase, live bytes of whole units)
        self.phase, self.bwd_spans, self.ready = "forward", {}, [0] * len(self.units)
        for k, u in enumerate(self.units):
            if stage <= 1:  # a persistent flat gradient buffer; autograd accumulates into its views
                u.flat_grad = torch.zeros_like(u.flat)  # [padded]
                for p, view in zip(u.parameters(), u.views(u.flat_grad)):
                    p.grad = view.view(p.shape)
                u.opt_param.grad = u.flat_grad if stage == 0 else u.flat_grad[u.lo : u.hi]
            elif stage == 2:
                for p in u.parameters():
                    p.register_post_accumulate_grad_hook(lambda p, k=k: self._grad_ready(k))
            else:
                u.full.register_post_accumulate_grad_hook(lambda full, k=k: self._after_backward(k))

    # ---- forward: one unit at a time ----
    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The model's forward, unit by unit (the same ops as ``GPT.forward``), and the mean loss."""
        self.phase = "forward"
        x = self._run(0, self.model.embed, tokens)  # [batch, seq, hidden]
        for i, block in enumerate(self.model.blocks):
            x = self._run(i + 1, block, x)  # [batch, seq, hidden]
        logits = self._run(len(self.units) - 1, self.model.head, x)  # [batch, seq, vocab]
        self.phase = "backward"
        return self.model.loss(logits, targets)

    def _run(self, k: int, fn, x: torch.Tensor) -> torch.Tensor:
        if self.stage < 3:
            return fn(x)
        unit = self.units[k]
        self._gather(k)
        if self.prefetch and k + 1 < len(self.units):
            self._gather(k + 1, async_op=True)  # in flight while unit k computes
        unit.bind()
        with self._span("forward"):
            out = fn(x)
        unit.free()  # autograd keeps views of full; its storage comes back before backward
        self._track()
        out.register_hook(lambda grad, k=k: self._before_backward(k))
        return out

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
        work = dist.all_gather_single(unit.full.data, unit.opt_param.detach(), group=self.group, async_op=async_op)
        if async_op:
            self.pending[k] = work

    def _span(self, name: str):
        return self.tracer.span(name) if self.tracer is not None else nullcontext()

    def _track(self) -> None:
        """Measure the bytes of whole units held now (gathered weights + flat gradients) and log them."""
        live = sum(u.full.untyped_storage().nbytes() + storage_bytes([u.full.grad]) for u in self.units)
        self.peak_gathered[self.phase] = max(self.peak_gathered[self.phase], live)
        self.gathered_log.append((time.perf_counter(), self.phase, live))

    # ---- backward hooks ----
    def _before_backward(self, k: int) -> None:
        self._gather(k)
        if self.prefetch and k > 0:
            self._gather(k - 1, async_op=True)
        if self.tracer is not None:
            self.bwd_spans[k] = Span(self.rank, "compute", "backward", time.perf_counter())
            self.tracer.spans.append(self.bwd_spans[k])

    def _after_backward(self, k: int) -> None:
        """Stage 3: unit k's flat gradient is complete: reduce-scatter it, keep our slice, free the rest."""
        unit = self.units[k]
        if k in self.bwd_spans:
            self.bwd_spans.pop(k).end = time.perf_counter()
        self._track()
        grad = unit.full.grad  # [padded], the sum over this rank's micro-batch
        dist.reduce_scatter_single(grad[unit.lo : unit.hi], grad, group=self.group)  # in place: slice r gets Σ ranks
        unit.opt_param.grad = grad[unit.lo : unit.hi] / self.n  # [shard], a new tensor: the mean
        unit.full.grad = None
        unit.free()
        self._track()

    def _grad_ready(self, k: int) -> None:
        """Stage 2: when every weight of unit k has its gradient, reduce-scatter them and drop them."""
        unit = self.units[k]
        self.ready[k] += 1
        if self.ready[k] < len(unit.specs):
            return
        self.ready[k] = 0
        params = unit.parameters()
        pad = torch.zeros(unit.padded - unit.numel, device=unit.flat.device)
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [pad])  # [padded], transient
        dist.reduce_scatter_single(flat[unit.lo : unit.hi], flat, group=self.group)
        unit.opt_param.grad = flat[unit.lo : unit.hi] / self.n  # [shard]
        for p in params:
            p.grad = None

    def sync(self) -> None:
        """After backward. Stage 0: all-reduce; stage 1: reduce-scatter each unit; 2 and 3: done during backward."""
        for u in self.units:
            if self.stage == 0:
                dist.all_reduce(u.flat_grad, group=self.group)
                u.flat_grad.div_(self.n)
            elif self.stage == 1:
                dist.reduce_scatter_single(u.flat_grad[u.lo : u.hi], u.flat_grad, group=self.group)
                u.flat_grad[u.lo : u.hi].div_(self.n)

    def step(self) -> None:
        """AdamW on this rank's slices; stages 1-2 then all-gather the updated weights (in place)."""
        self.optimizer.step()
        if self.stage in (1, 2):
            for u in self.units:
                dist.all_gather_single(u.flat, u.flat[u.lo : u.hi], group=self.group)

    def zero_grad(self) -> None:
        for u in self.units:
            if self.stage <= 1:
                u.flat_grad.zero_()
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
        ts = [u.full if self.stage == 3 else u.flat for u in self.units] + list(self.model.buffers())
        return {t.untyped_storage().data_ptr() for t in ts if t.untyped_storage().nbytes()}

    def gather(self, slices: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Whole named tensors from one slice per unit (for parity checks; issues all-gathers)."""
        out = {}
        for u, s in zip(self.units, slices):
            full = s.detach().clone()
            if s.numel() != u.padded:
                full = torch.empty(u.padded, device=s.device)
                dist.all_gather_single(full, s.detach().contiguous(), group=self.group)
            out.update(u.split(full))
        return out


class _Activations(SavedActivations):
    """Saved activations, leaving out the weights' own buffers (which ZeRO-3 re-gathers, not keeps)."""

    def __init__(self, zero: Zero):
        super().__init__(None)
        self.zero = zero

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() in self.zero.unit_buffers():
            return t
        return super()._pack(t)


@dataclass
class ShardedResult(TrainResult):
    """A :class:`TrainResult` plus what one sharded rank measured (memory by moment, comm, timeline)."""

    moments: dict = field(default_factory=dict)  # moment -> category -> bytes (last step)
    comm: dict = field(default_factory=dict)  # op -> bytes sent per step
    counts: dict = field(default_factory=dict)  # op -> calls per step
    spans: list = field(default_factory=list)  # tracer spans of the last step (dicts)
    gathered_log: list = field(default_factory=list)  # ZeRO-3, last step: (time, phase, bytes of whole units)
    step_seconds: list = field(default_factory=list)


def comm_per_step(spans: list, steps: int) -> tuple[dict, dict]:
    """Bytes sent and calls per step by collective, from tracer spans."""
    return bytes_by_op(spans, per=steps, family=True), counts_by_op(spans, per=steps, family=True)


def train_zero(ctx, setup: TrainSetup, stage: int, prefetch: bool = True) -> ShardedResult:
    """Rank function: ``setup.steps`` ZeRO steps on this rank's slice of each global batch."""
    cfg, n, rank = setup.config(), ctx.world_size, ctx.rank
    model = GPT(cfg, seed=setup.seed).to(ctx.device)
    zero = Zero(model, stage=stage, group=ctx.group, lr=setup.lr, prefetch=prefetch, tracer=ctx.tracer)
    task, spans = setup.task(), ctx.tracer.spans
    losses, moments, first, step_seconds = [], {}, len(spans), []
    for step in range(setup.steps):
        tokens, targets = task.batch(step, setup.global_batch, setup.seq_len, rank, n, device=ctx.device)
        start, t0 = len(spans), time.perf_counter()
        zero.zero_grad()
        zero.gathered_log.clear()
        with _Activations(zero) as saved:
            with ctx.tracer.span("forward") if stage < 3 else nullcontext():
                loss = zero.loss(tokens, targets)
        moments["after forward"] = zero.held()
        with ctx.tracer.span("backward") if stage < 3 else nullcontext():
            loss.backward()
            zero.sync()
        moments["after backward"] = zero.held()
        if step == 0:
            first_grads = [u.opt_param.grad.clone() for u in zero.units]
        with ctx.tracer.span("step"):
            zero.step()
        moments["after step"] = zero.held()
        reported = loss.detach().clone()
        dist.all_reduce(reported, group=ctx.group)
        losses.append(float(reported) / n)
        step_seconds.append(time.perf_counter() - t0)
        ctx.progress(step + 1, setup.steps)
    sent, calls = comm_per_step(spans[first:], setup.steps)
    last = [s.as_dict() for s in spans[start:]]
    grads = zero.gather(first_grads)
    params = zero.gather([u.opt_param for u in zero.units])
    memory = {**moments["after step"], "grads": moments["after backward"]["grads"], "activations": saved.bytes,
              "peak_gathered": dict(zero.peak_gathered)}  # fmt: skip
    return ShardedResult(losses, grads, params, memory, moments=moments, comm=sent, counts=calls, spans=last,
                         gathered_log=list(zero.gathered_log), step_seconds=step_seconds)


# ---- the command line: playbook run zero --------------------------------------------------------
@dataclass
class ShardedReport(RunReport):
    """A :class:`RunReport` with notes (padding, transient buffers) printed under the summary."""

    notes: list = field(default_factory=list)

    def summary(self) -> str:
        return "\n".join([super().summary(), *(f"  note: {x}" for x in self.notes)])


def predicted_memory(setup: TrainSetup, stage: int, world_size: int, prefetch: bool = True) -> dict:
    """Rank 0's predicted bytes: model state (exact, padded), activations, and ZeRO-3's gathered peaks."""
    cfg = setup.config()
    state = zero_state_bytes(cfg, stage=stage, world_size=world_size).as_dict()
    state.pop("total")
    out = {**state, "activations": setup.predicted_memory(world_size).activations}
    if stage == 3:
        out["peak_gathered"] = zero3_gathered_peak(cfg, world_size=world_size, prefetch=prefetch)
    return out


def padding_note(setup: TrainSetup, world_size: int) -> list[str]:
    pads = {k: v for k, v in padding_elements(setup.config(), world_size).items() if v}
    if not pads:
        return []
    listed = ", ".join(f"{k} +{v}" for k, v in pads.items())
    return [f"{world_size} ranks do not divide every unit evenly: padded with zeros ({listed} elements, "
            f"{4 * sum(pads.values())} bytes in all); the predictions include the padding"]  # fmt: skip


def add_arguments(parser) -> None:
    parser.add_argument("--stage", type=int, default=3, help="ZeRO stage: 1, 2 or 3 (0 = plain data parallel)")
    parser.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=True,
                        help="ZeRO-3: gather the next unit while this one computes")  # fmt: skip


@register("zero", help="ZeRO-1/2/3 from scratch: sharded optimizer, gradients, parameters", arguments=add_arguments)
def run_zero(setup: TrainSetup, *, world_size: int, backend: str = "auto", stage: int = 3, prefetch: bool = True):
    check_stage(stage)
    setup.local_batch(world_size)  # the global batch must split over the ranks (clear error otherwise)
    backend = default_backend(world_size) if backend == "auto" else backend
    results = launch(train_zero, world_size, setup, stage, prefetch, backend=backend)
    r0, cfg = results[0], setup.config()
    predicted = predicted_memory(setup, stage, world_size, prefetch)
    by_moment = zero_memory_by_moment(cfg, stage=stage, world_size=world_size)
    notes = padding_note(setup, world_size)
    if stage == 3:
        pg, mg = predicted["peak_gathered"], r0.memory["peak_gathered"]
        notes.append(f"ZeRO-3 transient whole units ({'with' if prefetch else 'without'} prefetch), peak bytes: "
                     f"forward {mg['forward']:,} (predicted {pg['forward']:,}), "
                     f"backward {mg['backward']:,} (predicted {pg['backward']:,})")  # fmt: skip
    return ShardedReport(
        strategy=f"zero-{stage}", world_size=world_size, backend=backend,
        parity=compare(r0, train(setup)),
        memory={"predicted": predicted, "measured": r0.memory,
                "by_moment": {"predicted": by_moment, "measured": {m: r0.moments[m] for m in MOMENTS}}},
        comm={"predicted": zero_comm_per_step(cfg, stage=stage, world_size=world_size), "measured": r0.comm},
        setup={**setup.as_dict(), "stage": stage, "prefetch": prefetch}, losses=r0.losses, notes=notes,
    )  # fmt: skip
