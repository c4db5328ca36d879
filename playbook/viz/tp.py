"""Show tensor parallelism: who holds which slice, collectives per layer, memory and time per rank.

Figures are pure (data -> plotly figure, no torch, no processes); ``playbook.viz.tp_dashboard`` wires
controls to them and to the calculators in ``playbook.theory.tp.tp``. Memory inputs are bytes.
"""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from playbook.config import ModelConfig
from playbook.theory.inventory.korthikanti import activation_bytes_per_layer
from playbook.theory.tp.layout import matrix_shards
from playbook.theory.tp.tp import tp_block_activation_breakdown
from playbook.viz.figures import figure_layout, format_value, unit_scale

RANK_COLORS = ["#2f6db5", "#e8893a", "#5b9a48", "#c94a4a", "#8a63b8", "#3aa6a0", "#b8860b", "#d36fa5"]
REPLICATED = "#9e9e9e"


def rank_color(rank: int) -> str:
    return RANK_COLORS[rank % len(RANK_COLORS)]


# ---- who holds what -----------------------------------------------------------------------------
def shard_diagram(cfg: ModelConfig, tp: int, *, title: str = "", per_row: int = 5) -> go.Figure:
    """Each weight matrix of ``cfg`` as a square [out × in], coloured by the rank that holds each
    slice: horizontal bands for a split by output rows (column parallel: q, k, v, gate, up, head,
    embedding rows), vertical bands for a split by input columns (row parallel: o, down); the norm
    weights are grey (every rank holds them). One legend entry per rank; hover names the slice."""
    mats = matrix_shards(cfg, tp)
    shown = min(tp, 16)  # beyond 16 bands a slice is a hairline: draw 16, say so in the title
    xs = {r: [] for r in range(shown)}
    ys = {r: [] for r in range(shown)}
    texts = {r: [] for r in range(shown)}
    fig = go.Figure()
    rep_x, rep_y = [], []
    for i, m in enumerate(mats):
        x0, y0 = (i % per_row) * 1.6, -(i // per_row) * 1.7  # 0.6 between squares: room for the labels
        rows, cols = m["shape"]
        # the split on two lines: on one, neighbouring labels ran into each other
        how = {"rows": f"rows split:<br>{m['by']}", "cols": f"columns split:<br>{m['by']}", None: "on every rank"}[
            m["split"]
        ]
        fig.add_annotation(
            x=x0 + 0.5,
            y=y0 + 1.02,
            text=f"<b>{m['name']}</b><br>[{rows:,}×{cols:,}]<br>{how}",
            showarrow=False,
            yanchor="bottom",
            font=dict(size=10),
        )
        if m["split"] is None:
            rep_x += [x0, x0 + 1, x0 + 1, x0, x0, None]
            rep_y += [y0 + 0.4, y0 + 0.4, y0 + 0.6, y0 + 0.6, y0 + 0.4, None]
            continue
        for r in range(shown):
            a, b = r / shown, (r + 1) / shown
            if m["split"] == "rows":  # top band = rank 0
                bx, by = [x0, x0 + 1, x0 + 1, x0, x0], [y0 + 1 - a, y0 + 1 - a, y0 + 1 - b, y0 + 1 - b, y0 + 1 - a]
                part = f"rows {r * rows // tp:,}–{(r + 1) * rows // tp - 1:,}"
            else:
                bx, by = [x0 + a, x0 + b, x0 + b, x0 + a, x0 + a], [y0, y0, y0 + 1, y0 + 1, y0]
                part = f"columns {r * cols // tp:,}–{(r + 1) * cols // tp - 1:,}"
            xs[r] += bx + [None]
            ys[r] += by + [None]
            text = f"rank {r}: {m['name']} {part} ({m['by']}), local {m['local'][0]:,}×{m['local'][1]:,}"
            texts[r] += [text] * 5 + [None]
    for r in range(shown):
        fig.add_trace(
            go.Scatter(
                x=xs[r],
                y=ys[r],
                fill="toself",
                mode="lines",
                name=f"rank {r}",
                line=dict(color="white", width=1),
                fillcolor=rank_color(r),
                text=texts[r],
                hoverinfo="text",
                hoveron="fills+points",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=rep_x,
            y=rep_y,
            fill="toself",
            mode="lines",
            name="replicated (every rank)",
            line=dict(color="white", width=1),
            fillcolor=REPLICATED,
            hoverinfo="text",
            text=["RMSNorm weights: every rank holds all of them"] * len(rep_x),
        )
    )
    n_rows = (len(mats) + per_row - 1) // per_row
    more = f" (first 16 of {tp} ranks drawn)" if tp > shown else ""
    return figure_layout(
        fig,
        title=title or f"{cfg.name}, t={tp}: which rank holds which slice{more}",
        height=240 * n_rows + 100,
        xaxis=dict(visible=False, range=[-0.1, per_row * 1.6]),
        yaxis=dict(visible=False, scaleanchor="x"),
        legend=dict(orientation="h", y=-0.02, yanchor="top"),
    )


# ---- communication ------------------------------------------------------------------------------
def comm_bars(summaries: Mapping[str, Mapping], *, value: str = "count", title: str = "") -> go.Figure:
    """Grouped bars, one group per (phase, op), one bar per source (e.g. predicted, measured).
    ``summaries``: ``{"predicted": theory.tp.summarize(...), "measured": summarize(...)}``, each keyed
    by (phase, op); ``value``: "count", "bytes" (buffers) or "sent_bytes"."""
    keys = sorted({k for s in summaries.values() for k in s}, key=lambda k: (k[0] != "forward", k))
    labels = [" ".join(k).replace("_", "-") for k in keys]
    fig = go.Figure()
    for i, (name, s) in enumerate(summaries.items()):
        ys = [s.get(k, {}).get(value, 0) for k in keys]
        fig.add_trace(
            go.Bar(
                name=name,
                x=labels,
                y=ys,
                marker_color=["#7ea6dc", "#c94a4a", "#5b9a48"][i % 3],
                text=[format_value(y) for y in ys],
                textposition="outside",
            )
        )
    ytitle = {"count": "collectives", "bytes": "buffer bytes", "sent_bytes": "bytes sent per rank"}[value]
    return figure_layout(fig, title=title, barmode="group", yaxis=dict(title=ytitle, rangemode="tozero"), height=360)


# ---- memory -------------------------------------------------------------------------------------
def activation_rows(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int,
    dtype_bytes: int = 2,
    unit: str = "MB",
    measured: Mapping[str, float] | None = None,
    title: str = "",
) -> go.Figure:
    """Activations of one layer per rank: our model (exact count) and Korthikanti et al.'s Table 2
    (a GPT block with dropout, 16-bit, scaled to ``dtype_bytes``), each with t=1, TP and TP+SP, and
    ours with SP saving only sequence shards (``regather``); ``measured`` adds bars."""
    sizes = dict(seq_len=seq_len, micro_batch=micro_batch)
    bars = {}
    rows = (
        ("no parallelism", 1, False, False),
        (f"TP t={tp}", tp, False, False),
        (f"TP+SP t={tp}", tp, True, False),
        (f"TP+SP t={tp}, shards saved", tp, True, True),
    )
    for label, t, sp, regather in rows:
        bars[f"ours, {label}"] = sum(
            tp_block_activation_breakdown(
                cfg, **sizes, tp=t, sequence_parallel=sp, regather=regather, dtype_bytes=dtype_bytes
            ).values()
        )
        if not regather:
            bars[f"Korthikanti, {label}"] = (
                activation_bytes_per_layer(**sizes, hidden=cfg.hidden, heads=cfg.n_heads, tp=t, sequence_parallel=sp)
                * dtype_bytes
                / 2
            )
    bars |= dict(measured or {})
    scale = unit_scale(unit)
    colors = ["#c94a4a" if k.startswith("ours") else "#e8a0a0" if k.startswith("Korth") else "#5b9a48" for k in bars]
    fig = go.Figure(
        go.Bar(
            x=[v / scale for v in bars.values()],
            y=list(bars),
            orientation="h",
            marker_color=colors,
            text=[f"{format_value(v / scale)} {unit}" for v in bars.values()],
            textposition="outside",
            customdata=list(bars.values()),
            hovertemplate="%{y}: %{customdata:,.0f} bytes<extra></extra>",
        )
    )
    fig = figure_layout(
        fig,
        title=title or f"{cfg.name}: activations of one layer per rank, {8 * dtype_bytes}-bit",
        xaxis=dict(title=f"bytes per layer per rank ({unit})", range=[0, max(bars.values()) / scale * 1.25]),
        yaxis=dict(autorange="reversed"),
        height=110 + 34 * len(bars),
    )
    return fig.update_layout(margin=dict(l=230, r=40))


# ---- time ---------------------------------------------------------------------------------------
def matmul_efficiency(curve: list[dict], *, title: str = "") -> go.Figure:
    """FLOP/s of one rank's local matmul against t (``measure.matmul.matmul_throughput``'s rows)."""
    x = [r["tp"] for r in curve]
    y = [r["flops_per_s"] / 1e9 for r in curve]
    text = [f"[{a}×{b}]·[{b}×{c}]" for a, b, c in (r["shape"] for r in curve)]
    fig = go.Figure(
        go.Scatter(
            x=x,
            y=y,
            mode="lines+markers",
            text=text,
            name="measured",
            hovertemplate="t=%{x}: %{y:.1f} GFLOP/s<br>%{text}<extra></extra>",
        )
    )
    return figure_layout(
        fig,
        title=title or "matmul throughput as the local matrix shrinks",
        xaxis=dict(title="t (the local matrix has 1/t of the columns)", type="log", tickvals=x),
        yaxis=dict(title="GFLOP/s", rangemode="tozero"),
        height=340,
    )


def layer_time(rows: list[dict], *, title: str = "") -> go.Figure:
    """Stacked bars per t: compute and communication seconds of one layer (``theory.tp.tp.layer_seconds``),
    in milliseconds; the total is written on top. Where the bars stop shrinking, TP stopped paying."""
    x = [f"t={r['tp']}" for r in rows]
    fig = go.Figure(
        [
            go.Bar(
                name="compute (1/t of the layer)", x=x, y=[r["compute"] * 1e3 for r in rows], marker_color="#3b7dd8"
            ),
            go.Bar(name="communication (predicted)", x=x, y=[r["comm"] * 1e3 for r in rows], marker_color="#e4572e"),
        ]
    )
    for xi, r in zip(x, rows):
        fig.add_annotation(
            x=xi, y=r["total"] * 1e3, text=f"{format_value(r['total'] * 1e3)} ms", showarrow=False, yanchor="bottom"
        )
    return figure_layout(
        fig,
        title=title or "one layer, forward + backward, per rank",
        barmode="stack",
        yaxis=dict(title="milliseconds", rangemode="tozero"),
        height=340,
    )


__all__ = ["activation_rows", "comm_bars", "layer_time", "matmul_efficiency", "shard_diagram"]
