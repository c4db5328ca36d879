"""Chapter 7's quantized serving figure: what the KV dtype does to capacity (pure: rows -> plotly figure).

Left: blocks of gpt-tiny's cache that fit in one budget on this machine, predicted
(``theory.serving.serving.kv_block_bytes``) as bars and measured (a real cache's tensors,
``serve.kv_quant``) as markers. Right: sequences that fit at scale, one bar group per KV dtype and one
bar per weight format (``theory.serving.quantized.at_scale``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.viz.figures import figure_layout
from playbook.viz.mesh_layout import PALETTE


def capacity_by_kv_dtype(
    local: Sequence[Mapping],
    at_scale: Sequence[Mapping],
    *,
    local_title: str = "",
    scale_title: str = "",
    title: str = "",
) -> go.Figure:
    """``local``: rows {"kv_dtype", "predicted", "measured"} (blocks in a budget); ``at_scale``: rows
    {"kv", "weights", "max_seqs"} (sequences that fit), one bar colour per weight format."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(local_title, scale_title), horizontal_spacing=0.12)
    kinds = [r["kv_dtype"] for r in local]
    fig.add_trace(
        go.Bar(
            x=kinds,
            y=[r["predicted"] for r in local],
            name="blocks, predicted",
            marker_color="#9ab8dc",
            text=[f"{r['predicted']:,}" for r in local],
            textposition="inside",
            insidetextanchor="start",
            hovertemplate="KV %{x}: %{y:,} blocks predicted<extra></extra>",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=kinds,
            y=[r["measured"] for r in local],
            name="blocks, measured",
            mode="markers",
            marker=dict(symbol="diamond", size=11, color="#1f3f6e"),
            hovertemplate="KV %{x}: %{y:,} blocks measured<extra></extra>",
        ),
        row=1,
        col=1,
    )
    for i, w in enumerate(dict.fromkeys(r["weights"] for r in at_scale)):
        rows = [r for r in at_scale if r["weights"] == w]
        fig.add_trace(
            go.Bar(
                x=[r["kv"] for r in rows],
                y=[r["max_seqs"] for r in rows],
                name=f"weights {w}",
                marker_color=PALETTE[(i + 1) % len(PALETTE)],
                text=[r["max_seqs"] for r in rows],
                textposition="outside",
                hovertemplate=f"weights {w}, KV %{{x}}: %{{y}} sequences<extra></extra>",
            ),
            row=1,
            col=2,
        )
    fig.update_xaxes(title_text="KV cache dtype", row=1, col=1)
    fig.update_xaxes(title_text="KV cache dtype", row=1, col=2)
    fig.update_yaxes(title_text="blocks that fit", rangemode="tozero", row=1, col=1)
    top = max((r["max_seqs"] for r in at_scale), default=1)
    fig.update_yaxes(title_text="sequences that fit", range=[0, 1.15 * top], row=1, col=2)  # room for the labels
    fig.update_layout(legend=dict(orientation="h", y=-0.22), barmode="group")
    return figure_layout(fig, title=title, height=440)
