"""The planner priced on a topology (chapters 8 §2 and 8b): the same search (``theory.plan.planner``),
the same step (``theory.plan.cost``), with each axis's collectives priced where its group sits on
the topology's levels (``theory.topology.placement``), over any of the mesh orders of
``theory.topology.ORDERS``. Nothing here costs a step itself: a :class:`PlacedHardware` answers
``theory.plan.cost.link`` with the level's (bandwidth, latency), which reproduce the hierarchical
collective exactly in the α–β arithmetic the planner already does.

A two-level hardware profile converted with ``theory.topology.from_hardware`` plans exactly as the
profile does (its collectives are "flat"; ``tests/theory/topology/test_two_level.py``). Pure: no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.plan.layout import cost_layout
from playbook.theory.plan.planner import plan
from playbook.theory.plan.search import Layout, Plan
from playbook.theory.topology.levels import Topology
from playbook.theory.topology.placement import ORDERS, axis_link, check_order, level_axes, placement


@dataclass(frozen=True)
class PlacedHardware(Hardware):
    """A hardware profile whose GPUs sit on ``topology``: ``devices_per_node`` is the topology's
    scale-up domain (``Topology.node_gpus``), ``storage_bandwidth`` its storage level's (per node, for a
    checkpoint's save time, ``theory.life.checkpoint``), and every axis's link comes from its placement."""

    topology: Topology | None = None

    def axis_link(self, axis: str, order: str, degrees: dict[str, int]) -> tuple[float, float, str]:
        return axis_link(self.topology, axis, order, degrees)


def on_topology(topology: Topology, hw: Hardware | None = None) -> PlacedHardware:
    """``hw`` (default: the topology's ``hardware`` profile) placed on ``topology``."""
    hw = Hardware.preset(topology.hardware) if hw is None else hw
    own = {f.name: getattr(hw, f.name) for f in dataclasses.fields(Hardware)}
    storage = topology.storage or hw.storage_bandwidth  # the topology's checkpoint path feeds theory.life's save time
    return PlacedHardware(
        **(own | {"devices_per_node": topology.node_gpus, "storage_bandwidth": storage}), topology=topology
    )


def _check_gpus(topology: Topology, gpus: int) -> None:
    if gpus > topology.gpus:
        raise ValueError(
            f"--gpus {gpus} is more than topology {topology.name!r} holds ({topology.gpus}); try --gpus {topology.gpus}"
        )


def plan_on(
    cfg: ModelConfig,
    topology: Topology,
    *,
    gpus: int,
    seq_len: int,
    global_batch: int,
    mesh_order: str = ORDERS[0],
    hw: Hardware | None = None,
    **options,
) -> Plan:
    """``theory.plan.planner.plan`` on ``topology`` with ``mesh_order`` (any of ``ORDERS``)."""
    check_order(mesh_order)
    _check_gpus(topology, gpus)
    placed = on_topology(topology, hw)
    options.pop("gpus_per_node", None)  # the topology's scale-up domain is the node
    return plan(cfg, placed, gpus=gpus, seq_len=seq_len, global_batch=global_batch, mesh_order=mesh_order, **options)


def plan_orders(
    cfg: ModelConfig, topology: Topology, *, orders: tuple[str, ...] = ORDERS, **kw
) -> list[tuple[str, Plan]]:
    """(mesh order, its plan) for every order, the order whose best layout is fastest first."""
    plans = [(o, plan_on(cfg, topology, mesh_order=o, **kw)) for o in orders]
    return sorted(plans, key=lambda op: op[1].candidates[0].cost.total)


def ranking(cfg: ModelConfig, topology: Topology, *, top: int = 5, **kw) -> list[dict]:
    """The ``top`` fastest layouts over every mesh order, each with its fastest order (``orders``: every
    order that gives it the same time), its step's exposed parts and where its axes sit: a table's
    rows, fastest first."""
    rows: dict[str, dict] = {}
    for order, p in plan_orders(cfg, topology, **kw):
        for c in p.candidates[:top]:
            seen = rows.get(str(c.layout))
            if seen is not None and seen["step_s"] <= c.cost.total:
                seen["orders"] += [order] if seen["step_s"] == c.cost.total else []
                continue
            rows[str(c.layout)] = {
                "layout": str(c.layout),
                "mesh_order": order,
                "step_s": c.cost.total,
                "mfu": c.mfu,
                "exposed": {a: e for a, (_, e) in c.cost.axes.items()},
                "placement": {a: w["outermost"] for a, w in placement_of(topology, c.layout, order).items()},
                "orders": [order],
                "candidate": c,
            }
    return sorted(rows.values(), key=lambda r: (r["step_s"], ORDERS.index(r["mesh_order"])))[:top]


def placement_of(topology: Topology, layout: Layout, mesh_order: str = ORDERS[0]) -> dict[str, dict]:
    """Where each axis of ``layout`` sits (``theory.topology.placement.placement``)."""
    return placement(topology, mesh_order, layout.degrees)


def crossings(topology: Topology, layout: Layout, mesh_order: str = ORDERS[0]) -> dict[str, list[str]]:
    """{level: the axes of ``layout`` whose groups cross it}."""
    return level_axes(topology, mesh_order, layout.degrees)


def cost_on(
    cfg: ModelConfig, topology: Topology, layout: Layout, *, seq_len: int, mesh_order: str = ORDERS[0], hw=None, **kw
) -> dict:
    """``theory.plan.layout.cost_layout`` of one layout on ``topology``, with its placement."""
    check_order(mesh_order)
    _check_gpus(topology, layout.dp * layout.tp * layout.pp * layout.cp)
    placed = on_topology(topology, hw)
    kw.pop("gpus_per_node", None)
    out = cost_layout(cfg, placed, layout, seq_len=seq_len, mesh_order=mesh_order, **kw)
    return out | {
        "topology": topology.name,
        "mesh_order": mesh_order,
        "placement": placement_of(topology, layout, mesh_order),
    }


def best_by_tp(cfg: ModelConfig, topology: Topology, *, mesh_order: str = ORDERS[0], **kw) -> dict[int, dict]:
    """{tp: the fastest layout with that tp degree}, each with its step, tp's exposed seconds and the
    level tp's groups reach: how far tensor parallelism pays on this topology's links."""
    p = plan_on(cfg, topology, mesh_order=mesh_order, **kw)
    out: dict[int, dict] = {}
    for c in p.candidates:  # fastest first: the first of each tp is its best
        if c.layout.tp not in out:
            where = placement_of(topology, c.layout, mesh_order)
            out[c.layout.tp] = {
                "layout": str(c.layout),
                "step_s": c.cost.total,
                "tp_exposed_s": c.cost.axes.get("tp", (0.0, 0.0))[1],
                "tp_comm_s": c.cost.axes.get("tp", (0.0, 0.0))[0],
                "tp_level": where["tp"]["outermost"] if "tp" in where else "one GPU",
            }
    return dict(sorted(out.items()))
