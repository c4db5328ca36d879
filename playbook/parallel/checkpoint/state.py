"""A hybrid rank's training state as pieces of the full tensors: what it writes and what it reads.

The live objects say where everything is: without ZeRO, each parameter of the rank's stage (its
tensor-parallel block, at offset tp_rank·n/t along its split dim) and AdamW's state for it; with
ZeRO, each flat unit's slice [lo, hi) of the padded buffer (``parallel.zero.flat_unit``) cut at
parameter boundaries into rectangles (``theory.checkpoint.pieces.rectangles``), the weights from the
optimizer's own slice and the moments beside them. Keys: ``model/<name>``, ``optim/exp_avg/<name>``,
``optim/exp_avg_sq/<name>``, ``optim/step/<name>``, ``data/position``, ``data/loader``, ``rng/cpu``.

What a rank reads differs from what it writes in one case: under ZeRO-1 and 2 it keeps every weight
of its stage whole (its flat buffer), so it reads them whole, and its moments by its slice.
"""

from __future__ import annotations

import torch

from playbook.theory.checkpoint.pieces import rectangles
from playbook.theory.checkpoint.writes import RNG_BYTES
from playbook.parallel.checkpoint.dcp_io import Chunks

MOMENTS = ("exp_avg", "exp_avg_sq")


def canonical(name: str, tied: bool) -> str:
    """The single process's name: a tied head's copy on the last stage is the embedding."""
    return "tok_emb.weight" if tied and name == "lm_head.weight" else name


def _place(local: torch.Size, dim, tp: int, tp_rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(full shape, offset of the local block) of a tensor-parallel shard split along ``dim`` (None: whole)."""
    if dim is None or tp == 1:
        return tuple(local), (0,) * len(local)
    full = tuple(s * tp if d == dim else s for d, s in enumerate(local))
    return full, tuple(tp_rank * local[d] if d == dim else 0 for d in range(len(local)))


def adam_state(optimizer, param: torch.Tensor) -> dict:
    """AdamW's state for ``param``, created as AdamW creates it (zeros, step 0) where it has none yet
    (a routed expert no token has reached): the next step then does what a fresh one does."""
    state = optimizer.state[param]
    if not state:
        state["step"] = torch.tensor(0.0)
        for m in MOMENTS:
            state[m] = torch.zeros_like(param, memory_format=torch.preserve_format)
    return state


class RankState:
    """This rank's pieces: ``entries`` is [(name, full shape, offsets, weight view, state dict of
    its optimizer tensor, moment views)] for what it writes; ``whole`` the whole local weights a
    ZeRO-1/2 rank reads."""

    def __init__(self, model, optimizer, *, split: dict, tp: int, tp_rank: int, tied: bool):
        self.entries, self.whole, self.steps = [], [], {}  # steps: name -> the AdamW state holding its step
        if hasattr(optimizer, "units"):  # ZeRO: the flat units' slices
            self._zero(optimizer, split, tp, tp_rank)
        else:
            for name, p in model.named_parameters():
                name = canonical(name, tied)
                full, off = _place(p.shape, split.get(name), tp, tp_rank)
                st = adam_state(optimizer, p)
                self.entries.append((name, full, off, p.data, [st[m] for m in MOMENTS]))
                self.steps[name] = st

    def _zero(self, zero, split, tp, tp_rank):
        for u in zero.units:
            st = adam_state(zero.optimizer, u.opt_param)
            mine = [u.opt_param.data, *(st[m] for m in MOMENTS)]  # each [shard]: this rank's slice
            start = 0
            for m, attr, shape, numel, name in u.specs:
                full, off = _place(shape, split.get(name), tp, tp_rank)
                a, b = max(u.lo, start) - start, min(u.hi, start + numel) - start
                for loc, size in rectangles(tuple(shape), a, b):
                    flat = start + sum(i * s for i, s in zip(loc, _strides(shape))) - u.lo
                    views = [t[flat : flat + _numel(size)].view(size) for t in mine]
                    self.entries.append((name, full, tuple(o + g for o, g in zip(loc, off)), views[0], views[1:]))
                if b > a:
                    self.steps[name] = st
                if zero.stage < 3:  # the whole local weight, a view of the flat buffer
                    self.whole.append((name, full, off, getattr(m, attr).data))
                start += numel

    def state(
        self, *, reading: bool, world: int, rank: int, data: torch.Tensor, rng: torch.Tensor, loader: torch.Tensor
    ) -> dict:
        """The DCP state dict: ``reading`` takes the whole weights where this rank keeps them whole;
        ``loader`` is this rank's row of the data loaders' table (``theory.checkpoint.writes.LOADER_BYTES``)."""
        out: dict[str, Chunks] = {}

        def add(key, full, off, t):
            out.setdefault(key, Chunks(full, []))
            out[key].pieces.append((torch.Size(off), t))

        weights = self.whole if reading and self.whole else [(n, f, o, w) for n, f, o, w, _ in self.entries]
        for name, full, off, w in weights:
            add(f"model/{name}", full, off, w)
        for name, full, off, _, moments in self.entries:
            for m, t in zip(MOMENTS, moments):
                add(f"optim/{m}/{name}", full, off, t)
        for name, st in self.steps.items():
            out[f"optim/step/{name}"] = Chunks((), [((), st["step"])])
        out["data/position"] = Chunks((2,), [((0,), data)])
        out["rng/cpu"] = Chunks((world, RNG_BYTES), [((rank, 0), rng.view(1, RNG_BYTES))])
        out["data/loader"] = Chunks((world, 3), [((rank, 0), loader.view(1, 3))])
        return out

    def descriptors(self) -> list[tuple[str, tuple, tuple]]:
        """(name, offsets, sizes) of every weight piece, for the write rule."""
        return [(n, tuple(o), tuple(w.shape)) for n, _, o, w, _ in self.entries]


def _strides(shape) -> tuple[int, ...]:
    return (shape[1], 1) if len(shape) == 2 else (1,)


def _numel(size) -> int:
    n = 1
    for s in size:
        n *= s
    return n


def keep_only(state: dict, written: set, steps: set, rank: int) -> dict:
    """``state`` cut to what this rank writes: its pieces the rule gives it (``written``: (name,
    offsets)), the steps it writes, its row of the generator table, and the data position on rank 0."""
    out = {}
    for key, chunks in state.items():
        if key.startswith(("model/", "optim/exp_avg")):
            name = key.split("/", 2)[-1] if key.startswith("optim/") else key[len("model/") :]
            pieces = [(o, t) for o, t in chunks.pieces if (name, tuple(o)) in written]
        elif key.startswith("optim/step/"):
            pieces = chunks.pieces if key[len("optim/step/") :] in steps else []
        elif key == "data/position":
            pieces = chunks.pieces if rank == 0 else []
        else:
            pieces = chunks.pieces
        if pieces:
            out[key] = Chunks(chunks.shape, pieces)
    return out
