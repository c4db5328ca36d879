"""Measure a sharded rank (our ZeRO, PyTorch's FSDP2): the bytes it holds, counted from storages,
and the activations it saves, leaving out the weights.

A sharded rank's tensors are views (slices of one flat buffer), DTensors (a local shard each) or
buffers whose storage comes and goes (ZeRO-3 and FSDP2 gather a unit's weights, then free them),
so bytes are counted per distinct storage rather than per tensor. The categories are those of
Rajbhandari et al. 2019, *ZeRO* (arXiv:1910.02054), §3: parameters, gradients, optimizer states.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from playbook.measure.memory import SavedActivations


def local(t):
    """A DTensor's shard on this rank; any other tensor (or None) as it is."""
    return t.to_local() if isinstance(t, DTensor) else t


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one buffer count once; None and freed skip)."""
    seen = {}
    for t in tensors:
        if t is not None and t.untyped_storage().nbytes():
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def storages(tensors: Iterable[torch.Tensor]) -> set[int]:
    """Addresses of the live storages behind ``tensors`` (a freed one, 0 bytes, is left out)."""
    return {t.untyped_storage().data_ptr() for t in tensors if t.untyped_storage().nbytes()}


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds: the storages behind the parameters (sharded, or whole while gathered),
    their gradients, and AdamW's states (local shards of DTensors, plus the ``step`` scalars)."""
    params = list(model.parameters())
    states = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {
        "params": storage_bytes([local(p) for p in params]),
        "grads": storage_bytes([local(p.grad) for p in params if p.grad is not None]),
        "optimizer": storage_bytes([local(v) for v in states]),
    }


class SavedActivationsBesides(SavedActivations):
    """Saved activations, leaving out the storages of the weights (and views of them, such as the
    transposed weight a matmul saves) as they are when saved: ``weights()`` returns their addresses
    at that moment (ZeRO-3's and FSDP2's gathered units, the RoPE tables), since a sharded run
    re-gathers its weights for backward rather than keeping them."""

    def __init__(self, weights: Callable[[], set[int]]):
        super().__init__(None)
        self.weights = weights

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() in self.weights():
            return t
        return super()._pack(t)
