"""The bytes behind the planner's step time, per axis, from the functions the shrunk replays verify.

``theory.plan.cost`` times what these count; ``axis_bytes`` adds them up for one layout, so a test can put
the planner's bytes beside ``theory.hybrid.hybrid.comm_per_axis`` and a replay's trace (chapter 8b §2):

- **cp**: ring attention's K/V blocks and their gradients per layer and micro-batch, as
  ``theory.cp.comm_bytes_per_layer`` counts them for the rank's kv_heads/tp heads (the gradients
  travel in fp32 whatever the activations' dtype), and the K/V sent again when recomputation
  reruns the attention core (``theory.hybrid.recompute.cp_replay_bytes_per_layer``);
- **pp**: one [b, s/cp/tp, h] activation forward and one gradient back per boundary crossed
  (Megatron's sequence-parallel send), as many as the busiest rank of the schedule sends
  (``pp_sends``, what ``theory.pp.schedules``' lists give);
- **dp**: the most loaded pipeline stage's flat units (``theory.hybrid.zero.flat_units``: dense
  weights over dp·cp, routed experts over their dp·cp/ep replicas), padded to their group as ZeRO
  pads them (``theory.zero.zero.padded``); ZeRO 0 all-reduces them unpadded;
- **tp**: ``theory.plan.cost.TP_COLLECTIVES_PER_LAYER``, held to ``theory.tp.tp.step_collectives`` by a test.

ep's all-to-all follows the routing, which only a run has: the planner assumes a balanced one.
"""

from __future__ import annotations

import functools

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.cost.comm import sent_bytes
from playbook.theory.cp import comm_bytes_per_layer, kv_shard_bytes
from playbook.theory.pp.rank_params import chunk_ranges, unit_sizes
from playbook.theory.hybrid.recompute import cp_replay_bytes_per_layer, local_heads
from playbook.theory.hybrid.zero import unit_group
from playbook.theory.plan.schedule import boundary_crossings, stage_placement
from playbook.theory.pp.schedules import V_SCHEDULES
from playbook.theory.zero.zero import padded

FP32 = 4


def pp_sends(schedule: str, p: int, v: int = 1) -> int:
    """Point-to-point sends per micro-batch of the busiest pipeline rank, both directions: an inner
    rank sends forward and back once per boundary its chunks cross (2, 2v interleaved, 4 on a V);
    with p = 2 no rank is inner: 1 (1F1B), 2v − 1 (interleaved), 2 (a V, whose turn stays local)."""
    if p == 1:
        return 0
    k = boundary_crossings(schedule, v)
    if p > 2:
        return 2 * k
    return 2 if schedule in V_SCHEDULES else 2 * k - 1


def pp_message_bytes(cfg: ModelConfig, *, micro_batch: int, seq_len: int, cp: int, tp: int, dtype_bytes: int) -> int:
    """One pipeline send: [b, s/cp, h], split over tp under sequence parallelism."""
    return dtype_bytes * micro_batch * (seq_len // cp // tp) * cfg.hidden


_local = functools.lru_cache(maxsize=64)(local_heads)  # cp_layer asks per b and recompute; replace re-validates


@functools.lru_cache(maxsize=4096)
def cp_layer(cfg: ModelConfig, *, micro_batch: int, seq_len: int, cp: int, tp: int, recompute: str, dtype_bytes: int):
    """(bytes sent, ring passes, bytes of one pass) per layer and micro-batch under cp (module docstring)."""
    local = _local(cfg, tp)
    ring = comm_bytes_per_layer(
        local, seq_len=seq_len, micro_batch=micro_batch, cp=cp, variant="ring", dtype_bytes=dtype_bytes
    )
    dims = ParallelDims(tp=1, cp=cp)  # ``local`` is already one tp rank's
    sizes = dict(seq_len=seq_len, micro_batch=micro_batch, variant="ring", recompute=recompute)
    again = cp_replay_bytes_per_layer(local, dims, **sizes) * dtype_bytes / FP32  # counted in fp32 there
    one = kv_shard_bytes(local, seq_len=seq_len, micro_batch=micro_batch, cp=cp, dtype_bytes=dtype_bytes)
    passes = 3 * (cp - 1) + (cp - 1) * (recompute != "none")
    return ring.get("batch_isend_irecv", 0.0) + again, passes, one


@functools.lru_cache(maxsize=4096)
def dp_groups(
    cfg: ModelConfig, *, dp: int, tp: int, pp: int, cp: int, ep: int, placement: str = "1f1b"
) -> tuple[tuple[int, int, int], ...]:
    """(elements, elements padded to the group, group size) of each group whose gradients are
    reduced, on the pipeline rank (first or last) that holds the most: stages as 1F1B places them,
    or as a V does (``placement`` "zb-v" or "dualpipe-v": rank 0 holds the embedding and the head)."""
    dims = ParallelDims(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
    v = 2 if placement in V_SCHEDULES else 1
    best: tuple[int, tuple] = (-1, ())
    for stage in sorted({0, pp - 1}):
        groups: dict[str, list[int]] = {}
        # the units of ``theory.hybrid.zero.flat_units``, counted: padding is per unit, so a size
        # seen k times (a layer's routed experts) adds k paddings
        ranges = tuple(chunk_ranges(cfg, pp, stage, placement, v))
        for numel, experts, count in unit_sizes(cfg, tp, ep, ranges):
            n, axis = unit_group(dims, experts)
            g = groups.setdefault(axis, [0, 0, n])
            g[0], g[1] = g[0] + count * numel, g[1] + count * padded(numel, n)
        total = sum(g[0] for g in groups.values())
        if total > best[0]:
            best = (total, tuple(tuple(g) for g in groups.values()))
    return best[1]


def dp_bytes(cfg: ModelConfig, *, zero: int, grad_bytes: int, weight_bytes: int, placement: str, **degrees) -> float:
    """Bytes the most loaded stage's rank sends per step on its data axes: an all-reduce of its
    gradients (ZeRO 0) or a reduce-scatter of them and an all-gather of the weights (ZeRO 1; ZeRO 2
    and 3 repeat them per micro-batch in the planner's time, as ``theory.plan.dp`` says)."""
    out = 0.0
    for numel, pad, n in dp_groups(cfg, **degrees, placement=placement):
        if n > 1:
            if zero == 0:
                out += sent_bytes("all_reduce", grad_bytes * numel, n)
            else:
                out += sent_bytes("reduce_scatter", grad_bytes * pad, n) + sent_bytes(
                    "all_gather", weight_bytes * pad, n
                )
    return out


def axis_bytes(
    cfg: ModelConfig,
    *,
    seq_len: int,
    dp: int,
    tp: int,
    pp: int,
    cp: int,
    ep: int = 1,
    zero: int,
    micro_batch: int,
    microbatches: int,
    recompute: str = "none",
    schedule: str = "1f1b",
    v: int = 1,
    dtype_bytes: int = 2,
    grad_bytes: int = 2,
) -> dict[str, float]:
    """Bytes per step the planner counts on each axis but tp and ep: cp and pp for the busiest rank,
    dp for the most loaded stage, once per step (ZeRO 0 and 1; 2 and 3 repeat it per micro-batch)."""
    b, m, out = micro_batch, microbatches, {}
    if cp > 1:
        sent, _, _ = cp_layer(
            cfg, micro_batch=b, seq_len=seq_len, cp=cp, tp=tp, recompute=recompute, dtype_bytes=dtype_bytes
        )
        out["cp"] = m * -(-cfg.n_layers // pp) * sent
    if pp > 1:
        msg = pp_message_bytes(cfg, micro_batch=b, seq_len=seq_len, cp=cp, tp=tp, dtype_bytes=dtype_bytes)
        out["pp"] = m * pp_sends(schedule, pp, v) * msg
    if dp * cp > 1:
        degrees = dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
        out["dp"] = dp_bytes(
            cfg,
            zero=zero,
            grad_bytes=grad_bytes,
            weight_bytes=dtype_bytes,
            placement=stage_placement(schedule),
            **degrees,
        )
    return out


def replay_bytes(shrunk) -> dict[str, float]:
    """:func:`axis_bytes` of a shrunk replay (``theory.plan.shrink.Shrunk``: its model, degrees, ZeRO stage,
    micro-batches and schedule), in fp32 as its ranks run it and by the replay's axis names, to put
    beside what they measure."""
    d = shrunk.dims
    out = axis_bytes(
        ModelConfig.preset(shrunk.model),
        seq_len=shrunk.seq_len,
        dp=d.dp,
        tp=d.tp,
        pp=d.pp,
        cp=d.cp,
        ep=d.ep,
        zero=shrunk.zero,
        micro_batch=shrunk.global_batch // (d.dp * shrunk.m),
        microbatches=shrunk.m,
        schedule=shrunk.schedule,
        v=shrunk.virtual_stages,
        dtype_bytes=FP32,
        grad_bytes=FP32,
    )
    if d.dp == 1 and "dp" in out:  # the replay's data axis is cp itself: its gradients travel there
        out["cp"] += out.pop("dp")
    return out


def busiest(per_rank: list[dict]) -> dict[str, float]:
    """Per axis, the most any rank sends (``{axis: bytes}`` per rank), the data axis named dp or dp×cp
    (``theory.hybrid.zero.data_axis``) as "dp"; with dp = 1 the data axis is cp, its gradients counted there."""
    out: dict[str, float] = {}
    for sent in per_rank:
        for axis, b in sent.items():
            key = "dp" if axis in ("dp", "dp×cp") else axis
            out[key] = max(out.get(key, 0.0), b)
    return out
