"""Show routing: tokens per expert over steps, drops, imbalance, all-to-all bytes; and a dashboard.

Pure figures from plain numbers (lists of counts per step), so the same figure draws a simulated
router (``playbook.theory.moe.simulate_routing``) and a real run (``MoERun.routing`` or the
``routing`` block of ``playbook run ep --json``). The dashboard only wires sliders to them.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.theory.moe import alltoall_bytes_per_step, imbalance, kept_counts, load_entropy, simulate_routing
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


def run_routing(routing: list[list[dict]], layer: int = 0) -> dict:
    """Counts, kept and capacity of one layer over the steps of a real run (``MoERun.routing``)."""
    rows = [step[layer] for step in routing]
    return {"counts": [r["counts"] for r in rows], "kept": [r["kept"] for r in rows], "capacity": rows[-1]["capacity"]}


def routing_dashboard(
    *,
    n_experts: int = 8,
    top_k: int = 2,
    capacity_factor: float = 1.25,
    skew: float = 0.0,
    tokens: int = 256,
    steps: int = 10,
    ep: int = 4,
    hidden: int = 64,
    last_run: list[list[dict]] | None = None,
    layer: int = 0,
):
    """Sliders for experts, top-k, capacity factor (0 = no dropping) and router skew -> the routing
    figure of a simulated router, with drop rate, imbalance and bytes per all-to-all in words.
    ``last_run`` (``MoERun.routing`` of a real run) adds the same figure for that run below."""
    import ipywidgets as w

    controls = {
        "n_experts": w.Dropdown(options=[2, 4, 8, 16, 32, 64], value=n_experts, description="experts"),
        "top_k": w.IntSlider(value=top_k, min=1, max=8, description="top-k"),
        "capacity_factor": w.FloatSlider(value=capacity_factor, min=0.0, max=3.0, step=0.05, description="capacity f."),
        "skew": w.FloatSlider(value=skew, min=0.0, max=4.0, step=0.1, description="router skew"),
    }
    fig = go.FigureWidget(routing_figure([[0] * n_experts]))
    text = w.HTML()

    def redraw(*_):
        E, k = controls["n_experts"].value, controls["top_k"].value
        cf = controls["capacity_factor"].value or None
        if k > E:
            text.value = f"<b>top_k={k} exceeds n_experts={E}</b>: try top_k in 1..{E}"
            return
        sim = simulate_routing(
            n_experts=E, top_k=k, tokens=tokens, capacity_factor=cf, skew=controls["skew"].value, steps=steps
        )
        new = routing_figure(sim.counts, sim.kept, sim.capacity, title=f"simulated router: {E} experts, top-{k}")
        with fig.batch_update():
            for old, fresh in zip(fig.data, new.data):
                old.update(fresh.to_plotly_json())
            fig.layout.title, fig.layout.annotations = new.layout.title, new.layout.annotations
        g = ep if E % ep == 0 else 1
        per_rank = [[c // g for c in step] for step in sim.kept]  # even split of the tokens over g ranks
        b = alltoall_bytes_per_step(kept_counts([per_rank[-1]] * g, None), g, hidden)[0] / 4 if g > 1 else 0.0
        drops = 1 - sum(map(sum, sim.kept)) / sum(map(sum, sim.counts))
        text.value = (
            f"capacity {sim.capacity if sim.capacity else 'none (no drops)'} slots per expert; "
            f"dropped {drops:.1%} of slots; imbalance {sum(imbalance(c) for c in sim.counts) / steps:.2f}; "
            f"load entropy {sum(load_entropy(c) for c in sim.counts) / steps:.2f} (1 = even); "
            f"about {format_value(b)} bytes per all-to-all per rank with ep={g}, h={hidden}, fp32"
        )
        text.value = html.unescape(text.value)

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    real = []
    if last_run:
        real = [go.FigureWidget(routing_figure(**run_routing(last_run, layer), title=f"last real run: layer {layer}"))]
    return w.VBox([w.HBox(list(controls.values())[:2]), w.HBox(list(controls.values())[2:]), text, fig, *real])


__all__ = ["bytes_figure", "routing_dashboard", "routing_figure", "routing_over_steps", "run_routing"]
