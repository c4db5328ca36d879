"""Show routing: tokens per expert over steps, drops, imbalance, all-to-all bytes; and a dashboard.

Pure figures from plain numbers (lists of counts per step), so the same figure draws a simulated
router (``playbook.theory.moe.moe.simulate_routing``) and a real run (``MoERun.routing`` or the
``routing`` block of ``playbook run ep --json``). The dashboard only wires sliders to them.
"""

from __future__ import annotations


import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.theory.moe.capacity import imbalance
from playbook.viz.figures import format_value

HEIGHT = 380


def routing_figure(
    counts: list[list[int]],
    kept: list[list[int]] | None = None,
    capacity: int | None = None,
    *,
    title: str = "tokens per expert",
) -> go.Figure:
    """Left: heatmap of slots routed to each expert (columns) at each step (rows). Right: per step,
    the drop rate (share of slots over capacity) and the imbalance (max load / mean load)."""
    steps = list(range(len(counts)))
    E = len(counts[0])
    kept = kept or counts
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.55, 0.45],
        horizontal_spacing=0.14,
        specs=[[{}, {"secondary_y": True}]],
        subplot_titles=(
            "slots per expert" + (f" (capacity {capacity})" if capacity else ""),
            "drop rate and imbalance",
        ),
    )
    fig.add_trace(
        go.Heatmap(
            z=counts,
            x=[f"e{i}" for i in range(E)],
            y=steps,
            colorscale="Blues",
            colorbar=dict(
                orientation="h", x=0.27, y=-0.32, len=0.5, thickness=10, title=dict(text="slots", side="right")
            ),
            hovertemplate="step %{y}, expert %{x}: %{z} slots<extra></extra>",
        ),
        1,
        1,
    )
    drop = [1 - sum(k) / sum(c) if sum(c) else 0.0 for c, k in zip(counts, kept)]
    fig.add_trace(go.Scatter(x=steps, y=drop, name="drop rate", mode="lines+markers", line=dict(color="#c94a4a")), 1, 2)
    fig.add_trace(
        go.Scatter(
            x=steps,
            y=[imbalance(c) for c in counts],
            name="imbalance (max/mean)",
            mode="lines+markers",
            line=dict(color="#2f6db5"),
        ),
        1,
        2,
        secondary_y=True,
    )
    fig.update_layout(
        height=HEIGHT + 40,
        title=title,
        margin=dict(t=70, r=60, b=90),
        legend=dict(orientation="h", x=0.58, y=-0.3),
    )
    fig.update_yaxes(title_text="step", autorange="reversed", dtick=1 if len(counts) <= 12 else None, row=1, col=1)
    fig.update_xaxes(dtick=1 if len(counts) <= 12 else None, row=1, col=2)
    fig.update_yaxes(title_text="drop rate", rangemode="tozero", tickformat=".0%", row=1, col=2, secondary_y=False)
    fig.update_yaxes(
        title_text="imbalance (max/mean)",
        rangemode="tozero",
        tickformat=".1f",
        showgrid=False,
        row=1,
        col=2,
        secondary_y=True,
    )
    fig.update_xaxes(title_text="step", row=1, col=2)
    return fig


def bytes_figure(
    predicted: list[float], measured: list[float] | None = None, *, title: str = "all-to-all bytes sent per rank"
) -> go.Figure:
    """Bars per rank: bytes predicted from the routing counts, and measured by the tracer."""
    ranks = [f"rank {r}" for r in range(len(predicted))]
    fig = go.Figure(
        go.Bar(
            x=ranks,
            y=predicted,
            name="predicted from routing counts",
            marker_color="#7ea6dc",
            text=[format_value(b) for b in predicted],
            textposition="outside",
        )
    )
    if measured is not None:
        fig.add_trace(
            go.Bar(
                x=ranks,
                y=measured,
                name="measured (tracer)",
                marker_color="#2f6db5",
                text=[format_value(b) for b in measured],
                textposition="outside",
            )
        )
    fig.update_layout(
        height=HEIGHT,
        title=title,
        yaxis_title="bytes",
        barmode="group",
        legend=dict(orientation="h", y=-0.15),
    )
    # room above the tallest bar for its label: plotly's autorange cut the tallest labels at 1280 px
    tallest = max([*predicted, *(measured or [])], default=0)
    fig.update_yaxes(range=[0, 1.15 * tallest] if tallest > 0 else None)
    return fig


def routing_over_steps(runs: dict[str, list[list[dict]]], *, title: str = "routing over training") -> go.Figure:
    """For several runs (name -> ``MoERun.routing``): drop rate and imbalance per step, averaged
    over the MoE layers, side by side."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("dropped slots", "imbalance (max load / mean load)"))
    colors = ["#7f7f7f", "#2f6db5", "#e8893a", "#5b9a48", "#c94a4a", "#8a63b8"]
    for i, (name, routing) in enumerate(runs.items()):
        drop = [sum(L["dropped"] for L in s) / sum(sum(L["counts"]) for L in s) for s in routing]
        imb = [sum(imbalance(L["counts"]) for L in s) / len(s) for s in routing]
        style = dict(mode="lines", line=dict(color=colors[i % len(colors)]), legendgroup=name)
        fig.add_trace(go.Scatter(y=drop, name=name, **style), 1, 1)
        fig.add_trace(go.Scatter(y=imb, name=name, showlegend=False, **style), 1, 2)
    fig.update_layout(height=HEIGHT, title=title, legend=dict(orientation="h", y=-0.2))
    fig.update_yaxes(tickformat=".0%", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text="step")
    return fig


__all__ = ["bytes_figure", "routing_figure", "routing_over_steps"]
