"""Measure: one training step's memory over time, by category, from PyTorch's profiler (runs on CPU).

``torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)`` records every
allocation and free of the step; PyTorch's memory profiler (``torch.profiler._memory_profiler``, the
analysis behind ``prof.export_memory_timeline``) follows each tensor through the operator graph and
names what it is: a parameter, optimizer state, an input, an activation (made in forward, kept for
backward), a gradient, autograd's own detail (the gradients flowing between operators) or a
temporary. :func:`profile_step` runs one step under it and returns the categorised timeline.

Checked on torch 2.13 (CPU build): the categorised timeline works on CPU, but only with
``with_stack=True``: without it the analysis refuses ("with_stack=True required for memory
profiling"), and run past that check it files AdamW's state as unknown (the Python tracer is how it
sees ``optimizer.step``). The analysis is the slow part, about a second of CPU for the small GPT's
step; a fused AdamW (one kernel, not one per tensor) roughly halves it. ``export_memory_timeline``
itself warns that it is deprecated in favour of CUDA's allocator history, so this module calls the
analysis it wraps (``MemoryProfileTimeline``) directly. The raw allocator events (the profiler's ``[memory]``
entries, no categories) are kept too: ``raw_rise`` is the highest running sum of their sizes above
the step's start, the number the categorised total must reproduce.

What the profiler calls activations differs from what ``measure.memory.SavedActivations`` counts,
to the byte (``tests/measure/test_memory_timeline.py``): the logits the forward returns and the loss
are activations (the caller holds them); the token ids and the causal masks are inputs (they depend
on no parameter). Units: bytes; times: milliseconds since the step began.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, record_function

try:  # semi-private: the analysis behind prof.export_memory_timeline (torch >= 2.1)
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, Category, MemoryProfileTimeline
except ImportError as err:  # pragma: no cover - a torch without the memory profiler
    raise ImportError(f"measure.memory_timeline needs torch's memory profiler (torch >= 2.1): {err}") from None

# The profiler's categories under this package's names (playbook.viz.figures.CATEGORY_COLORS for the first four).
CATEGORY_NAMES: dict[Category | None, str] = {
    Category.PARAMETER: "params",
    Category.OPTIMIZER_STATE: "optimizer",
    Category.GRADIENT: "grads",
    Category.ACTIVATION: "activations",
    Category.AUTOGRAD_DETAIL: "autograd detail",
    Category.TEMPORARY: "temporaries",
    Category.INPUT: "inputs",
    None: "unknown",
}
CATEGORIES = tuple(CATEGORY_NAMES.values())


@dataclass(frozen=True)
class MemoryTimeline:
    """Bytes by category at each moment the profiler saw memory change during one step.

    ``times_ms[i]`` is when ``series[category][i]`` bytes were held; ``phases`` maps each part of the
    step ("forward 1", "backward 1", ..., "optimizer") to its (start, end) in ms; ``raw_rise`` is the
    peak of the raw allocation events above the step's start (no categories)."""

    times_ms: tuple[float, ...]
    series: dict[str, tuple[int, ...]]
    phases: dict[str, tuple[float, float]]
    raw_rise: int

    @property
    def total(self) -> list[int]:
        return [sum(col) for col in zip(*self.series.values())]

    @property
    def peak_index(self) -> int:
        total = self.total
        return total.index(max(total))

    @property
    def peak(self) -> int:
        return self.total[self.peak_index]

    @property
    def peak_ms(self) -> float:
        return self.times_ms[self.peak_index]

    def at(self, index: int) -> dict[str, int]:
        """Bytes by category at ``times_ms[index]``."""
        return {c: s[index] for c, s in self.series.items()}

    def phase_at(self, ms: float) -> str:
        """The phase running at ``ms`` ("between phases" in the gaps between them)."""
        return next((name for name, (a, b) in self.phases.items() if a <= ms <= b), "between phases")

    def end_of(self, phase: str) -> dict[str, int]:
        """Bytes by category at the last moment recorded before ``phase`` ended."""
        if phase not in self.phases:
            raise ValueError(f"phase must be one of {', '.join(map(repr, self.phases))}; got {phase!r}")
        end = self.phases[phase][1]
        return self.at(max(i for i, t in enumerate(self.times_ms) if t <= end))


def _step(model, optimizer, tokens, targets, micro_batches: int, mark: bool) -> None:
    """Forward and backward per micro-batch (gradients accumulate), then the optimizer."""
    for i, (x, y) in enumerate(zip(tokens.chunk(micro_batches), targets.chunk(micro_batches)), start=1):
        with record_function(f"forward {i}") if mark else nullcontext():
            _, loss = model(x, y)  # x, y: [batch / micro_batches, seq]
        with record_function(f"backward {i}") if mark else nullcontext():
            (loss / micro_batches).backward()  # the mean over the whole batch
        del loss
    with record_function("optimizer") if mark else nullcontext():
        optimizer.step()


def profile_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    *,
    micro_batches: int = 1,
    warmup: bool = True,
) -> MemoryTimeline:
    """Run one training step under the profiler and return its memory timeline by category.

    ``model(tokens, targets)`` returns ``(logits, loss)`` as ``playbook.model.gpt.GPT`` does;
    ``tokens``, ``targets``: [batch, seq] on the CPU, split into ``micro_batches`` equal micro-batches
    whose gradients accumulate before one ``optimizer.step()`` (the fix "a smaller micro-batch, the same
    batch"). ``warmup`` first runs one step unprofiled, so that the profiled step is a steady one:
    AdamW creates its state in its first step, which would otherwise sit inside the timeline.
    """
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches must be a positive integer, got {micro_batches!r}")
    if tokens.ndim != 2 or tokens.shape[0] % micro_batches:
        raise ValueError(
            f"tokens must be [batch, seq] with batch divisible by micro_batches={micro_batches}; got {tuple(tokens.shape)}"
        )
    if targets.shape != tokens.shape:
        raise ValueError(f"targets must have the shape of tokens {tuple(tokens.shape)}; got {tuple(targets.shape)}")
    if tokens.device.type != "cpu":
        raise ValueError(f"profile_step reads the CPU timeline; got tokens on {tokens.device}")
    if warmup:
        optimizer.zero_grad(set_to_none=True)
        _step(model, optimizer, tokens, targets, micro_batches, mark=False)
    optimizer.zero_grad(set_to_none=True)  # before the profiler: a free of what it never saw allocated warns
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True)
    with _quiet_native_stderr():  # torch 2.13's CPU build prints "USDT: ... profiler_start" (and _stop) from C++
        prof.start()
    try:
        _step(model, optimizer, tokens, targets, micro_batches, mark=True)
    finally:
        with _quiet_native_stderr():
            prof.stop()
    memory = prof._memory_profile()  # the categorisation: what export_memory_timeline runs first
    times_us, sizes = MemoryProfileTimeline(memory)._coalesce_timeline("cpu")  # sizes[i]: [0] + one per category
    names = {f"{kind} {i}" for kind in ("forward", "backward") for i in range(1, micro_batches + 1)} | {"optimizer"}
    marks, raw_rise = _marks_and_raw_rise(prof.profiler.kineto_results.experimental_event_tree(), names)
    t0 = marks[0][0] / 1e3  # us
    series = {name: tuple(row[_CATEGORY_TO_INDEX[c] + 1] for row in sizes) for c, name in CATEGORY_NAMES.items()}
    return MemoryTimeline(
        times_ms=tuple((t - t0) / 1e3 for t in times_us),
        series=series,
        phases={name: ((a / 1e3 - t0) / 1e3, (b / 1e3 - t0) / 1e3) for a, b, name in marks},
        raw_rise=raw_rise,
    )


@contextmanager
def _quiet_native_stderr():
    """File descriptor 2 pointed at /dev/null for the block: C++ prints there, past ``sys.stderr``."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _marks_and_raw_rise(roots, names: set[str]) -> tuple[list[tuple[int, int, str]], int]:
    """The (start ns, end ns, name) of the step's marked phases, in order, and the highest running sum of
    the raw allocation events (frees are negative) in time order, from the profiler's event tree."""
    from torch._C._profiler import _EventType

    stack, marks, allocs = list(roots), [], []
    while stack:
        e = stack.pop()
        kind = e.typed[0]
        if kind == _EventType.Allocation:
            allocs.append((e.start_time_ns, e.typed[1].alloc_size))
        elif kind == _EventType.TorchOp and e.name in names:
            marks.append((e.start_time_ns, e.end_time_ns, e.name))
        stack.extend(e.children)
    now = high = 0
    for _, size in sorted(allocs):
        now += size
        high = max(high, now)
    return sorted(marks), high
