"""Measure: the bytes autograd holds *right now*, by saved-tensor hooks.

A pipeline rank holds the activations of several micro-batches at once, and how many depends on
the schedule (GPipe: all m; 1F1B: at most p, Narayanan et al. 2021 §2.2), and a split backward
(ZB-H1) keeps a smaller set from B until W (``keep``). ``HeldActivations`` counts them as they come
and go, so the peak of a real step can be put beside
``playbook.theory.pp.pipeline``'s prediction to the byte.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class _Ticket:
    __slots__ = ("owner", "key", "tensor")

    def __init__(self, owner, key, tensor):
        self.owner, self.key, self.tensor = owner, key, tensor

    def __del__(self):
        self.owner.release(self.key)


class HeldActivations:
    """Saved-tensor hooks that count the bytes autograd holds *right now*: a storage is added when
    first saved and removed when autograd drops its last saved reference (after backward frees the
    graph). ``peak`` is the high-water mark; parameters and buffers of ``exclude`` are not counted."""

    def __init__(self, exclude: nn.Module):
        self.skip = {t.untyped_storage().data_ptr() for t in [*exclude.parameters(), *exclude.buffers()]}
        self.refs: dict[int, list[int]] = {}
        self.now = self.peak = 0

    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.skip or storage.nbytes() == 0:
            return t
        if key in self.refs:
            self.refs[key][0] += 1
        else:
            self.refs[key] = [1, storage.nbytes()]
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)
        return _Ticket(
            self, key, t.detach()
        )  # detached: holding t itself would tie an output to its own grad_fn (a cycle)

    def keep(self, t: torch.Tensor):
        """Count ``t`` as held until the returned ticket is dropped (``ticket.tensor`` reads it): what
        a split backward keeps from B until W once the graph is freed (``parallel.pp.executor``).
        A storage autograd already saved is not counted twice."""
        return self.pack(t)

    @staticmethod
    def unpack(x):
        return x.tensor if isinstance(x, _Ticket) else x

    def release(self, key: int) -> None:
        entry = self.refs[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.now -= entry[1]
            del self.refs[key]

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
