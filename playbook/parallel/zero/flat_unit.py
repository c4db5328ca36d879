"""ZeRO's unit: some modules' parameters as one flat buffer, padded so that n ranks own equal slices.

Rajbhandari et al. 2019, *ZeRO* (arXiv:1910.02054), §5: each rank keeps 1/N of the model state.
``parallel.zero.zero.Zero`` moves the slices; this module only lays them out. A unit belongs to one
process group, the ranks that hold the same weights: a dense unit shards over ``dp×cp``, a unit of
routed experts over its replica group ``ep_replica`` (the ranks holding the same experts), so the
model is never one flat buffer that mixes the two (DeepSpeed-MoE, Rajbhandari et al. 2022, §5.2:
expert parameters are sharded over the expert-data-parallel group only).

A weight that two modules hold (a tied embedding: the head's ``lm_head.weight`` *is* the
embedding's ``tok_emb.weight``) belongs to one unit only, the first that lists it (``build_units``);
every module holding it (``holders_of``) is re-pointed at that unit's view, so
both uses keep reading, and accumulating their gradients into, the same slice of one flat buffer.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from playbook.model.moe import moe_layers
from playbook.model.moe import ROUTED


class FlatUnit:
    """Some modules' parameters as one flat buffer [padded], padded so that n ranks own equal slices.

    ``keep(name)`` chooses which of the modules' parameters the unit holds (all by default);
    ``group`` is the unit's ZeRO group (None: one rank, no collective); its gradient is reduce-scattered
    as a sum, every rank's loss being its share of the global mean (``model.gpt.lm_loss``).

    Stages 0-2: ``flat`` holds every weight and the modules' parameters are views into it; the
    optimizer updates ``opt_param`` (all of ``flat`` for stage 0, this rank's slice otherwise, a view:
    no copy). Stage 3: only ``opt_param`` (this rank's slice) persists; ``full`` [padded] gets its
    storage when gathered and loses it when freed, and the modules read views of it.
    """

    def __init__(self, name: str, modules: list[nn.Module], names: dict, stage: int, group, keep=None, holders=None):
        self.name, self.stage, self.group = name, stage, group
        self.n = 1 if group is None else dist.get_world_size(group)
        rank = 0 if group is None else dist.get_rank(group)
        self.specs = [
            (m, attr, p.shape, p.numel(), names[id(p)])
            for mod in modules
            for m in mod.modules()
            for attr, p in m.named_parameters(recurse=False)
            if keep is None or keep(names[id(p)])
        ]
        # every (module, attr) holding each weight: a tied one is read by the embedding and the head
        self.holders = [(holders or {}).get(id(getattr(m, attr)), [(m, attr)]) for m, attr, *_ in self.specs]
        self.numel = sum(s[3] for s in self.specs)
        self.padded = -(-self.numel // self.n) * self.n
        self.shard = self.padded // self.n
        self.lo, self.hi = rank * self.shard, (rank + 1) * self.shard
        params = [getattr(m, attr) for m, attr, *_ in self.specs]
        pad = torch.zeros(self.padded - self.numel, device=params[0].device, dtype=params[0].dtype)
        flat = torch.cat([p.detach().reshape(-1) for p in params] + [pad])  # [padded]
        if stage <= 2:
            self.flat = flat
            for (_, _, shape, *_), held, view in zip(self.specs, self.holders, self.views(flat)):
                param = nn.Parameter(view.view(shape))  # a view of flat: no copy
                for m, attr in held:
                    setattr(m, attr, param)
            self.opt_param = nn.Parameter(flat if stage == 0 else flat[self.lo : self.hi])  # [padded] or [shard]
        else:
            self.opt_param = nn.Parameter(flat[self.lo : self.hi].clone())  # [shard], the only copy kept
            self.full = torch.empty(self.padded, device=flat.device, dtype=flat.dtype, requires_grad=True)  # [padded]
            self.full.untyped_storage().resize_(0)
            for m, attr in (h for held in self.holders for h in held):
                del m._parameters[attr]  # the module now reads a plain tensor set by bind()

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """One view per parameter (the padding chunk dropped); one SplitBackward gathers their grads."""
        return list(torch.split(flat, [s[3] for s in self.specs] + [self.padded - self.numel]))[:-1]

    def parameters(self) -> list[torch.Tensor]:
        return [getattr(m, attr) for m, attr, *_ in self.specs]

    def sum_over(self, flat: torch.Tensor, group, names: set[str]) -> None:
        """The gradients of the parameters ``names`` in ``flat`` [padded] summed over ``group``, in place."""
        parts = [v for spec, v in zip(self.specs, self.views(flat)) if spec[4] in names]  # views into flat
        if parts:
            joined = torch.cat(parts)  # [Σ numel]
            dist.all_reduce(joined, group=group)
            for v, y in zip(parts, joined.split([p.numel() for p in parts])):
                v.copy_(y)

    # ---- collectives on the unit's own group (none on one rank) ----
    def reduce_scatter(self, flat: torch.Tensor) -> None:
        """flat [padded]: the sum over the group lands in this rank's slice (in place)."""
        if self.n > 1:
            dist.reduce_scatter_single(flat[self.lo : self.hi], flat, group=self.group)

    def all_gather(self, out: torch.Tensor, mine: torch.Tensor, async_op: bool = False):
        """Every rank's slice into ``out`` [padded]; a Work when ``async_op`` (None on one rank)."""
        if self.n == 1:
            out.copy_(mine)
            return None
        return dist.all_gather_single(out, mine, group=self.group, async_op=async_op)

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
        for (_, _, shape, *_), held, view in zip(self.specs, self.holders, self.views(self.full)):
            for m, attr in held:
                setattr(m, attr, view.view(shape))

    def split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {s[4]: v.view(s[2]).clone() for s, v in zip(self.specs, self.views(flat))}


def build_units(model: nn.Module, pieces: range | None, stage: int, group, expert_group) -> list[FlatUnit]:
    """ZeRO's flat units of ``model``'s pieces (``units_of``) laid out for ``stage``: dense ones over
    ``group``; routed experts over the ranks holding the same experts, ``expert_group``. A
    weight two modules hold (a tied embedding) goes in the first unit that lists it, and every holder
    reads its view."""
    names, holders = {id(p): name for name, p in model.named_parameters()}, holders_of(model)
    units: list[FlatUnit] = []
    taken: set[str] = set()
    for name, _, mods, routed in units_of(model, pieces):
        keep = lambda k, routed=routed: k not in taken and (ROUTED in k) == routed  # noqa: E731
        units.append(FlatUnit(name, mods, names, stage, expert_group if routed else group, keep, holders))
        taken.update(spec[4] for spec in units[-1].specs)
        if stage <= 2:  # the views its modules now hold, under the names of the weights they replace
            names.update({id(p): spec[4] for p, spec in zip(units[-1].parameters(), units[-1].specs)})
    return units


def gather_units(units: list[FlatUnit], slices: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Whole named tensors from one slice per unit (for parity checks; issues all-gathers). A None
    slice (the gradient of an expert no token reached, on every rank alike) names nothing, as in one process."""
    out = {}
    for u, s in ((u, s) for u, s in zip(units, slices) if s is not None):
        full = s.detach().clone()
        if s.numel() != u.padded:
            full = torch.empty(u.padded, device=s.device, dtype=s.dtype)
            u.all_gather(full, s.detach().contiguous())
        out.update(u.split(full))
    return out


def holders_of(model: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    """id(weight) -> every (module, attribute) of ``model`` that holds it (two for a tied embedding)."""
    out: dict[int, list[tuple[nn.Module, str]]] = {}
    for m in model.modules():
        for attr, p in m.named_parameters(recurse=False):
            out.setdefault(id(p), []).append((m, attr))
    return out


def units_of(model: nn.Module, pieces: range | None = None) -> list[tuple[str, int, list[nn.Module], bool]]:
    """ZeRO's units among the model's pieces ``pieces`` (all by default; a pipeline stage's range
    otherwise, ``parallel.pp.executor``), as (name, piece, modules, routed): the embedding (piece 0),
    block i (piece i+1) without its routed experts, then each of its routed experts as a unit of its
    own (``Fed``), the final norm and head (piece L+1)."""
    L = len(model.blocks)
    pieces = range(L + 2) if pieces is None else pieces
    out = [("embed", 0, [model.tok_emb], False)] if 0 in pieces else []
    for i in (i for i in range(L) if i + 1 in pieces):
        out.append((f"block{i}", i + 1, [model.blocks[i]], False))
        for e, expert in getattr(model.blocks[i].mlp, "experts", nn.ModuleDict()).named_children():
            out.append((f"block{i}.expert{e}", i + 1, [expert], True))  # e: the global expert number
    return out + ([("head", L + 1, [model.norm, model.lm_head], False)] if L + 1 in pieces else [])


def piece_map(model: nn.Module, pieces: range | None, units: list[FlatUnit]) -> tuple[dict, dict, dict]:
    """(own, reads, last_read) for ``units`` built from ``units_of(model, pieces)``: piece -> its own
    units in forward order; piece -> the units its modules read, its own and a tied weight's (the
    head reads the embedding's unit); unit -> the last piece of the forward that reads it (ZeRO-3
    frees a unit after that piece's forward)."""
    own: dict[int, list[int]] = {}
    piece_of: dict[int, int] = {}  # id(module) -> its piece
    for k, (_, piece, mods, _) in enumerate(units_of(model, pieces)):
        own.setdefault(piece, []).append(k)
        piece_of.update({id(m): piece for mod in mods for m in mod.modules()})
    reads = {piece: list(ks) for piece, ks in own.items()}
    for k, u in enumerate(units):
        for q in sorted({piece_of[id(m)] for held in u.holders for m, _ in held if id(m) in piece_of}):
            reads[q] += [] if k in reads[q] else [k]
    last_read = {k: max(q for q, ks in reads.items() if k in ks) for k in range(len(units))}
    return own, reads, last_read


class Fed:
    """Which routed experts' units a token reached this step (any forward since ``clear``).

    The single process leaves an expert that no token reached without a gradient, and AdamW then
    leaves it alone: no weight decay, no moment update, no step counted (Loshchilov & Hutter 2019's
    update runs per parameter with a gradient). ZeRO's flat unit would instead hold zeros, which AdamW
    applies. So each routed expert is a unit of its own, and ``Zero`` drops its sharded gradient where
    no token reached it. Every rank knows that from the routing counts the MoE layer already shares
    over the data ranks (``stats.kept``, global), so the replicas agree without sending anything."""

    def __init__(self, model: nn.Module, pieces: range | None):
        expert = {id(m): (layer, int(e)) for layer in moe_layers(model) for e, m in layer.experts.named_children()}
        self.of = {k: expert[id(mods[0])] for k, (*_, mods, routed) in enumerate(units_of(model, pieces)) if routed}
        self.reached: dict[int, set[int]] = {}  # id(layer) -> the global experts a token reached
        for layer in {id(layer): layer for layer, _ in self.of.values()}.values():
            layer.register_forward_hook(self._record)

    def _record(self, layer, _inputs, _output) -> None:
        self.reached.setdefault(id(layer), set()).update(e for e, kept in enumerate(layer.stats.kept) if kept)

    def starved(self, k: int) -> bool:
        """Unit k is a routed expert that no token reached since ``clear``."""
        return k in self.of and self.of[k][1] not in self.reached.get(id(self.of[k][0]), ())

    def clear(self) -> None:
        self.reached.clear()
