"""What one rank of a hybrid layout holds: the pieces of its pipeline chunks, and their parameters
by unit. ``theory.hybrid.hybrid`` (memory and gradient bytes), ``theory.hybrid.zero`` (ZeRO's flat units)
and ``theory.hybrid.moe`` (a mixture of experts' state and collectives) all read this one list.

Our GPT in pieces: piece 0 the embedding, pieces 1..L the blocks, piece L + 1 the final norm and
head. A rank holds the pieces of its v virtual stages (:func:`chunk_ranges`: Megatron's loop,
Narayanan et al. 2021, arXiv:2104.04473, §2.2.2, or the V of Qi et al. 2023, arXiv:2401.10241, §6),
equal or not (``theory.pp.layer_partition.equal_partition``). Each piece's parameters on a rank of tp × ep
(Shoeybi et al. 2019, arXiv:1909.08053, §3; DeepSpeed-MoE, Rajbhandari et al. 2022,
arXiv:2201.05596, §5): the matrices of attention, of a dense MLP, the embedding and the head split
1/tp; the RMSNorm weights whole; in an MoE block the router and shared experts whole (each tp rank
routes its own slice of the tokens) and E/ep routed experts, each a unit of its own (ZeRO leaves
an expert no token reached to AdamW alone, ``parallel.zero.zero``). No torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.pp.layer_partition import equal_partition
from playbook.theory.pp.schedules import V_SCHEDULES


def chunk_ranges(cfg: ModelConfig, pp: int, stage: int, schedule: str = "1f1b", v: int = 1) -> list[tuple[int, int]]:
    """The piece ranges [start, end) of the ``v`` virtual stages pipeline rank ``stage`` holds
    (``theory.pp.pipeline.stage_ranges`` of pp·v stages; piece 0 the embedding, 1..L the blocks, L+1
    the head), placed as the schedule places them: chunk c is stage c·pp + stage (Narayanan et al.
    2021, §2.2.2), or on the V, stages ``stage`` and 2·pp − 1 − ``stage`` (Qi et al. 2023, §6)."""
    ranges = equal_partition(cfg.n_layers, pp * v)
    if schedule in V_SCHEDULES:
        return [ranges[stage], ranges[2 * pp - 1 - stage]]
    return [ranges[c * pp + stage] for c in range(v)]


def blocks_in(cfg: ModelConfig, ranges: list[tuple[int, int]]) -> list[int]:
    """The block indices among the pieces of ``ranges`` (piece i + 1 is block i)."""
    return sorted(i - 1 for start, end in ranges for i in range(start, end) if 1 <= i <= cfg.n_layers)


def is_moe_block(cfg: ModelConfig, block: int) -> bool:
    """Block ``block`` (0-based) is a mixture of experts: after the first ``n_dense_layers``."""
    return cfg.is_moe and block >= cfg.n_dense_layers


@dataclass(frozen=True)
class Unit:
    """One unit of a rank's parameters, in elements: ``split`` (matrices split 1/tp), ``norms``
    (RMSNorm weights, whole on every tp rank), ``moe`` (router, shared or routed experts: whole on
    every tp rank), its parameter ``tensors`` (``moe_tensors`` of them MoE ones), and whether it is
    one of a block's E/ep routed ``experts`` (replicated over ``ep_replica``, not over dp×cp)."""

    name: str
    split: int
    norms: int = 0
    moe: int = 0
    tensors: int = 1
    moe_tensors: int = 0
    experts: bool = False

    @property
    def numel(self) -> int:
        return self.split + self.norms + self.moe


def rank_units(cfg: ModelConfig, dims: ParallelDims, ranges: list[tuple[int, int]]) -> list[Unit]:
    """This rank's parameters by unit for the pieces of ``ranges`` (module docstring): the embedding,
    each block (an MoE block: its dense part, then each routed expert), the final norm and head. A
    tied head on the embedding's rank adds no weight (one tensor serves both); on another rank it is
    a copy (Megatron's embedding group, Narayanan et al. 2021). Remembered per (cfg, dims, ranges):
    a planner's search asks for the same rank thousands of times, and DeepSeek-V3's 256 experts a
    layer make each list long (the Units are frozen; the list returned is the caller's own)."""
    return list(_rank_units(cfg, dims.tp, dims.ep, tuple(tuple(r) for r in ranges)))


@functools.lru_cache(maxsize=1024)
def _rank_units(cfg: ModelConfig, tp: int, ep: int, ranges: tuple[tuple[int, int], ...]) -> tuple[Unit, ...]:
    """``rank_units`` keyed on what it reads: only tp and ep of the layout change a rank's units."""
    t, h = tp, cfg.hidden
    pieces = {i for start, end in ranges for i in range(start, end)}
    table = cfg.vocab_size * h // t
    units = [Unit("embed", table)] if 0 in pieces else []
    for i in blocks_in(cfg, ranges):
        if not is_moe_block(cfg, i):
            units.append(Unit(f"block{i}", (cfg.layer_params() - 2 * h) // t, 2 * h, tensors=9))
            continue
        expert, per = 3 * h * cfg.expert_ffn_hidden, cfg.n_experts // ep
        shared = 3 * cfg.n_shared_experts
        router = h * cfg.n_experts + cfg.n_shared_experts * expert
        units.append(Unit(f"block{i}", cfg.attention_params() // t, 2 * h, router, 2 + 4 + 1 + shared, 1 + shared))
        units += [Unit(f"block{i}.expert{e}", 0, 0, expert, 3, 3, experts=True) for e in range(per)]
    if cfg.n_layers + 1 in pieces:
        tied_here = cfg.tie_embeddings and 0 in pieces
        units.append(Unit("head", 0, h) if tied_here else Unit("head", table, h, tensors=2))
    return tuple(units)


@functools.lru_cache(maxsize=4096)
def unit_sizes(
    cfg: ModelConfig, tp: int, ep: int, ranges: tuple[tuple[int, int], ...]
) -> tuple[tuple[int, bool, int], ...]:
    """``rank_units`` counted: (numel, experts, how many units of that size) in first-seen order, for
    sums over units where the names do not matter (a layer's routed experts are one size)."""
    counts: dict[tuple[int, bool], int] = {}

    def add(numel: int, experts: bool, k: int = 1) -> None:
        counts[numel, experts] = counts.get((numel, experts), 0) + k

    # the units of _rank_units in its order, counted without building one Unit per routed expert
    t, h = tp, cfg.hidden
    pieces = {i for start, end in ranges for i in range(start, end)}
    table = cfg.vocab_size * h // t
    if 0 in pieces:
        add(table, False)
    for i in blocks_in(cfg, ranges):
        if not is_moe_block(cfg, i):
            add((cfg.layer_params() - 2 * h) // t + 2 * h, False)
            continue
        expert = 3 * h * cfg.expert_ffn_hidden
        add(cfg.attention_params() // t + 2 * h + h * cfg.n_experts + cfg.n_shared_experts * expert, False)
        if cfg.n_experts // ep:
            add(expert, True, cfg.n_experts // ep)
    if cfg.n_layers + 1 in pieces:
        add(h if cfg.tie_embeddings and 0 in pieces else table + h, False)
    return tuple((numel, experts, k) for (numel, experts), k in counts.items())
