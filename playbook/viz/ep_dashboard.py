"""Chapter 6's routing dashboard: experts, top-k, capacity factor and skew in; a simulated routing's tokens
per expert, drops and all-to-all bytes out (``theory.moe.moe``), beside the last real run's routing.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go

from playbook.theory.moe.comm import alltoall_bytes_per_step
from playbook.theory.moe.capacity import imbalance, kept_counts, load_entropy, simulate_routing
from playbook.viz.figures import format_value
from playbook.viz.ep import routing_figure


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

    from playbook.viz.widgets import mark_stale, refusal

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
            text.value = refusal("Cannot route", f"top_k={k} exceeds n_experts={E}: try top_k in 1..{E}")
            mark_stale(fig)
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
