"""Chapter 8's topology figure: a job's GPUs along x, the topology's levels stacked above them
(innermost at the bottom, one box per unit: an NVLink domain, a PCIe switch, a leaf), and each mesh
axis's group drawn on it: the group holding rank 0 marked on its GPUs, and a bar at the outermost
level it crosses, over the ranks it spans. Which axis pays which level is read off the bars.

Pure: ``theory.topology.placement`` decides, this draws (data -> plotly figure).
"""

from __future__ import annotations

import itertools

import plotly.graph_objects as go

from playbook.theory.topology.levels import Topology
from playbook.theory.topology.placement import axis_group, placement
from playbook.viz.figures import figure_layout
from playbook.viz.mesh_layout import AXIS_COLORS

_OFFSET = {"tp": -0.3, "cp": -0.15, "ep": 0.0, "pp": 0.15, "dp": 0.3}


def group_ranks(axis: str, order: str, degrees: dict[str, int]) -> list[int]:
    """The ranks of the group of ``axis`` that holds rank 0 (dp: its dp·cp ranks)."""
    axes = axis_group(axis, order, degrees)
    return sorted(sum(i * s for i, (_, s) in zip(idx, axes)) for idx in itertools.product(*(range(d) for d, _ in axes)))


def level_label(topology: Topology, i: int) -> str:
    lv = topology.levels[i]
    ratio = f", {lv.oversubscription:g}:1" if lv.oversubscription > 1 else ""
    return f"{lv.name} (×{lv.size}, {lv.bandwidth / 1e9:g} GB/s{ratio})"


def topology_figure(
    topology: Topology, degrees: dict[str, int], order: str, *, gpus: int, title: str = ""
) -> go.Figure:
    """The figure of the module docstring for a layout's ``degrees`` laid out in mesh ``order``."""
    degrees = {a: degrees.get(a, 1) for a in ("dp", "tp", "pp", "cp", "ep")}
    where = placement(topology, order, degrees)
    fig = go.Figure()
    shapes = []
    for i, _ in enumerate(topology.levels):
        cap = topology.capacity(i)
        for u in range(-(-gpus // cap)):
            x0, x1 = u * cap - 0.5, min((u + 1) * cap, gpus) - 0.5
            shapes.append(
                dict(
                    type="rect",
                    x0=x0,
                    x1=x1,
                    y0=i + 0.6,
                    y1=i + 1.4,
                    line=dict(color="#888", width=1),
                    fillcolor="rgba(0,0,0,0.03)",
                    layer="below",
                )
            )
    for axis, w in where.items():
        ranks = group_ranks(axis, order, degrees)
        color = AXIS_COLORS.get(axis, "#444")
        name = f"{axis} ({w['ranks']} ranks, stride {w['stride']})"
        spans = ", ".join(f"{lv} ×{k:g}" for lv, k in w["levels"].items()) or "one GPU"
        fig.add_trace(
            go.Scatter(
                x=ranks,
                y=[_OFFSET[axis]] * len(ranks),
                mode="markers",
                name=name,
                legendgroup=axis,
                marker=dict(color=color, size=7, symbol="square"),
                hovertemplate=f"<b>{axis}</b> rank %{{x}}<br>spans {spans}<extra></extra>",
            )
        )
        top = topology.names.index(w["outermost"]) + 1
        fig.add_trace(
            go.Scatter(
                x=[ranks[0], ranks[-1]],
                y=[top + _OFFSET[axis]] * 2,
                mode="lines+markers",
                legendgroup=axis,
                showlegend=False,
                line=dict(color=color, width=5),
                hovertemplate=f"<b>{axis}</b> crosses {w['outermost']}<br>spans {spans}<extra></extra>",
            )
        )
    ticks = ["GPUs (one group per axis)"] + [level_label(topology, i) for i in range(len(topology.levels))]
    figure_layout(
        fig, title=title, height=300 + 60 * len(topology.levels), shapes=shapes, legend=dict(orientation="h", y=-0.25)
    )
    fig.update_xaxes(title="rank", range=[-1, gpus])
    fig.update_yaxes(tickvals=list(range(len(ticks))), ticktext=ticks, range=[-0.6, len(ticks) - 0.4])
    return fig


def placement_rows(topology: Topology, degrees: dict[str, int], order: str) -> list[dict]:
    """One row per axis: its group, the levels it spans and the outermost: a table's rows."""
    return [
        {
            "axis": a,
            "ranks": w["ranks"],
            "stride": w["stride"],
            "collective": w["op"].replace("_", "-"),
            "spans": ", ".join(f"{lv} ×{k:g}" for lv, k in w["levels"].items()),
            "outermost level": w["outermost"],
        }
        for a, w in placement(topology, order, degrees).items()
    ]
