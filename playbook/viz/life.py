"""Chapter 10's figures and its goodput dashboard: goodput against the checkpoint interval with
Young's and Daly's optimum marked (``theory.life``), and a rank's last iterations with their input
waits (the tracer's spans).

The dashboard follows the book's stale-state rule (``viz.widgets``): settings the calculators refuse
(a save of two MTBFs or more: no interval keeps up) leave the figure as it was, "(stale)" after its
title, and a red line saying why; the next valid settings redraw it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go

from playbook.theory.life import best_interval, cluster_mtbf, daly_interval, goodput, young_interval
from playbook.viz.figures import figure_layout, timeline

GPUS = [1024, 4096, 8192, 16_384, 32_768, 65_536, 131_072]
RATE_SCALES = [0.25, 0.5, 1.0, 2.0, 4.0]  # × Llama 3's failures per GPU-hour
SAVES = [0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0]  # seconds per checkpoint save


def _seconds(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _minutes(s: float) -> float:
    return s / 60.0


def goodput_figure(
    save: float, mtbf: float, restart: float = 0.0, *, interval: float | None = None, title: str = ""
) -> go.Figure:
    """Goodput (exact for exponential failures, Daly 2006) against the checkpoint interval in minutes,
    log scale from ~save/3 to 3 MTBFs; Young's and Daly's intervals as vertical lines, ``interval``
    (the dashboard's choice) as a point on the curve."""
    young, daly = young_interval(save, mtbf), daly_interval(save, mtbf)
    lo, hi = max(save / 3.0, 1e-3 * young), 3.0 * mtbf
    xs = [lo * (hi / lo) ** (i / 199) for i in range(200)]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            name="goodput",
            x=[_minutes(x) for x in xs],
            y=[goodput(x, save, mtbf, restart) for x in xs],
            mode="lines",
            line=dict(width=2.5, color="#3b7dd8"),
            hovertemplate="every %{x:.2f} min: goodput %{y:.2%}<extra></extra>",
        )
    )
    for name, x, dash, color in (("Young (1974)", young, "dash", "#e4572e"), ("Daly (2006)", daly, "dot", "#52a852")):
        g = goodput(x, save, mtbf, restart)
        fig.add_trace(
            go.Scatter(
                name=f"{name}: {_minutes(x):.2f} min, {g:.2%}",
                x=[_minutes(x)] * 2,
                y=[0.0, 1.0],
                mode="lines",
                line=dict(dash=dash, color=color, width=2),
                hovertemplate=f"{name}: every %{{x:.2f}} min<extra></extra>",
            )
        )
    if interval is not None:
        g = goodput(interval, save, mtbf, restart)
        fig.add_trace(
            go.Scatter(
                name=f"chosen: {_minutes(interval):.2f} min, {g:.2%}",
                x=[_minutes(interval)],
                y=[g],
                mode="markers",
                marker=dict(size=12, color="#6c71c4", symbol="diamond"),
                hovertemplate="chosen: every %{x:.2f} min, goodput %{y:.2%}<extra></extra>",
            )
        )
    best = goodput(best_interval(save, mtbf, restart), save, mtbf, restart)
    floor = max(0.0, min(goodput(x, save, mtbf, restart) for x in (xs[0], xs[-1])))
    return figure_layout(
        fig,
        title=title or f"save {save:.3g} s, MTBF {mtbf / 3600:.3g} h, restart {restart:.3g} s: best goodput {best:.2%}",
        xaxis=dict(title="work between checkpoints (minutes, log)", type="log"),
        yaxis=dict(title="goodput (kept work / wall time)", tickformat=".0%", range=[floor, 1.0]),
        legend=dict(orientation="h", y=-0.25),
    )


def iterations_figure(spans: Sequence[Mapping], *, last: int = 3, title: str = "") -> go.Figure:
    """Every rank's last ``last`` iterations: the ``"input wait"`` before each step, the step, and its
    collectives (``figures.timeline``), from a call's trace (``Ranks.last_trace``)."""
    steps = sorted(
        {int(s["name"].split()[1]) for s in spans if s["kind"] == "compute" and s["name"].startswith("step ")}
    )
    if not steps:
        return timeline([], title=title)
    first = steps[-last] if len(steps) >= last else steps[0]
    starts = [s["start"] for s in spans if s["kind"] == "compute" and s["name"] == f"step {first}"]
    previous = [s["end"] for s in spans if s["kind"] == "compute" and s["name"] == f"step {first - 1}"]
    t0 = min(previous) if previous else min(starts)
    shown = [s for s in spans if s.get("end") is not None and s["start"] >= t0]

    def label(s):  # every step is one "step" bar; a collective by its mesh axis
        if s["kind"] == "comm":
            return f"{s.get('axis') or ''} {s['name']}".strip()
        return "step" if s["name"].startswith("step ") else s["name"]

    shown = [{**s, "name": label(s)} for s in shown]
    return timeline(shown, title=title or f"the last {last} iterations on every rank")


def goodput_dashboard(
    *, gpus: int = 16_384, save: float = 3.0, restart: float = 300.0, failures_per_gpu_hour: float | None = None
):
    """Controls: GPUs, failure rate (× Llama 3's), save time, restart and the chosen interval ->
    :func:`goodput_figure`, and a line with the numbers. The interval slider is in multiples of
    Daly's interval, so it stays on the curve whatever the other settings."""
    import ipywidgets as w

    from playbook.theory.life import LLAMA3_FAILURES_PER_GPU_HOUR
    from playbook.viz.widgets import fit_controls, mark_stale, refusal, show_figure

    base = failures_per_gpu_hour or LLAMA3_FAILURES_PER_GPU_HOUR
    controls = {
        "gpus": w.Dropdown(options=GPUS if gpus in GPUS else sorted({*GPUS, gpus}), value=gpus, description="GPUs"),
        "rate": w.Dropdown(options=[(f"{k:g}× Llama 3", k) for k in RATE_SCALES], value=1.0, description="failures"),
        "save": w.SelectionSlider(options=sorted({*SAVES, save}), value=save, description="save (s)"),
        "restart": w.FloatSlider(value=restart, min=0, max=3600, step=60, description="restart (s)"),
        "interval": w.FloatLogSlider(value=1.0, base=10, min=-1, max=1, step=0.05, description="× Daly"),
    }
    fit_controls(controls.values())
    fig = go.FigureWidget()
    text = w.HTML()

    def redraw(*_):
        c = {k: v.value for k, v in controls.items()}
        mtbf = cluster_mtbf(c["gpus"], base * c["rate"])
        if c["save"] >= 2 * mtbf:
            text.value = refusal(
                "Cannot keep up",
                f"a {_seconds(c['save'])} s save is over two MTBFs ({_seconds(2 * mtbf)} s at {c['gpus']:,} GPUs): no checkpoint "
                "interval makes progress; try fewer GPUs, a lower failure rate or a faster save",
            )
            mark_stale(fig)
            return
        daly = daly_interval(c["save"], mtbf)
        chosen = daly * c["interval"]
        title = (
            f"{c['gpus']:,} GPUs, MTBF {mtbf / 3600:.3g} h, save {_seconds(c['save'])} s, restart {c['restart']:.0f} s"
        )
        show_figure(fig, goodput_figure(c["save"], mtbf, c["restart"], interval=chosen, title=title))
        g, gd = goodput(chosen, c["save"], mtbf, c["restart"]), goodput(daly, c["save"], mtbf, c["restart"])
        text.value = (
            f"checkpoint every {chosen / 60:.2f} min: goodput {g:.2%} ({(gd - g) * 100:+.2f} points from Daly's "
            f"{daly / 60:.2f} min); a failure every {mtbf / 3600:.2f} h costs on average half an interval of work and "
            f"a restart, {(chosen / 2 + c['restart']) / 60:.1f} min"
        )

    for ctl in controls.values():
        ctl.observe(redraw, names="value")
    redraw()
    box = w.VBox([w.HBox(list(controls.values())[:3]), w.HBox(list(controls.values())[3:]), text, fig])
    box.controls, box.figure, box.message = controls, fig, text
    return box
