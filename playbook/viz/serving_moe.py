"""Chapter 7's MoE serving figure: memory per GPU under TP attention and DP attention (pure, no torch).

One panel per setting, one stacked bar per layout: the weights, the KV cache each GPU holds for its
own share, and the KV it holds that another GPU of its group also holds (KV heads replicated past
n_kv_heads, an MLA latent on every TP rank), each bar labelled with the sequences that fit. Rows come
from ``theory.serving.moe_layouts.moe_layout`` (at scale) or ``serve.moe_layouts`` (measured on ranks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.viz.figures import CATEGORY_COLORS, figure_layout

SEGMENTS = {  # key in a row -> (legend name, colour)
    "weights": ("weights", CATEGORY_COLORS["weights"]),
    "kv": ("KV cache, own share", CATEGORY_COLORS["kv_cache"]),
    "replicated_kv": ("KV cache, copies of another rank's", "#d6a2e8"),
}


def moe_rows(layout_rows: Sequence[Mapping]) -> list[dict]:
    """``theory.serving.moe_layouts`` rows -> this figure's rows (label, weights, kv, replicated_kv, note)."""
    return [
        {
            "label": r["layout"],
            "weights": r["weights_per_gpu"],
            "kv": r["kv_per_gpu"] - r["replicated_kv_per_gpu"],
            "replicated_kv": r["replicated_kv_per_gpu"],
            "note": f"{r['seqs']:,} seqs"
            + (f", {r['tokens_per_s'] / 1e3:.1f}k tok/s" if r.get("tokens_per_s") else ""),
        }
        for r in layout_rows
    ]


def moe_memory(panels: Mapping[str, tuple[Sequence[Mapping], float, str]], *, title: str = "") -> go.Figure:
    """``panels``: name -> (rows of ``moe_rows``' shape, bytes per unit, unit name). Stacked bars,
    one panel each, the legend once, each bar's ``note`` above it."""
    names = list(panels)
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names, horizontal_spacing=0.1)
    for col, name in enumerate(names, start=1):
        rows, unit, unit_name = panels[name]
        labels = [r["label"] for r in rows]
        for key, (legend, colour) in SEGMENTS.items():
            values = [r.get(key, 0.0) for r in rows]
            fig.add_trace(
                go.Bar(
                    x=labels,
                    y=[v / unit for v in values],
                    name=legend,
                    legendgroup=key,
                    showlegend=col == 1,
                    marker_color=colour,
                    customdata=values,
                    hovertemplate=f"<b>{legend}</b> %{{x}}<br>%{{y:.3g}} {unit_name} per GPU"
                    "<br>(%{customdata:,.0f} bytes)<extra></extra>",
                ),
                row=1,
                col=col,
            )
        tops = [sum(r.get(k, 0.0) for k in SEGMENTS) / unit for r in rows]
        fig.add_trace(
            go.Scatter(
                x=labels,
                y=tops,
                mode="text",
                text=[r.get("note", "") for r in rows],
                textposition="top center",
                showlegend=False,
                hoverinfo="skip",
            ),
            row=1,
            col=col,
        )
        fig.update_yaxes(
            title_text=f"{unit_name} per GPU", rangemode="tozero", range=[0, 1.18 * max(tops)], row=1, col=col
        )
    figure_layout(fig, title=title, barmode="stack", height=440)
    fig.update_layout(legend=dict(orientation="h", y=-0.18, x=0))
    return fig
