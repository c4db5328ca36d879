"""Serving layouts on a topology (``playbook serve-plan --topology``): ``theory.serving.layouts``'s rows,
each tp group's all-reduce priced at the (bandwidth, latency) of the levels it spans
(``theory.topology.placement.axis_link``: the hierarchical all-reduce, exactly, in the serving
roofline's α–β arithmetic), and the level it reaches. Pure: no torch.
"""

from __future__ import annotations

import dataclasses

from playbook.config import ModelConfig, divisors
from playbook.hardware import Hardware
from playbook.theory.serving.layouts import serving_layout
from playbook.theory.serving.serving import BY_SIZE
from playbook.theory.topology.levels import Topology
from playbook.theory.topology.placement import ORDERS, axis_link


def serve_layouts_on(
    cfg: ModelConfig, topology: Topology, *, gpus: int, context: int, latency=None, **options
) -> list[dict]:
    """Every tp × dp of ``gpus`` with tp dividing the heads and within the topology's scale-up domain
    whose replica fits, smallest tp first; ``latency`` ``BY_SIZE``: the library's choice by size."""
    if gpus > topology.gpus:
        raise ValueError(
            f"--gpus {gpus} is more than topology {topology.name!r} holds ({topology.gpus}); try --gpus {topology.gpus}"
        )
    hw = Hardware.preset(topology.hardware)
    rows = []
    for tp in divisors(gpus):
        if cfg.n_heads % tp or tp > topology.node_gpus:
            continue
        bw, lat, level = axis_link(topology, "tp", ORDERS[0], dict(tp=tp, dp=gpus // tp))
        placed = dataclasses.replace(
            hw, intra_node_bandwidth=bw, intra_node_latency=lat, devices_per_node=topology.node_gpus
        )
        step = BY_SIZE if latency == BY_SIZE else lat
        try:
            row = serving_layout(cfg, placed, tp=tp, dp=gpus // tp, context=context, latency=step, **options)
        except ValueError:
            continue  # the weights do not fit at this tp
        rows.append(row | {"tp_level": level if tp > 1 else "one GPU"})
    return rows
