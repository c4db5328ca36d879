"""ZeRO on a hybrid mesh, exactly as ``parallel.zero.zero`` lays it out: which flat units a rank holds,
over which group each is sharded, and what that costs in bytes held and bytes sent.

Rajbhandari et al. 2019 (*ZeRO*, arXiv:1910.02054), §5 and §7, per unit of numel elements padded
to a multiple of its group size N: stage 1 keeps the optimizer states of one N-th, stage 2 the
gradients too, stage 3 the weights too; a step reduce-scatters the gradients and all-gathers the
weights (twice under stage 3: before the forward and again before the backward). On the mesh
(torchtitan's FSDP over dp×cp; DeepSpeed-MoE, Rajbhandari et al. 2022, §5.2, for the experts):

- a dense unit (embedding, a block without its routed experts, final norm + head) is sharded over
  the dp×cp ranks that hold the same weights, each tp rank sharding its own slices;
- each routed expert is a unit of its own, sharded over the ``ep_replica`` ranks that hold the same
  experts (dp·cp/ep of them; none when ep = dp·cp: each rank then keeps its whole unit), so that an
  expert no token reached can be left to AdamW without a gradient, as in one process.

Pure arithmetic: ``theory.hybrid.hybrid`` reads it for ``comm_per_axis`` and ``memory_per_rank``.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.cost.comm import sent_bytes
from playbook.theory.pp.rank_params import rank_units
from playbook.theory.zero.zero import padded

FP32 = 4


def data_axis(dims: ParallelDims) -> str:
    """The name of the axis that holds replicated weights (dp, cp, or dp×cp; dp when neither splits)."""
    parts = [a for a in ("dp", "cp") if dims.size(a) > 1]
    return "×".join(parts) if len(parts) == 2 else (parts[0] if parts else "dp")


def flat_units(cfg: ModelConfig, dims: ParallelDims, ranges: list[tuple[int, int]]) -> list[tuple[str, int, int, str]]:
    """This rank's flat units as (name, numel, group size N, axis) for the pieces of its pipeline
    chunks ``ranges`` ([start, end) each; piece 0 the embedding, 1..L the blocks, L + 1 the head;
    ``theory.pp.rank_params.chunk_ranges``): its units (``theory.pp.rank_params.rank_units``: the
    embedding, each block with 1/tp of its matrices, norms whole, an MoE block's router and shared
    experts whole, then each of its E/ep routed experts, one unit each (``parallel.zero.flat_unit.Fed``);
    the final norm and head, the norm only when a tied head's embedding is on this rank: one weight,
    in the embedding's unit), the routed experts over their replicas, every other unit over dp×cp."""
    dense, experts = unit_group(dims, False), unit_group(dims, True)
    return [(u.name, u.numel, *(experts if u.experts else dense)) for u in rank_units(cfg, dims, ranges)]


def unit_group(dims: ParallelDims, experts: bool) -> tuple[int, str]:
    """(group size N, axis) a unit's flat buffer is sharded over: a routed expert's over its
    replicas (dp×cp / ep, ``ep_replica``), every other unit over dp×cp (``data_axis``)."""
    n, dense_axis = dims.dp * dims.cp, data_axis(dims)
    if not experts:
        return n, dense_axis
    return n // dims.ep, "ep_replica" if dims.ep > 1 else dense_axis


def zero_comm(units: list[tuple[str, int, int, str]], zero: int, weight_gathers: int | None = None) -> dict[str, float]:
    """Bytes sent per step by axis: each unit's gradients reduce-scattered once and its weights
    all-gathered once (stages 1-2, after AdamW) or ``weight_gathers`` times (stage 3: 2, forward and
    backward; 1 in a pipeline, where they stay gathered for the whole step)."""
    gathers = weight_gathers if zero == 3 and weight_gathers is not None else (2 if zero == 3 else 1)
    out: dict[str, float] = {}
    for _, numel, n, axis in units:
        if n > 1:
            size = FP32 * padded(numel, n)
            sent = sent_bytes("reduce_scatter", size, n) + gathers * sent_bytes("all_gather", size, n)
            out[axis] = out.get(axis, 0.0) + sent
    return out


def zero_memory(units: list[tuple[str, int, int, str]], zero: int) -> dict[str, int]:
    """Bytes held by category (fp32 AdamW): weights whole (stages 0-2) or one shard (3); gradients
    whole (0-1) or one shard (2-3), after the step's reduction; AdamW's two moments of what the
    rank updates (everything at stage 0, its shard from stage 1 on) plus a 4-byte step per unit."""
    whole = sum(padded(numel, n) for _, numel, n, _ in units)
    shard = sum(padded(numel, n) // n for _, numel, n, _ in units)
    return {
        "params": FP32 * (whole if zero < 3 else shard),
        "grads": FP32 * (whole if zero <= 1 else shard),
        "optimizer": 2 * FP32 * (whole if zero == 0 else shard) + 4 * len(units),
    }


def pipeline_peak_state(units: list[tuple[str, int, int, str]], zero: int) -> int:
    """Bytes of weights, gradients and AdamW states a pipeline stage holds after its last backward,
    before the reduction (``parallel.zero.pipeline``): whole flat weights and whole flat gradients
    for every stage 1-3 (the m micro-batches need both), AdamW's shard, and under ZeRO-3 the slice
    kept between steps on top of the gathered weights. Not less than ZeRO-1's for any stage."""
    shard = sum(padded(numel, n) // n for _, numel, n, _ in units)
    state = zero_memory(units, 1)  # whole weights and gradients, AdamW's shard
    return state["params"] + state["grads"] + state["optimizer"] + (FP32 * shard if zero == 3 else 0)
