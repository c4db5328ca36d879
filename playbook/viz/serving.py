"""Figures of the serving chapter: pure functions from plain data to plotly figures (no torch).

Inputs come from ``playbook.theory.serving.serving`` (predictions), ``playbook.serve.rates`` (timings on
real ranks) and ``playbook.serve.batching`` (the scheduler's step records).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.viz.figures import CATEGORY_COLORS, CATEGORY_LABELS, figure_layout
from playbook.viz.mesh_layout import PALETTE

# the book's one colour per memory category (chapters 0 and 2 draw the same), and grey for room left
MEMORY_COLORS = {**CATEGORY_COLORS, "free": "#d9d9d9"}
TP_COLORS = {1: "#2f6db5", 2: "#e8893a", 4: "#5b9a48", 8: "#c94a4a"}


def stacked_memory(
    rows: Sequence[Mapping], categories: Sequence[str], *, unit: float = 1e9, unit_name: str = "GB", title: str = ""
) -> go.Figure:
    """One stacked bar per row (``row["label"]``), one segment per category, bytes / ``unit``."""
    fig = go.Figure()
    labels = [r["label"] for r in rows]
    for cat in categories:
        values = [r.get(cat, 0.0) for r in rows]
        fig.add_trace(
            go.Bar(
                x=labels,
                y=[v / unit for v in values],
                name=CATEGORY_LABELS.get(cat, cat.replace("_", " ")),
                marker_color=MEMORY_COLORS.get(cat, "#7f7f7f"),
                customdata=values,
                hovertemplate=f"<b>{CATEGORY_LABELS.get(cat, cat)}</b> %{{x}}<br>%{{y:.3g}} {unit_name} (%{{customdata:,.0f}} bytes)<extra></extra>",
            )
        )
    fig.update_yaxes(title_text=unit_name, rangemode="tozero")
    return figure_layout(fig, title=title, barmode="stack", height=420)


def kv_growth(
    curves: Mapping[str, Sequence[tuple[int, float]]], *, limit: float | None = None, title: str = ""
) -> go.Figure:
    """KV cache bytes (GB) against tokens cached, one line per curve name; ``limit``: a memory line."""
    fig = go.Figure()
    for i, (name, points) in enumerate(curves.items()):
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in points],
                y=[p[1] / 1e9 for p in points],
                mode="lines+markers",
                name=name,
                line=dict(color=PALETTE[i % len(PALETTE)]),
            )
        )
    if limit is not None:  # a trace, not a shape: shapes on a log axis take log10 coordinates
        xs = [p[0] for points in curves.values() for p in points]
        fig.add_trace(
            go.Scatter(
                x=[min(xs), max(xs)],
                y=[limit / 1e9] * 2,
                mode="lines",
                name=f"{limit / 1e9:.0f} GB",
                line=dict(color="#c94a4a", dash="dot"),
            )
        )
    fig.update_xaxes(title_text="tokens in the cache (batch × context)", type="log")
    fig.update_yaxes(title_text="KV cache (GB)", type="log")
    return figure_layout(fig, title=title, height=420)


def roofline(measured: Sequence[Mapping], predicted: Sequence[Mapping], *, title: str = "") -> go.Figure:
    """Prefill time against prompt tokens (left) and decode-step time against batch (right): measured
    (markers) and predicted (dashed), per tp. Rows: ``{"phase", "tp", "x", "seconds"}``."""
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("prefill: time to first token", "decode: time per output token"),
        horizontal_spacing=0.1,
    )
    for kind, rows, style in (
        ("measured", measured, dict(mode="markers+lines", line=dict(width=1))),
        ("predicted", predicted, dict(mode="lines", line=dict(dash="dash", width=2))),
    ):
        for col, phase in ((1, "prefill"), (2, "decode")):
            for tp in sorted({r["tp"] for r in rows}):
                pts = sorted((r["x"], r["seconds"]) for r in rows if r["phase"] == phase and r["tp"] == tp)
                line = dict(style["line"], color=TP_COLORS.get(tp, "#7f7f7f"))
                fig.add_trace(
                    go.Scatter(
                        x=[p[0] for p in pts],
                        y=[p[1] * 1e3 for p in pts],
                        name=f"tp={tp} {kind}",
                        legendgroup=f"{tp}{kind}",
                        showlegend=col == 1,
                        mode=style["mode"],
                        line=line,
                        hovertemplate=f"tp={tp} {kind}<br>%{{x}}: %{{y:.2f}} ms<extra></extra>",
                    ),
                    row=1,
                    col=col,
                )
    for col, phase, label in ((1, "prefill", "prompt tokens"), (2, "decode", "sequences in the batch")):
        ticks = sorted({r["x"] for r in [*measured, *predicted] if r["phase"] == phase})
        fig.update_xaxes(title_text=label, type="log", tickvals=ticks, row=1, col=col)
    fig.update_yaxes(title_text="milliseconds", rangemode="tozero")
    return figure_layout(fig, title=title, height=430)


def layouts(rows: Sequence[Mapping], *, title: str = "") -> go.Figure:
    """Per layout (``row["layout"]``): time per output token at batch 1 and at full batch (left,
    ms) and tokens/s served in all (right): the latency-against-throughput trade of TP against DP replicas."""
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("time per output token (ms)", "tokens/s, all replicas"), horizontal_spacing=0.12
    )
    names = [r["layout"] for r in rows]
    fig.add_trace(
        go.Bar(x=names, y=[r["tpot_batch1"] * 1e3 for r in rows], name="one request", marker_color="#2f6db5"),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Bar(x=names, y=[r["tpot"] * 1e3 for r in rows], name="full batch", marker_color="#e8893a"), row=1, col=1
    )
    fig.add_trace(
        go.Bar(
            x=names,
            y=[r["tokens_per_s"] for r in rows],
            name="tokens/s",
            marker_color="#5b9a48",
            text=[f"{r['seqs']} seqs" for r in rows],
            textposition="outside",
        ),
        row=1,
        col=2,
    )
    fig.update_yaxes(rangemode="tozero")
    return figure_layout(fig, title=title, barmode="group", height=430)


def block_table(steps: Sequence[Mapping], n_blocks: int, *, title: str = "") -> go.Figure:
    """The paged KV cache over scheduler steps: cell (step, block) coloured by the request holding
    that physical block at the end of the step (before finished requests free theirs), blank if free."""
    ids = sorted({i for s in steps for i in s["tables"]})
    index = {rid: k for k, rid in enumerate(ids)}
    z = [[None] * len(steps) for _ in range(n_blocks)]
    text = [[""] * len(steps) for _ in range(n_blocks)]
    for col, s in enumerate(steps):
        for rid, blocks in s["tables"].items():
            for logical, b in enumerate(blocks):
                z[b][col], text[b][col] = index[rid], f"r{rid}·{logical}"
    n = max(len(ids), 1)
    scale = [[(k + edge) / n, PALETTE[k % len(PALETTE)]] for k in range(n) for edge in (0, 1)]  # one flat band each
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[s["step"] for s in steps],
            y=list(range(n_blocks)),
            text=text,
            texttemplate="%{text}",
            textfont=dict(size=9, color="white"),
            colorscale=scale,
            zmin=-0.5,
            zmax=n - 0.5,
            showscale=False,
            xgap=1,
            ygap=1,
            hovertemplate="step %{x}, block %{y}: %{text}<extra></extra>",
        )
    )
    fig.update_xaxes(title_text="scheduler step", dtick=1)
    fig.update_yaxes(title_text="physical block", dtick=1, autorange="reversed")
    return figure_layout(fig, title=title, height=max(320, 26 * n_blocks + 140))


__all__ = ["block_table", "kv_growth", "layouts", "roofline", "stacked_memory"]
