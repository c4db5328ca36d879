"""Topology past the node (chapters 8 and 8b): a cluster's communication domains as levels
(``levels``), collectives priced on them (``collectives``), and which mesh axis lands on which level
(``placement``). The planner priced on a topology is ``playbook.theory.plan.placed``. Pure: no torch.

What the chapters use: ``load_topology``, ``from_hardware``, ``storage_bandwidth``, ``seconds``,
``group_levels``, ``hierarchical``, ``flat``, ``ORDERS``, ``placement``, ``level_axes``.
"""

from playbook.theory.topology.collectives import Cost, flat, group_levels, hierarchical, price, seconds
from playbook.theory.topology.levels import Level, Topology, from_hardware, load_topology, presets, storage_bandwidth
from playbook.theory.topology.placement import ORDERS, level_axes, placement

__all__ = [
    "ORDERS",
    "Cost",
    "Level",
    "Topology",
    "flat",
    "from_hardware",
    "group_levels",
    "hierarchical",
    "level_axes",
    "load_topology",
    "placement",
    "presets",
    "price",
    "seconds",
    "storage_bandwidth",
]
