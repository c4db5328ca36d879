"""Collectives priced on a topology (``theory.topology.levels``): per level, across levels, point to point.

Each price is a :class:`Cost`, α + β·S seconds for S bytes (Hockney 1994, "The communication
challenge for MPP", Parallel Computing 20(3)), so that one (bandwidth, latency) pair reproduces it
exactly (:func:`effective_link`, what the planner's α–β arithmetic takes).

- **Ring, one level** of k GPUs (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms
  for clusters of workstations", JPDC 69(2)): all-reduce 2S(k−1)/k bytes sent per GPU in 2(k−1)
  steps; all-gather and reduce-scatter S(k−1)/k in k−1 (S the full buffer); ``playbook.theory.cost.comm``.
- **Tree all-reduce, one level**: NCCL's double binary tree (Sanders, Speck & Träff 2009, "Two-tree
  algorithms for full bandwidth broadcast, reduction and scan", Parallel Computing 35(12); NCCL 2.4,
  Jeaugey 2019): 2S/B on the wire, pipelined, in 2·⌈log2 k⌉ latency steps instead of 2(k−1).
- **Hierarchical, across levels**, as NCCL and Horovod do on multi-node jobs (Sergeev & Del Balso 2018,
  arXiv:1802.05799; Jia et al. 2018, arXiv:1807.11205, hierarchical all-reduce): a reduce-scatter
  inside the innermost level, then inside the next on the 1/k₁ shard, ..., an all-reduce across the
  outermost on the smallest shard, then the all-gathers back. Level j moves S/(k₁···k_{j−1}) bytes.
  All-gather and reduce-scatter alone are half of it.
- **Flat**: the whole ring priced at the slowest level the group crosses (the two-level hardware
  profiles' model, kept for them, ``levels.from_hardware``).
- **All-to-all across levels**: every GPU sends S/n to each of the n − 1 others; the bytes that
  leave the unit of level j−1 for another unit of level j cross level j, all levels at once on
  their own links, so the slowest level's share bounds it; an oversubscribed level gives each GPU
  bandwidth / oversubscription (every GPU of the job sending at once).
- **Point to point by path**: the lowest level whose unit holds both GPUs sets bandwidth (the slowest
  link on the way up) and latency; on a rail fabric a GPU reaching another node's GPU of another
  local rank goes over the link level first to the GPU on the right rail (NCCL's PXN), one more hop.

Left out: congestion from other jobs sharing the fabric, adaptive routing and ECMP hash collisions
(every flow gets its share of the oversubscribed bandwidth, no worse), in-network reduction
(SHARP), NCCL's choice of algorithm and channel count by message size, and the node's PCIe path
between GPU and NIC. Pure arithmetic, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from playbook.theory.cost.comm import ring_steps, sent_bytes
from playbook.theory.topology.levels import SCALE_UP, Level, Topology

REDUCING = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class Cost:
    """α + β·S seconds for S bytes."""

    alpha: float  # seconds
    beta: float  # seconds per byte

    def seconds(self, size: float) -> float:
        return self.alpha + self.beta * size

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.alpha + other.alpha, self.beta + other.beta)


def group_levels(topology: Topology, n: int, stride: int = 1) -> list[tuple[Level, float]]:
    """(level, k) for each level a group of ``n`` GPUs ``stride`` ranks apart spans, innermost first:
    k of the group's GPUs in one unit of that level for each one in a unit below (their product is n).
    Ranks fill the levels in order (rank r in unit r // capacity of every level)."""
    return product_levels(topology, [(n, stride)])


def product_levels(topology: Topology, axes: list[tuple[int, int]]) -> list[tuple[Level, float]]:
    """:func:`group_levels` for a group over several mesh axes at once, each (degree, stride) (the
    data axis's dp·cp ranks): in a unit of c consecutive ranks an axis of stride s takes
    min(degree, c // s) values, and the group's members there are their product."""
    span = max((d * s for d, s in axes), default=1)
    if span > topology.gpus:
        raise ValueError(
            f"a group spanning {span} ranks does not fit topology {topology.name!r}, which holds {topology.gpus} GPUs"
        )
    out, below = [], 1
    for i, lv in enumerate(topology.levels):
        members = math.prod(min(d, max(1, topology.capacity(i) // s)) for d, s in axes)
        if members > below:
            out.append((lv, members / below))
        below = members
    return out


def ring(op: str, k: float, level: Level) -> Cost:
    """Ring ``op`` over ``k`` GPUs of one level (S the full buffer)."""
    if k <= 1:
        return Cost(0.0, 0.0)
    if op not in REDUCING + ("all_to_all",):
        raise ValueError(f"ring prices {', '.join(REDUCING)} or all_to_all; got {op!r}")
    share = (2 if op == "all_reduce" else 1) * (k - 1) / k
    steps = (2 if op == "all_reduce" else 1) * (k - 1)
    return Cost(steps * level.latency, share / level.effective)


def tree_all_reduce(k: float, level: Level) -> Cost:
    """Double-binary-tree all-reduce over ``k`` GPUs of one level (module docstring)."""
    if k <= 1:
        return Cost(0.0, 0.0)
    return Cost(2 * math.ceil(math.log2(k)) * level.latency, 2 / level.effective)


def hierarchical(op: str, parts: list[tuple[Level, float]], algorithm: str = "ring") -> Cost:
    """``op`` (all-reduce, all-gather, reduce-scatter) level by level, innermost first, each level on
    the shard the levels inside it left (module docstring); ``algorithm`` "tree": the outermost
    level's all-reduce as a double binary tree."""
    if op not in REDUCING:
        raise ValueError(f"hierarchical prices {', '.join(REDUCING)}; got {op!r}")
    total, shard = Cost(0.0, 0.0), 1.0
    for j, (lv, k) in enumerate(parts):
        if op == "all_reduce" and j == len(parts) - 1:
            one = tree_all_reduce(k, lv) if algorithm == "tree" else ring("all_reduce", k, lv)
        elif op == "all_reduce":  # reduce-scatter down, all-gather back up
            one = ring("reduce_scatter", k, lv) + ring("all_gather", k, lv)
        else:
            one = ring(op, k, lv)
        total += Cost(one.alpha, one.beta * shard)
        shard /= k
    return total


def flat(op: str, parts: list[tuple[Level, float]]) -> Cost:
    """One ring over the whole group at the slowest (outermost) level it crosses."""
    if not parts:
        return Cost(0.0, 0.0)
    n = math.prod(k for _, k in parts)
    lv = parts[-1][0]
    return Cost(ring_steps(op, round(n)) * lv.latency, sent_bytes(op, 1.0, round(n)) / lv.effective)


def all_to_all(parts: list[tuple[Level, float]]) -> Cost:
    """All-to-all of S bytes per GPU across levels (module docstring): the slowest level's share."""
    if not parts:
        return Cost(0.0, 0.0)
    n = math.prod(k for _, k in parts)
    beta, alpha, below = 0.0, 0.0, 1.0
    for lv, k in parts:
        peers = below * k - below  # peers reached across this level and not below it
        beta = max(beta, peers / n / lv.effective)
        alpha += peers * lv.latency
        below *= k
    return Cost(alpha, beta)


def point_to_point(topology: Topology, a: int, b: int) -> Cost:
    """A send from rank ``a`` to rank ``b``: the path up to the lowest level holding both."""
    if a == b:
        return Cost(0.0, 0.0)
    for i, lv in enumerate(topology.levels):
        if a // topology.capacity(i) == b // topology.capacity(i):
            bandwidth = min(x.effective for x in topology.levels[: i + 1])
            latency = lv.latency
            node = topology.node_gpus
            if topology.rails and lv.kind not in SCALE_UP and a % node != b % node:
                latency += topology.levels[0].latency  # over NVLink to the GPU on the destination's rail (PXN)
            return Cost(latency, 1 / bandwidth)
    raise ValueError(f"ranks {a} and {b}: topology {topology.name!r} holds {topology.gpus} GPUs")


def slowest_hop(topology: Topology, parts: list[tuple[Level, float]], stride: int = 1) -> Cost:
    """One step of a ring of sends (cp's passes, pp's stage to stage): every pair sends at once, so
    the pair that crosses the outermost level the group spans sets the step; on a rail fabric, a
    pair of different local ranks adds the hop to the right rail (PXN)."""
    if not parts:
        return Cost(0.0, 0.0)
    top = parts[-1][0]
    inside = topology.levels[: topology.levels.index(top) + 1]
    latency = top.latency
    if topology.rails and top.kind not in SCALE_UP and stride % topology.node_gpus:
        latency += topology.levels[0].latency
    return Cost(latency, 1 / min(x.effective for x in inside))


def price(topology: Topology, op: str, n: int, stride: int = 1, algorithm: str = "ring") -> Cost:
    """``op`` over a group of ``n`` GPUs ``stride`` ranks apart, as the topology's ``collectives``
    mode prices it: "hierarchical" (shipped topologies) or "flat" (converted two-level profiles)."""
    parts = group_levels(topology, n, stride)
    if op == "send":
        return slowest_hop(topology, parts, stride)
    if op == "all_to_all":
        return flat(op, parts) if topology.collectives == "flat" else all_to_all(parts)
    if topology.collectives == "flat":
        return flat(op, parts)
    return hierarchical(op, parts, algorithm)


def seconds(topology: Topology, op: str, size: float, n: int, stride: int = 1, algorithm: str = "ring") -> float:
    """Seconds of ``op`` on ``size`` bytes (the full buffer; a send's message) over the group."""
    return price(topology, op, n, stride, algorithm).seconds(size)


def effective_link(cost: Cost, op: str, n: int) -> tuple[float, float]:
    """(bandwidth, latency) with which ``theory.cost.comm.collective_seconds(op, S, n, ...)`` gives
    ``cost.seconds(S)`` for every S: the planner's α–β arithmetic, unchanged, on a topology."""
    if n == 1 or cost.beta == 0:
        return math.inf, 0.0
    steps = 1 if op == "send" else ring_steps(op, n)
    sent = 1.0 if op == "send" else sent_bytes(op, 1.0, n)
    return sent / cost.beta, cost.alpha / steps
