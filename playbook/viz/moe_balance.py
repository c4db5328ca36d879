"""Figures for balancing a mixture of experts: the capacity buffer's slots, and routing over training.

``capacity_figure`` draws ``theory.moe.routing.capacity_buffer``: per expert the slots filled, the
padded slots a fixed ``[E, C, h]`` buffer would carry, and the slots dropped over capacity.
``balance_figure`` draws, for several runs (``MoERun.routing``), the router entropy (as a share of
ln E, its most) and the share of slots over capacity, step by step.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.viz.figures import HEIGHT

COLORS = ["#7f7f7f", "#2f6db5", "#e8893a", "#5b9a48", "#c94a4a", "#8a63b8"]


def capacity_figure(buffer: dict, *, title: str = "one expert buffer of C slots each") -> go.Figure:
    """Stacked bars per expert: filled (sent, computed), padding (sent and computed as zeros by a fixed
    buffer), dropped (over capacity: never computed)."""
    experts = [f"expert {i}" for i in range(len(buffer["filled"]))]
    fig = go.Figure()
    for key, name, color in [
        ("filled", "filled slots", "#2f6db5"),
        ("padding", "padding (zeros in a fixed buffer)", "#c9d6ea"),
        ("dropped", "dropped (over capacity)", "#c94a4a"),
    ]:
        fig.add_bar(x=experts, y=buffer[key], name=name, marker_color=color)
    capacity = buffer["slots"] // len(experts)
    fig.add_hline(
        y=capacity, line_dash="dot", annotation_text=f"capacity C = {capacity}", annotation_position="top right"
    )
    fig.update_layout(
        height=HEIGHT,
        barmode="stack",
        title=title,
        yaxis_title="routing slots",
        legend=dict(orientation="h", y=-0.15),
    )
    return fig


def balance_figure(
    runs: dict[str, list[list[dict]]], *, n_experts: int, title: str = "routing over training"
) -> go.Figure:
    """Router entropy / ln E and the share of slots over capacity per step, averaged over MoE layers."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("router entropy / ln E", "slots over capacity"))
    for i, (name, routing) in enumerate(runs.items()):
        entropy = [sum(L["router_entropy"] for L in s) / len(s) / math.log(n_experts) for s in routing]
        over = [sum(L["dropped"] for L in s) / sum(sum(L["counts"]) for L in s) for s in routing]
        style = dict(mode="lines", line=dict(color=COLORS[i % len(COLORS)]), legendgroup=name)
        fig.add_trace(go.Scatter(y=entropy, name=name, **style), 1, 1)
        fig.add_trace(go.Scatter(y=over, name=name, showlegend=False, **style), 1, 2)
    fig.update_layout(height=HEIGHT, title=title, legend=dict(orientation="h", y=-0.2))
    fig.update_yaxes(tickformat=".0%", row=1, col=1)
    fig.update_yaxes(tickformat=".0%", rangemode="tozero", row=1, col=2)
    fig.update_xaxes(title_text="step")
    return fig
