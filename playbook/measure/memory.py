"""Measure one rank's memory by category: parameters, gradients, optimizer state, saved activations.

The categories are those of the ZeRO paper (Rajbhandari et al. 2019, §3) plus activations
(Korthikanti et al. 2022), so each number here has a predicted twin in ``playbook.theory``.
Everything is counted from the tensors themselves, so it works on any device; on CUDA the
allocator's own peak is recorded as well. Units: bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn as nn


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters (a tied weight counts once). Buffers (RoPE tables) are not included."""
    return sum(_nbytes(p) for p in model.parameters())


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of the gradients held now: every ``p.grad`` that is not None."""
    return sum(_nbytes(p.grad) for p in model.parameters() if p.grad is not None)


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in ``optimizer.state``: for AdamW, exp_avg and exp_avg_sq (same size as
    the parameter) and the scalar ``step`` tensor (4 bytes each on CPU). Empty before the first step."""
    return sum(
        _nbytes(value)
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    )


@dataclass(frozen=True)
class SavedTensor:
    """One storage that autograd saved: a tensor's shape and dtype, the op that produced it, its storage's bytes."""

    shape: tuple[int, ...]
    dtype: str
    made_by: str  # the grad_fn that produced it ("leaf" for inputs such as token ids)
    bytes: int


class SavedActivations:
    """Record every tensor autograd saves for backward while the context is open.

    Uses ``torch.autograd.graph.saved_tensors_hooks``: the pack hook sees each tensor an op saves
    and returns it unchanged (nothing is copied, offloaded or kept beyond what autograd keeps).
    A storage is counted once however many ops save it or views of it, with the storage's full
    size; parameters and buffers of ``exclude`` (a module, or an iterable of tensors) are skipped.

        with SavedActivations(model) as saved:
            loss = model(tokens, targets)[1]
        saved.bytes    # total
        saved.tensors  # [SavedTensor(shape, dtype, made_by, bytes), ...] in the order first saved

    Measure one forward pass per context: storages are identified by address, which is only
    unique while the saved tensors are alive (until backward frees them). While the context is
    open it is the innermost saved-tensor hook; code that installs its own (e.g. offloading) hides
    its tensors from this one. Non-reentrant ``torch.utils.checkpoint`` works: what it keeps (the
    checkpointed function's inputs) is seen.
    """

    def __init__(self, exclude: nn.Module | Iterable[torch.Tensor] | None = None):
        if exclude is None:
            tensors: list[torch.Tensor] = []
        elif isinstance(exclude, nn.Module):
            tensors = [*exclude.parameters(), *exclude.buffers()]
        else:
            tensors = list(exclude)
        self._excluded = {t.untyped_storage().data_ptr() for t in tensors}
        self._seen: set[int] = set()
        self.tensors: list[SavedTensor] = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if storage.nbytes() and key not in self._excluded and key not in self._seen:
            self._seen.add(key)
            made_by = type(t.grad_fn).__name__ if t.grad_fn is not None else "leaf"
            self.tensors.append(
                SavedTensor(tuple(t.shape), str(t.dtype).removeprefix("torch."), made_by, storage.nbytes())
            )
        return t

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.tensors)

    def by_shape(self) -> dict[tuple[tuple[int, ...], str], int]:
        """Bytes grouped by (shape, dtype): a compact table for a notebook."""
        out: dict[tuple[tuple[int, ...], str], int] = {}
        for s in self.tensors:
            out[(s.shape, s.dtype)] = out.get((s.shape, s.dtype), 0) + s.bytes
        return out

    def __enter__(self) -> SavedActivations:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


@dataclass
class MemorySnapshot:
    """One rank's memory in bytes by category (see ``measure_training_step`` for when each is taken).

    ``peak``: params + grads + optimizer + activations, the category total that
    ``playbook.theory.hybrid.memory`` predicts. It is an upper bound of the live tensors rather than a
    moment observed: during backward, activations are freed as gradients appear. ``cuda_allocated``
    and ``cuda_reserved`` (CUDA only) are the allocator's true peaks over the step, which also
    include temporaries, workspaces and (reserved) the caching allocator's free blocks.
    """

    params: int
    grads: int
    optimizer: int
    activations: int
    peak: int | None = None
    cuda_allocated: int | None = None
    cuda_reserved: int | None = None
    saved: list[SavedTensor] = field(default_factory=list, repr=False)  # what the activations are
    loss: torch.Tensor | None = field(default=None, repr=False)  # the step's loss, detached

    def as_dict(self) -> dict[str, int | None]:
        """The byte counts only (not ``saved`` or ``loss``)."""
        return {
            k: getattr(self, k)
            for k in ("params", "grads", "optimizer", "activations", "peak", "cuda_allocated", "cuda_reserved")
        }


def measure_training_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    *,
    after_backward: Callable[[nn.Module], None] | None = None,
    global_tokens: int | None = None,
) -> MemorySnapshot:
    """Run one training step (zero_grad, forward, backward, ``after_backward``, optimizer.step) and measure it.

    ``model(tokens, targets)`` must return ``(logits, loss)`` as ``playbook.model.gpt.GPT`` does.
    ``after_backward(model)`` is where a strategy synchronises (or shards) gradients; ``global_tokens``,
    where given, is passed on to the model: the global batch's token count its loss divides by.
    params: before the step; activations: saved during the forward; grads: after backward and
    ``after_backward``; optimizer: after the step (so the first call already shows AdamW's state).
    """
    device = tokens.device
    on_cuda = device.type == "cuda"
    if on_cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    optimizer.zero_grad(set_to_none=True)
    params = parameter_bytes(model)
    with SavedActivations(model) as saved:
        _, loss = (
            model(tokens, targets) if global_tokens is None else model(tokens, targets, global_tokens=global_tokens)
        )
    loss.backward()
    if after_backward is not None:
        after_backward(model)
    grads = gradient_bytes(model)
    optimizer.step()
    opt = optimizer_bytes(optimizer)
    snap = MemorySnapshot(
        params=params,
        grads=grads,
        optimizer=opt,
        activations=saved.bytes,
        peak=params + grads + opt + saved.bytes,
        saved=saved.tensors,
        loss=loss.detach(),
    )
    if on_cuda:
        torch.cuda.synchronize(device)
        snap.cuda_allocated = torch.cuda.max_memory_allocated(device)
        snap.cuda_reserved = torch.cuda.max_memory_reserved(device)
    return snap
