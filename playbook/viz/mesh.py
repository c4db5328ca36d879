"""Show the hybrid mesh: where every rank sits, what each axis costs it, and what it holds.

Figures are pure (plain data -> plotly figure; no torch, no processes), so tests read ``fig.data``.
The inputs are a :class:`playbook.dims.ParallelDims` and the per-rank rows of a hybrid run
(``playbook.parallel.hybrid.run.comm_table``: ``{rank, coords, predicted, measured, memory}``, bytes
per step by axis and bytes by category). The calculators at the end (``axis_seconds``,
``serving_rows``) turn the theory of ``playbook.theory`` into the rows of the chapter's tables.

Topology first (Narayanan et al. 2021, arXiv:2104.04473, §3.2; Llama 3, Dubey et al. 2024,
arXiv:2407.21783, §3.3.2): the axis that talks most (tp) gets the consecutive ranks of one node,
the pipeline and the data-parallel replicas the links between nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.config import Hardware, ModelConfig
from playbook.dims import AXES, ParallelDims
from playbook.theory.comm import collective_seconds
from playbook.theory.memory import training_memory
from playbook.viz.figures import CATEGORY_COLORS, CATEGORY_LABELS, _layout, format_value, timeline, unit_scale

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
MEMORY = ("params", "grads", "optimizer", "activations")


def _axes(keys) -> list[str]:
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
    _layout(
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


# ---- one run: bytes and memory per rank ----------------------------------------------------------------
def bytes_per_axis(rows: Sequence[Mapping], *, unit: str = "KB", title: str = "") -> go.Figure:
    """One panel per axis, grouped bars per rank: bytes sent per step, predicted beside measured
    (``rows`` as ``comm_table`` returns them). ``customdata`` holds the exact bytes."""
    scale = unit_scale(unit)
    axes = _axes({a for row in rows for k in ("predicted", "measured") for a in row[k]})
    fig = make_subplots(
        rows=1, cols=max(1, len(axes)), subplot_titles=[f"<b>{a}</b>" for a in axes], horizontal_spacing=0.06
    )
    x = [f"rank {row['rank']}" for row in rows]
    for i, axis in enumerate(axes):
        for kind, color in (("predicted", "#9fb7d9"), ("measured", "#2f4b7c")):
            values = [float(row[kind].get(axis, 0.0)) for row in rows]
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=[v / scale for v in values],
                    customdata=values,
                    name=kind,
                    legendgroup=kind,
                    marker_color=color,
                    showlegend=i == 0,
                    meta=axis,
                    hovertemplate=f"<b>{axis}, {kind}</b> %{{x}}<br>%{{customdata:,.0f}} bytes<extra></extra>",
                ),
                row=1,
                col=i + 1,
            )
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text=f"bytes sent per step ({unit})", row=1, col=1)
    return _layout(
        fig,
        title=title,
        barmode="group",
        height=380,
        legend=dict(orientation="h", yanchor="bottom", y=1.12, xanchor="right", x=1.0),
    )


def _memory(row: Mapping) -> tuple[Mapping, Mapping]:
    """(measured, predicted) bytes by category of a row: ``memory`` is either the measured dict
    itself or ``{"predicted": ..., "measured": ...}``."""
    mem = row["memory"]
    if "measured" in mem:
        return mem["measured"], mem.get("predicted") or {}
    return mem, {}


def memory_per_rank(rows: Sequence[Mapping], *, unit: str = "KB", title: str = "") -> go.Figure:
    """Stacked bars per rank, one segment per category (params, grads, optimizer, activations) as
    measured; where the rows carry a prediction of every category, a diamond marks its total."""
    scale = unit_scale(unit)
    x = [f"rank {row['rank']}" for row in rows]
    fig = go.Figure()
    for cat in MEMORY:
        values = [_memory(row)[0].get(cat) or 0 for row in rows]
        fig.add_trace(
            go.Bar(
                x=x,
                y=[v / scale for v in values],
                customdata=values,
                name=CATEGORY_LABELS[cat],
                legendgroup=cat,
                marker_color=CATEGORY_COLORS[cat],
                hovertemplate=f"<b>{CATEGORY_LABELS[cat]}</b> %{{x}}<br>%{{customdata:,}} bytes<extra></extra>",
            )
        )
    predicted = [_memory(row)[1] for row in rows]
    if all(p and all(p.get(c) is not None for c in MEMORY) for p in predicted):
        totals = [sum(p[c] for c in MEMORY) for p in predicted]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[t / scale for t in totals],
                customdata=totals,
                mode="markers",
                name="predicted total",
                legendgroup="predicted",
                marker=dict(symbol="diamond", size=11, color="#222"),
                hovertemplate="predicted total %{x}<br>%{customdata:,.0f} bytes<extra></extra>",
            )
        )
    return _layout(
        fig,
        title=title,
        barmode="stack",
        height=380,
        yaxis=dict(title=f"bytes ({unit}), measured"),
        legend=dict(traceorder="normal"),
    )


def step_timeline(spans: Sequence[Mapping], *, step: int = -1, title: str = "") -> go.Figure:
    """One training step on every rank (``figures.timeline``), from a rank set's trace: the window of
    each rank's compute span ``"step N"``; collectives named by their mesh axis (``"tp all_reduce"``),
    compute regions by their direction (``"forward"``, ``"backward"``)."""
    steps = sorted(
        {int(s["name"].split()[1]) for s in spans if s["kind"] == "compute" and s["name"].startswith("step ")}
    )
    if not steps:
        return timeline([], title=title)
    n = steps[step]
    window = {s["rank"]: (s["start"], s["end"]) for s in spans if s["kind"] == "compute" and s["name"] == f"step {n}"}
    shown = []
    for s in spans:
        lo, hi = window.get(s["rank"], (0.0, -1.0))
        if s.get("end") is None or not lo <= s["start"] <= hi or s["name"].startswith("step "):
            continue
        if s["kind"] == "comm":
            name = f"{s.get('axis') or s.get('group', '')} {s['name']}".strip()
        else:
            name = "backward" if "backward" in s["name"] else "forward" if "forward" in s["name"] else s["name"]
        shown.append({**s, "name": name})
    return timeline(shown, title=title or f"step {n} on every rank")


# ---- several layouts side by side -----------------------------------------------------------------------
def layout_summary(rows: Sequence[Mapping]) -> dict:
    """The rank that sends most and the rank that holds most: ``{"bytes": {axis: bytes}, "sent",
    "memory": {category: bytes}, "held", "busiest", "fullest"}`` (measured)."""
    busiest = max(rows, key=lambda r: sum(r["measured"].values()))
    fullest = max(rows, key=lambda r: sum(_memory(r)[0].get(c) or 0 for c in MEMORY))
    memory = {c: _memory(fullest)[0].get(c) or 0 for c in MEMORY}
    return {
        "bytes": dict(busiest["measured"]),
        "sent": sum(busiest["measured"].values()),
        "busiest": busiest["rank"],
        "memory": memory,
        "held": sum(memory.values()),
        "fullest": fullest["rank"],
    }


def compare_layouts(runs: Mapping[str, Sequence[Mapping]], *, unit: str = "KB", title: str = "") -> go.Figure:
    """Layouts side by side: left, bytes sent per step by the busiest rank, stacked by axis; right,
    memory of the fullest rank, stacked by category (both measured; ``layout_summary``)."""
    scale = unit_scale(unit)
    names, summary = list(runs), {k: layout_summary(v) for k, v in runs.items()}
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.1,
        subplot_titles=["bytes sent per step, busiest rank", "memory, fullest rank"],
    )
    for axis in _axes({a for s in summary.values() for a in s["bytes"]}):
        values = [summary[n]["bytes"].get(axis, 0.0) for n in names]
        fig.add_trace(
            go.Bar(
                x=names,
                y=[v / scale for v in values],
                customdata=values,
                name=axis,
                legendgroup="axis",
                legendgrouptitle_text="axis",
                marker_color=AXIS_COLORS.get(axis, "#7f7f7f"),
                hovertemplate=f"<b>{axis}</b> %{{x}}<br>%{{customdata:,.0f}} bytes<extra></extra>",
            ),
            row=1,
            col=1,
        )
    for cat in MEMORY:
        values = [summary[n]["memory"][cat] for n in names]
        fig.add_trace(
            go.Bar(
                x=names,
                y=[v / scale for v in values],
                customdata=values,
                name=CATEGORY_LABELS[cat],
                legendgroup="memory",
                legendgrouptitle_text="memory",
                marker_color=CATEGORY_COLORS[cat],
                hovertemplate=f"<b>{CATEGORY_LABELS[cat]}</b> %{{x}}<br>%{{customdata:,}} bytes<extra></extra>",
            ),
            row=1,
            col=2,
        )
    fig.update_yaxes(title_text=f"bytes ({unit})", rangemode="tozero")
    _layout(fig, title=title, barmode="stack", height=440)
    return fig.update_layout(margin=dict(t=100))


def table(rows: Sequence[Mapping], *, columns: Sequence[str] | None = None, title: str = "") -> go.Figure:
    """A plotly table of ``rows`` (dicts), one column per key (or ``columns``); numbers printed with
    about three significant digits and thousands separators (``format_value``)."""
    columns = list(columns or (rows[0] if rows else []))

    def cell(v) -> str:
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return "—" if v is None else str(v)
        if isinstance(v, int):  # counts stay whole: stage 3, 16 in flight
            return f"{v:,}"
        return format_value(float(v))

    values = [[cell(row.get(c)) for row in rows] for c in columns]
    numeric = [
        all(
            isinstance(row.get(c), (int, float)) and not isinstance(row.get(c), bool)
            for row in rows
            if row.get(c) is not None
        )
        for c in columns
    ]
    widths = [1.2] + [1] * (len(columns) - 1)
    chars = [max(6, 950 * w / sum(widths) / 7) for w in widths]  # characters per header line at ~7 px each
    lines = max([-(-len(c) // int(n)) for c, n in zip(columns, chars)] or [1])
    header = 14 + 17 * lines
    # a cell's text wraps at its column's width: each row as tall as its longest cell
    row_lines = [
        max([-(-len(values[j][i]) // int(chars[j])) for j in range(len(columns))] or [1]) for i in range(len(rows))
    ]
    heights = [26 + 21 * (n - 1) for n in row_lines]
    fig = go.Figure(
        go.Table(
            header=dict(
                values=[f"<b>{c}</b>" for c in columns],
                fill_color="#e8eef7",
                align="left",
                font=dict(size=12),
                height=header,
            ),
            cells=dict(values=values, align=["right" if n else "left" for n in numeric], height=26, font=dict(size=12)),
            columnwidth=widths,
        )
    )
    _layout(fig, title=title, height=(50 if title else 10) + header + sum(heights) + 24)
    return fig.update_layout(margin=dict(l=10, r=10, t=50 if title else 10, b=10))


# ---- calculators for the chapter's tables -----------------------------------------------------------------
def axis_seconds(
    bytes_by_axis: Mapping[str, float], dims: ParallelDims, hw: Hardware, order: Sequence[str] = AXES
) -> list[dict]:
    """Per axis: bytes a rank sends per step, the link its groups use with ranks numbered in
    ``order`` (``links``), that link's bandwidth (``hw.intra_node_bandwidth`` inside a node,
    ``hw.inter_node_bandwidth`` across) and bytes / bandwidth, in seconds (no latency, no overlap)."""
    where = links(dims, hw.devices_per_node, order)
    out = []
    for axis in _axes(bytes_by_axis):
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


def serving_rows(
    cfg: ModelConfig, hw: Hardware, layouts: Sequence[tuple[int, int]], *, dtype: str = "bf16", latency: float = 5e-6
) -> list[dict]:
    """TP against DP replicas for serving, ``(tp, dp)`` replicas of ``cfg`` on ``tp·dp`` devices of ``hw``: weights per
    device (``inference_memory``: bf16, even split), memory left for the KV cache (capacity minus weights:
    no workspace or headroom), how many tokens of cache fit per replica and in all, and the tensor-parallel
    all-reduces of one decoded token (2 per layer of ``hidden`` values; Shoeybi et al. 2019) as bytes and
    as alpha-beta time on NVLink (``collective_seconds`` with ``latency`` per ring step)."""
    from playbook.theory.serving import kv_bytes_per_token, tp_allreduce_bytes, weights_per_gpu

    nbytes = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}[dtype]
    out = []
    for tp, dp in layouts:
        weights = weights_per_gpu(cfg, tp=tp, dtype=dtype)
        free = max(hw.memory_bytes - weights, 0.0)
        tokens = free / kv_bytes_per_token(cfg, tp=tp, dtype=dtype)  # this device's share of a token's cache
        message = cfg.hidden * nbytes
        out.append(
            {
                "layout": f"tp{tp}×dp{dp}",
                "tp": tp,
                "dp": dp,
                "weights": weights,
                "free": free,
                "tokens_per_replica": tokens,
                "tokens": tokens * dp,
                "tp_bytes_per_token": cfg.n_layers * tp_allreduce_bytes(cfg, tokens=1, tp=tp, act_bytes=nbytes),
                "tp_seconds_per_token": 2
                * cfg.n_layers
                * collective_seconds("all_reduce", message, tp, hw.intra_node_bandwidth, latency),
            }
        )
    return out


def training_rows(
    cfg: ModelConfig, layouts: Sequence[tuple[int, int]], *, seq_len: int, micro_batch: int = 1, zero: int = 1
) -> list[dict]:
    """Training memory per device for ``(tp, dp)`` layouts (``training_memory``: mixed-precision Adam,
    Megatron TP with sequence parallelism, ZeRO stage ``zero`` over dp; Rajbhandari et al. 2019,
    Korthikanti et al. 2022), by category, in bytes."""
    return [
        {
            "layout": f"tp{tp}×dp{dp}",
            **training_memory(
                cfg, seq_len=seq_len, micro_batch=micro_batch, tp=tp, dp=dp, zero=zero, sequence_parallel=True
            ).as_dict(),
        }
        for tp, dp in layouts
    ]


__all__ = [
    "axis_seconds",
    "bytes_per_axis",
    "compare_layouts",
    "groups_in_order",
    "layout_summary",
    "links",
    "memory_per_rank",
    "rank_grid",
    "serving_rows",
    "step_timeline",
    "table",
    "training_rows",
]
