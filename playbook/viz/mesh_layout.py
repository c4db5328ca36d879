"""Show where every rank of a hybrid layout sits: the rank grid (one colour per group of an axis,
thick lines between nodes), which axes' groups stay inside a node for a given rank order
(``links``), and what that costs each axis in seconds per step (``axis_seconds``). Colours of
axes and groups for the other figures.

Topology first (Narayanan et al. 2021, arXiv:2104.04473, §3.2; Llama 3, Dubey et al. 2024,
arXiv:2407.21783, §3.3.2): the axis that talks most (tp) gets the consecutive ranks of one node,
the pipeline and the data-parallel replicas the links between nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from playbook.hardware import Hardware
from playbook.dims import AXES, ParallelDims
from playbook.viz.figures import figure_layout

PALETTE = [
    "#2f6db5",
    "#e8893a",
    "#5b9a48",
    "#c94a4a",
    "#8a63b8",
    "#3aa6a0",
    "#b8860b",
    "#d36fa5",
    "#4c4c9d",
    "#9c6b30",
    "#6b8e23",
    "#7f7f7f",
]  # # dark enough for white labels
AXIS_ORDER = ("tp", "cp", "dp", "dp×cp", "pp", "ep", "ep_replica")  # how axes are listed in figures
AXIS_COLORS = {
    "tp": "#6a3d9a",
    "cp": "#d36fa5",
    "dp": "#3aa6a0",
    "dp×cp": "#1f6f6b",
    "pp": "#b8860b",
    "ep": "#9c6b30",
    "ep_replica": "#4c4c9d",
}  # # none of the memory categories' colours


def ordered_axes(keys) -> list[str]:
    """``keys`` (axis names) in the order figures list them: ``AXIS_ORDER``, then any others sorted."""
    keys = set(keys)
    return [a for a in AXIS_ORDER if a in keys] + sorted(keys - set(AXIS_ORDER))


def _where(coords: Mapping, dims: ParallelDims | None = None) -> str:
    shown = [a for a in AXES if dims is None or getattr(dims, a) > 1]
    return " ".join(f"{a}{coords[a]}" for a in shown)


# ---- the layout -----------------------------------------------------------------------------------
def groups_in_order(dims: ParallelDims, axis: str, order: Sequence[str] = AXES) -> list[list[int]]:
    """The groups along ``axis`` if ranks were numbered with ``order[0]`` fastest (``dims`` uses
    ``AXES``: tp, cp, dp, pp). Lets a figure ask what would happen with another order."""
    if sorted(order) != sorted(AXES):
        raise ValueError(f"order must list {', '.join(AXES)} once each, got {order}")
    stride, s = {}, 1
    for a in order:
        stride[a], s = s, s * getattr(dims, a)
    others = [a for a in order if a != axis]
    out = []
    for r in range(dims.world):
        c = {a: r // stride[a] % getattr(dims, a) for a in order}
        if c[axis] == 0:
            base = sum(c[a] * stride[a] for a in others)
            out.append([base + i * stride[axis] for i in range(getattr(dims, axis))])
    return sorted(out, key=lambda g: g[0])


def links(dims: ParallelDims, devices_per_node: int, order: Sequence[str] = AXES) -> dict[str, str]:
    """For each axis with more than one rank: ``"intra-node"`` if each of its groups sits inside one
    node (ranks r // devices_per_node), else ``"inter-node"``."""
    out = {}
    for a in dims.active:
        if a in AXES:
            inside = all(len({r // devices_per_node for r in g}) == 1 for g in groups_in_order(dims, a, order))
            out[a] = "intra-node" if inside else "inter-node"
    return out


def rank_grid(dims: ParallelDims, *, devices_per_node: int = 8, title: str = "") -> go.Figure:
    """Every rank as a cell: rows are pp × dp (pipeline stage, then replica), columns cp × tp, so
    rank numbers run left to right, top to bottom. One heatmap trace per axis with more than one
    rank (tp, cp, dp, pp, ep), ``z`` the index of the cell's group in ``dims.groups(axis)``; the
    buttons (plotly ``updatemenus``: they work without a kernel) show one at a time. Thick lines
    separate nodes (rank r on node r // ``devices_per_node``)."""
    cols, rows = dims.cp * dims.tp, dims.pp * dims.dp
    axes = [a for a in ("tp", "cp", "dp", "pp", "ep") if dims.size(a) > 1] or ["tp"]
    nodes = -(-dims.world // devices_per_node)
    small = dims.world > 32
    text, hover = [[""] * cols for _ in range(rows)], [[""] * cols for _ in range(rows)]
    for r in range(dims.world):
        c, (y, x) = dims.coords(r), divmod(r, cols)
        where = _where(c, dims)
        node = f"node {r // devices_per_node}"
        text[y][x] = f"<b>{r}</b>" if small else f"<b>{r}</b><br>{where}" + (f"<br>{node}" if nodes > 1 else "")
        groups = "<br>".join(f"{a} group: {dims.ranks_along(a, r)}" for a in axes if dims.size(a) > 1)
        hover[y][x] = f"<b>rank {r}</b> ({where or 'single'}), {node}<br>{groups}"
    fig = go.Figure()
    for i, axis in enumerate(axes):
        groups = dims.groups(axis)
        z = [[0] * cols for _ in range(rows)]
        for k, g in enumerate(groups):
            for r in g:
                z[r // cols][r % cols] = k
        n = len(groups)
        scale = [
            s for k in range(n) for s in ((k / n, PALETTE[k % len(PALETTE)]), ((k + 1) / n, PALETTE[k % len(PALETTE)]))
        ]
        fig.add_trace(
            go.Heatmap(
                z=z,
                text=text,
                customdata=hover,
                texttemplate="%{text}",
                textfont=dict(color="white", size=11 if small else 13),
                colorscale=scale,
                zmin=-0.5,
                zmax=n - 0.5,
                showscale=False,
                xgap=3,
                ygap=3,
                name=axis,
                visible=i == 0,
                hovertemplate="%{customdata}<extra></extra>",
            )
        )
    lines = []
    for r in range(dims.world):  # node boundaries: between neighbours on different nodes
        y, x = divmod(r, cols)
        if x + 1 < cols and (r + 1) // devices_per_node != r // devices_per_node:
            lines.append(dict(x0=x + 0.5, x1=x + 0.5, y0=y - 0.5, y1=y + 0.5))
        if y + 1 < rows and (r + cols) // devices_per_node != r // devices_per_node:
            lines.append(dict(x0=x - 0.5, x1=x + 0.5, y0=y + 0.5, y1=y + 0.5))
    shapes = [dict(type="line", line=dict(color="#222", width=4), **seg) for seg in lines]
    shapes.append(dict(type="rect", x0=-0.5, x1=cols - 0.5, y0=-0.5, y1=rows - 0.5, line=dict(color="#222", width=2)))
    buttons = [dict(label=f"{a} groups", method="update", args=[{"visible": [b == a for b in axes]}]) for a in axes]
    cell_w, cell_h = (48, 34) if small else (118, 74)
    xt = [f"cp{x // dims.tp} tp{x % dims.tp}" if dims.cp > 1 else f"tp{x}" for x in range(cols)]
    yt = [f"pp{y // dims.dp} dp{y % dims.dp}" if dims.pp > 1 else f"dp{y}" for y in range(rows)]
    title = title or f"{dims}: {dims.world} ranks, {devices_per_node} per node (thick lines: node boundaries)"
    figure_layout(
        fig,
        title=title,
        height=160 + rows * cell_h,
        width=max(520, 140 + cols * cell_w),
        shapes=shapes,
        updatemenus=[
            dict(
                type="buttons",
                direction="right",
                buttons=buttons,
                x=0,
                xanchor="left",
                y=1.0,
                yanchor="bottom",
                pad=dict(t=0, b=8),
                showactive=True,
                active=0,
            )
        ],
        xaxis=dict(tickvals=list(range(cols)), ticktext=xt, showgrid=False, zeroline=False),
        yaxis=dict(tickvals=list(range(rows)), ticktext=yt, autorange="reversed", showgrid=False, zeroline=False),
    )
    return fig.update_layout(margin=dict(l=90, r=20, t=110, b=40))


def axis_seconds(
    bytes_by_axis: Mapping[str, float], dims: ParallelDims, hw: Hardware, order: Sequence[str] = AXES
) -> list[dict]:
    """Per axis: bytes a rank sends per step, the link its groups use with ranks numbered in
    ``order`` (``links``), that link's bandwidth (``hw.intra_node_bandwidth`` inside a node,
    ``hw.inter_node_bandwidth`` across) and bytes / bandwidth, in seconds (no latency, no overlap)."""
    where = links(dims, hw.devices_per_node, order)
    out = []
    for axis in ordered_axes(bytes_by_axis):
        parts = [a for a in axis.split("×") if a in where]
        link = "inter-node" if any(where[a] == "inter-node" for a in parts) else "intra-node"
        bw = hw.intra_node_bandwidth if link == "intra-node" else hw.inter_node_bandwidth
        out.append(
            {
                "axis": axis,
                "bytes": float(bytes_by_axis[axis]),
                "link": link,
                "bandwidth": bw,
                "seconds": bytes_by_axis[axis] / bw,
            }
        )
    return out
