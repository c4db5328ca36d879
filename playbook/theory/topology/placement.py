"""Which mesh axis lands on which level of a topology: a mesh order (fastest axis first) lays the
ranks out, and each axis's groups span the levels its stride and degree reach.

Rank r of a layout dp × tp × pp × cp has one index per axis; the axis listed first varies fastest
(stride 1), each next one's stride is the product of the degrees before it. Megatron-LM's
tp-cp-(ep)-dp-pp (Narayanan et al. 2021, arXiv:2104.04473, §3.2; ``playbook.dims``) and Llama 3's
tp-cp-pp-dp (Dubey et al. 2024, arXiv:2407.21783, §3.3.2) are two of :data:`ORDERS`; the others put
cp on the fastest link (ring attention's passes every layer), dp inside cp, pp inside the node, or
dp first (ZeRO-3's per-micro-batch gathers on NVLink). ep is carved from the innermost of cp and dp
(as ``playbook.dims`` carves it from dp·cp), so its stride is theirs.

Each axis pays its collectives where its group sits (``theory.topology.collectives``): tp an
all-gather / reduce-scatter, dp an all-reduce (or reduce-scatter and all-gather) over its dp·cp
ranks, ep an all-to-all, cp and pp sends in a ring. Pure: no torch.
"""

from __future__ import annotations

import functools

from playbook.theory.topology import collectives as coll
from playbook.theory.topology.levels import Level, Topology

ORDERS = ("tp-cp-dp-pp", "tp-cp-pp-dp", "cp-tp-dp-pp", "tp-dp-cp-pp", "tp-pp-cp-dp", "dp-tp-cp-pp")
AXES = ("tp", "cp", "dp", "pp")
OP = {"tp": "all_gather", "cp": "send", "ep": "all_to_all", "pp": "send", "dp": "all_reduce"}


def check_order(order: str) -> list[str]:
    axes = order.split("-")
    if order not in ORDERS:
        raise ValueError(f"mesh order must be one of {', '.join(ORDERS)}; got {order!r}")
    return axes


def strides(order: str, degrees: dict[str, int]) -> dict[str, int]:
    """{axis: stride} for ``order``: the product of the degrees of the axes before it; ep's is the
    innermost of cp and dp's that is more than one rank (cp's when both are one)."""
    out, below = {}, 1
    for a in check_order(order):
        out[a] = below
        below *= degrees.get(a, 1)
    data = [a for a in check_order(order) if a in ("cp", "dp") and degrees.get(a, 1) > 1]
    out["ep"] = out[data[0]] if data else out["cp"]
    return out


def axis_group(axis: str, order: str, degrees: dict[str, int]) -> list[tuple[int, int]]:
    """(degree, stride) of each mesh axis in one group of ``axis``: dp's group is its dp·cp ranks."""
    s = strides(order, degrees)
    if axis == "dp":
        return [(degrees["dp"], s["dp"]), (degrees.get("cp", 1), s["cp"])]
    return [(degrees.get(axis, 1), s[axis])]


def axis_levels(topology: Topology, axis: str, order: str, degrees: dict[str, int]) -> list[tuple[Level, float]]:
    """(level, k) of each level one group of ``axis`` spans, innermost first."""
    return coll.product_levels(topology, axis_group(axis, order, degrees))


def axis_price(topology: Topology, axis: str, order: str, degrees: dict[str, int]) -> coll.Cost:
    """What one of ``axis``'s collectives costs (α, β) where its group sits, in the topology's mode."""
    parts = axis_levels(topology, axis, order, degrees)
    op = OP[axis]
    if op == "send":
        return coll.slowest_hop(topology, parts, min(s for _, s in axis_group(axis, order, degrees)))
    if topology.collectives == "flat":
        return coll.flat(op, parts)
    return coll.all_to_all(parts) if op == "all_to_all" else coll.hierarchical(op, parts)


def axis_link(topology: Topology, axis: str, order: str, degrees: dict[str, int]) -> tuple[float, float, str]:
    """:func:`_axis_link`, remembered: a search asks for the same few groups thousands of times."""
    return _axis_link(topology, axis, order, tuple(sorted(degrees.items())))


@functools.lru_cache(maxsize=65536)
def _axis_link(topology: Topology, axis: str, order: str, frozen: tuple) -> tuple[float, float, str]:
    """(bandwidth, latency, outermost level's name) with which the planner's α–β arithmetic
    (``theory.cost.comm.collective_seconds``) prices ``axis`` on this topology exactly: the level's
    own numbers where one ring at the slowest level is the model ("flat" topologies), else
    the pair that reproduces the hierarchical price (``collectives.effective_link``)."""
    degrees = dict(frozen)
    parts = axis_levels(topology, axis, order, degrees)
    if not parts:
        lv = topology.levels[0]
        return lv.effective, lv.latency, lv.name
    top = parts[-1][0]
    if topology.collectives == "flat":  # the two-level profiles' numbers, as they are
        return top.effective, top.latency, top.name
    n = round(_members(parts))
    op = OP[axis]
    bw, lat = coll.effective_link(axis_price(topology, axis, order, degrees), op, 2 if op == "send" else n)
    return bw, lat, top.name


def _members(parts: list[tuple[Level, float]]) -> float:
    out = 1.0
    for _, k in parts:
        out *= k
    return out


def placement(topology: Topology, order: str, degrees: dict[str, int]) -> dict[str, dict]:
    """{axis: its group's size, stride, the levels it spans ({level: k}) and the outermost one}
    for every axis of more than one rank (dp: when dp·cp > 1; ep when it is)."""
    d = {a: degrees.get(a, 1) for a in ("dp", "tp", "pp", "cp", "ep")}
    s = strides(order, d)
    out = {}
    for axis in ("tp", "cp", "ep", "pp", "dp"):
        size = d["dp"] * d["cp"] if axis == "dp" else d[axis]
        if size == 1:
            continue
        parts = axis_levels(topology, axis, order, d)
        out[axis] = {
            "ranks": size,
            "stride": s[axis],
            "levels": {lv.name: k for lv, k in parts},
            "outermost": parts[-1][0].name if parts else topology.levels[0].name,
            "op": OP[axis],
        }
    return out


def level_axes(topology: Topology, order: str, degrees: dict[str, int]) -> dict[str, list[str]]:
    """{level: the axes whose groups cross it}, innermost level first (every level listed)."""
    where = placement(topology, order, degrees)
    return {lv.name: [a for a, p in where.items() if lv.name in p["levels"]] for lv in topology.levels}
