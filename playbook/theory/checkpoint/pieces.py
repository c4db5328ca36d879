"""What each rank of a hybrid layout holds of every tensor, as rectangles of the full tensor. No torch.

A distributed checkpoint (PyTorch DCP; the layout-free format of torchtitan, Liang et al. 2024,
arXiv:2410.06511, §3.4) stores every tensor by its global name and shape, each rank writing the
pieces it holds described by their place in the whole: an offset and a size per dimension. Then
any other layout reads its own pieces back, whatever overlaps what, and resharding is a copy.

Our from-scratch layouts hold parameters in three shapes, and each is a list of rectangles:

- a tensor-parallel shard (Shoeybi et al. 2019, §3): one rectangle, rows [r·n/t, (r+1)·n/t) of a
  column-parallel weight (or the vocabulary rows of the embedding and head), columns of a
  row-parallel one; a replicated weight (norms, routers, experts under tp) is the whole tensor;
- a ZeRO flat shard (Rajbhandari et al. 2020, §5): rank j of N owns elements [j·s, (j+1)·s) of its
  unit's padded flat buffer, the unit's (local) parameters laid end to end in module order. Its
  intersection with one parameter is a run of that parameter's row-major elements, which is at most
  three rectangles (:func:`rectangles`): a partial first row, whole rows, a partial last row; offset
  by the parameter's tensor-parallel place it stays three rectangles of the full tensor;
- a pipeline stage holds only its chunks' pieces (``theory.pp.rank_params.chunk_ranges``); an
  expert-parallel rank only its E/ep experts, whole (DeepSpeed-MoE, Rajbhandari et al. 2022, §5).

:func:`holdings` lists them per rank from the model and the layout alone, in the order the flat
units lay parameters out (``parallel.zero.flat_unit.FlatUnit``: module registration order; a
tensor-parallel block registers its two norms before attention). AdamW's two moments have the
parameters' pieces (they live beside them: the same flat slice, or the same shard).
"""

from __future__ import annotations

from dataclasses import dataclass

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.pp.rank_params import blocks_in, chunk_ranges, is_moe_block


@dataclass(frozen=True)
class Piece:
    """One rectangle of tensor ``name``: ``offsets`` and ``sizes`` per dimension, in the full tensor."""

    name: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n


@dataclass(frozen=True)
class Param:
    """A parameter as a rank holds it: its name, full shape, local shape and the local block's offset
    (its tensor-parallel place; zeros where whole)."""

    name: str
    shape: tuple[int, ...]
    local: tuple[int, ...]
    offset: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.local:
            n *= s
        return n


def rectangles(local: tuple[int, ...], lo: int, hi: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Elements [lo, hi) of a row-major tensor of shape ``local`` (1-D or 2-D) as (offsets, sizes)
    rectangles: one for 1-D; for 2-D at most three (a partial first row, whole rows, a partial last row)."""
    if hi <= lo:
        return []
    if len(local) == 1:
        return [((lo,), (hi - lo,))]
    cols = local[1]
    out, r0, c0 = [], lo // cols, lo % cols
    if c0:  # the first row starts inside
        end = min(hi, (r0 + 1) * cols)
        out.append(((r0, c0), (1, end - lo)))
        lo, r0 = end, r0 + 1
    whole = (hi - lo) // cols
    if whole:
        out.append(((r0, 0), (whole, cols)))
        lo, r0 = lo + whole * cols, r0 + whole
    if hi > lo:  # the last row ends inside
        out.append(((r0, 0), (1, hi - lo)))
    return out


def _split(name: str, shape: tuple[int, int], dim: int | None, tp: int, tp_rank: int) -> Param:
    """``name`` of full ``shape`` cut 1/tp along ``dim`` (None: whole), as tp rank ``tp_rank`` holds it."""
    if dim is None or tp == 1:
        return Param(name, shape, shape, (0,) * len(shape))
    local = tuple(s // tp if d == dim else s for d, s in enumerate(shape))
    offset = tuple(tp_rank * local[d] if d == dim else 0 for d in range(len(shape)))
    return Param(name, shape, local, offset)


def units(
    cfg: ModelConfig, dims: ParallelDims, rank: int, *, schedule: str = "1f1b", v: int = 1
) -> list[tuple[str, bool, list[Param]]]:
    """``rank``'s flat units as (name, routed expert?, its parameters in flat order), the order of
    ``parallel.zero.flat_unit.units_of``: the embedding, each block (its dense part, then each of its
    E/ep routed experts), the final norm and head. Without ZeRO the same parameters, unit by unit."""
    c = dims.coords(rank)
    t, r, h, d = dims.tp, c["tp"], cfg.hidden, cfg.dim_head
    ranges = chunk_ranges(cfg, dims.pp, c["pp"], schedule, v)
    pieces = {i for a, b in ranges for i in range(a, b)}
    table = (cfg.vocab_size, h)
    out = []
    if 0 in pieces:
        out.append(("embed", False, [_split("tok_emb.weight", table, 0, t, r)]))
    for i in blocks_in(cfg, ranges):
        b = f"blocks.{i}."
        norms = [_split(b + "attn_norm.weight", (h,), None, t, r), _split(b + "mlp_norm.weight", (h,), None, t, r)]
        attn = [
            _split(b + "attn.q_proj.weight", (cfg.n_heads * d, h), 0, t, r),
            _split(b + "attn.k_proj.weight", (cfg.kv_heads * d, h), 0, t, r),
            _split(b + "attn.v_proj.weight", (cfg.kv_heads * d, h), 0, t, r),
            _split(b + "attn.o_proj.weight", (h, cfg.n_heads * d), 1, t, r),
        ]
        if is_moe_block(cfg, i):
            f = cfg.expert_ffn_hidden
            mlp = [_split(b + "mlp.router.weight", (cfg.n_experts, h), None, t, r)]
            mlp += [
                p for s in range(cfg.n_shared_experts) for p in _swiglu(f"{b}mlp.shared_experts.{s}.", h, f, None, t, r)
            ]
        else:
            mlp = _swiglu(b + "mlp.", h, cfg.ffn_hidden, 0, t, r)
        # GPT's Block registers attn_norm, attn, mlp_norm, mlp; TPGPT's block both norms first
        dense = norms + attn + mlp if t > 1 else [norms[0], *attn, norms[1], *mlp]
        out.append((f"block{i}", False, dense))
        if is_moe_block(cfg, i):
            per = cfg.n_experts // dims.ep
            for e in range(c["ep"] * per, (c["ep"] + 1) * per):
                expert = _swiglu(f"{b}mlp.experts.{e}.", h, cfg.expert_ffn_hidden, None, t, r)
                out.append((f"block{i}.expert{e}", True, expert))
    if cfg.n_layers + 1 in pieces:
        head = [_split("norm.weight", (h,), None, t, r)]
        if not (cfg.tie_embeddings and 0 in pieces):  # a tied head on the embedding's rank is the embedding
            head.append(_split("tok_emb.weight" if cfg.tie_embeddings else "lm_head.weight", table, 0, t, r))
        out.append(("head", False, head))
    return out


def _swiglu(prefix: str, h: int, f: int, dim: int | None, t: int, r: int) -> list[Param]:
    """gate and up [f, h] split by rows, down [h, f] by columns (``dim`` 0), or all whole (None)."""
    col, row = (None, None) if dim is None else (0, 1)
    return [
        _split(prefix + "gate_proj.weight", (f, h), col, t, r),
        _split(prefix + "up_proj.weight", (f, h), col, t, r),
        _split(prefix + "down_proj.weight", (h, f), row, t, r),
    ]


def zero_group(dims: ParallelDims, rank: int, routed: bool) -> tuple[int, int]:
    """(N, this rank's index j) of the group a unit is sharded over: dp×cp for dense units (j the data
    index), the ``ep_replica`` ranks holding the same experts for a routed expert (j = data index // ep)."""
    j = dims.data_index(rank)
    return (dims.dp * dims.cp // dims.ep, j // dims.ep) if routed else (dims.dp * dims.cp, j)


def holdings(
    cfg: ModelConfig, dims: ParallelDims, rank: int, *, zero: int = 0, schedule: str = "1f1b", v: int = 1
) -> list[Piece]:
    """The pieces of every parameter (and of each AdamW moment: the same) that ``rank``'s optimizer
    steps: with ZeRO its flat slices' rectangles (:func:`rectangles`), without ZeRO each parameter's
    local block whole."""
    out = []
    for _, routed, params in units(cfg, dims, rank, schedule=schedule, v=v):
        if not zero:
            out += [Piece(p.name, p.offset, p.local) for p in params]
            continue
        n, j = zero_group(dims, rank, routed)
        numel = sum(p.numel for p in params)
        shard = -(-numel // n)  # the padded buffer's 1/N
        lo, hi, start = j * shard, (j + 1) * shard, 0
        for p in params:
            a, b = max(lo, start) - start, min(hi, start + p.numel) - start
            for off, size in rectangles(p.local, a, b):
                out.append(Piece(p.name, tuple(o + g for o, g in zip(off, p.offset)), size))
            start += p.numel
    return out


def shapes(cfg: ModelConfig, dims: ParallelDims, *, schedule: str = "1f1b", v: int = 1) -> dict[str, tuple[int, ...]]:
    """Every parameter's full shape, by name, over all ranks of the layout."""
    return {
        p.name: p.shape
        for r in range(dims.world)
        for _, _, ps in units(cfg, dims, r, schedule=schedule, v=v)
        for p in ps
    }
