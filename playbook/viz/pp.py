"""Show pipelines: Gantt charts of schedules (simulated or measured), bubble against m, peak
activations per stage, and an explorer widget wiring p, m, v and the schedule to them.

Figures are pure (a ``Timeline`` or plain numbers in, a plotly figure out); the widget only wires
controls to them. Timelines from ``playbook.theory.schedule_simulator.simulate`` are in cost units (F = 1
by default); measured ones from ``playbook.measure.pipeline.measured_timeline`` in seconds, drawn in ms.
"""

from __future__ import annotations

import html

import ipywidgets as w
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.theory.schedule_simulator import Costs, Timeline, simulate
from playbook.theory.schedules import SCHEDULES, V_SCHEDULES, chunks_per_rank, closed_form, make_schedule
from playbook.viz.widgets import fit_controls, show_figure

KIND_COLORS = {"F": "#3b7dd8", "B": "#e4572e", "W": "#52a852"}
KIND_NAMES = {"F": "forward F", "B": "backward B", "W": "weight grad W"}


def _bars(fig: go.Figure, tl: Timeline, scale: float, upto: float | None, row=None, show_legend=True) -> None:
    for kind in ("F", "B", "W"):
        slots = [s for s in tl.slots if s.kind == kind and (upto is None or s.start < upto)]
        if not slots:
            continue
        t0 = tl.start
        ends = [min(s.end, upto) if upto is not None else s.end for s in slots]
        trace = go.Bar(
            name=KIND_NAMES[kind],
            legendgroup=kind,
            showlegend=show_legend,
            orientation="h",
            y=[f"rank {s.rank}" for s in slots],
            base=[(s.start - t0) * scale for s in slots],
            x=[(e - s.start) * scale for s, e in zip(slots, ends)],
            text=[f"{s.mb}" + (f".{s.chunk}" if s.chunk else "") for s in slots],
            textposition="inside",
            insidetextanchor="middle",
            textfont=dict(color="white", size=10),
            marker=dict(color=KIND_COLORS[kind], line=dict(width=0.5, color="white")),
            customdata=[[s.mb, s.chunk, (s.end - s.start) * scale] for s in slots],
            hovertemplate=f"<b>{kind}</b> micro-batch %{{customdata[0]}}, chunk %{{customdata[1]}}<br>"
            "start %{base:.3g}, duration %{customdata[2]:.3g}<extra></extra>",
        )
        fig.add_trace(trace, row=row, col=1 if row else None)


def gantt(tl: Timeline, *, title: str = "", unit: str = "units", upto: float | None = None) -> go.Figure:
    """One row per rank, one bar per compute action, labelled ``micro-batch[.chunk]``; ``unit`` "ms"
    scales seconds to milliseconds. ``upto`` draws only what has started by then (a step of an
    animation). The title carries both bubble fractions."""
    scale = 1e3 if unit == "ms" else 1.0
    fig = go.Figure()
    _bars(fig, tl, scale, upto)
    b = tl.bubble()
    ranks = [f"rank {r}" for r in range(tl.p)]
    fig.update_layout(
        barmode="overlay",
        height=120 + 40 * tl.p,
        title=dict(
            text=f"{title}<br><sup>bubble: idle/total {b['idle_over_total']:.1%}, "
            f"bubble/ideal {b['bubble_over_ideal']:.1%}</sup>",
            x=0.01,
        ),
        xaxis=dict(title=f"time ({unit})", range=[0, tl.makespan * scale * 1.01]),
        yaxis=dict(categoryorder="array", categoryarray=ranks, autorange="reversed"),
        margin=dict(l=60, r=20, t=70, b=45),
        legend=dict(orientation="h", y=-0.35 if tl.p <= 2 else -0.2),
    )
    return fig


def gantt_pair(simulated: Timeline, measured: Timeline, *, title: str = "") -> go.Figure:
    """The simulated and the measured timeline of one step, one above the other, both in ms."""
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.16,
        subplot_titles=[
            f"simulated from measured costs: idle/total {simulated.bubble_over_total:.1%}",
            f"measured on real ranks: idle/total {measured.bubble_over_total:.1%}",
        ],
    )
    _bars(fig, simulated, 1e3, None, row=1)
    _bars(fig, measured, 1e3, None, row=2, show_legend=False)
    ranks = [f"rank {r}" for r in range(simulated.p)]
    for row in (1, 2):
        fig.update_yaxes(categoryorder="array", categoryarray=ranks, autorange="reversed", row=row, col=1)
    fig.update_xaxes(title_text="time (ms)", row=2, col=1)
    fig.update_layout(
        barmode="overlay",
        height=200 + 80 * simulated.p,
        title=dict(text=title, x=0.01),
        margin=dict(l=60, r=20, t=80, b=45),
    )
    return fig


def bubble_vs_m(
    p: int, ms: list[int], *, v: int = 2, definition: str = "bubble_over_ideal", costs: Costs | None = None
) -> go.Figure:
    """Simulated bubble (markers) and the closed form (lines) against m for each schedule at p ranks
    (interleaved with v chunks, only at m a multiple of p; ZB-H1's formula only for m >= p). The V
    schedules (two chunks per rank) have no closed form, only markers; DualPipe-V only at m >= 2p."""
    costs = costs or Costs()
    fig = go.Figure()
    colors = {"gpipe": "#7f7f7f", "1f1b": "#3b7dd8", "interleaved": "#8a63b8", "zb-h1": "#52a852"}
    colors |= {"zb-v": "#d9822b", "dualpipe-v": "#c0392b"}
    for name in (*SCHEDULES, *V_SCHEDULES):
        vv = chunks_per_rank(name, v)
        xs = [m for m in ms if not (name == "interleaved" and m % p) and not (name == "dualpipe-v" and m < 2 * p)]
        sim = [simulate(make_schedule(name, p, m, vv), costs).bubble()[definition] for m in xs]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=sim,
                mode="markers",
                name=f"{name} (simulated)",
                legendgroup=name,
                marker=dict(color=colors[name], size=9, symbol="circle-open"),
            )
        )
        if costs == Costs() and name not in V_SCHEDULES:
            form = [closed_form(name, p, m, vv)[definition] if (m >= p or name != "zb-h1") else None for m in xs]
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=form,
                    mode="lines",
                    name=f"{name} (closed form)",
                    legendgroup=name,
                    line=dict(color=colors[name], dash="dot" if name == "gpipe" else "solid"),
                )
            )
    label = "bubble / ideal time" if definition == "bubble_over_ideal" else "idle / total time"
    fig.update_layout(
        height=380,
        title=dict(text=f"bubble vs micro-batches, p={p} (v={v} for interleaved, 2 for the V)", x=0.01),
        xaxis=dict(title="m (micro-batches per step)", type="log", tickvals=ms),
        yaxis=dict(title=label, tickformat=".0%"),
        margin=dict(l=60, r=20, t=50, b=45),
    )
    return fig


def activation_bars(
    predicted: list[float], measured: list[float] | None = None, *, unit: str = "micro-batches", title: str = ""
) -> go.Figure:
    """Peak held activations per rank: predicted (and measured) side by side."""
    ranks = [f"rank {r}" for r in range(len(predicted))]
    fig = go.Figure(go.Bar(name="predicted", x=ranks, y=predicted, marker_color="#9fb7d9"))
    if measured is not None:
        text = ["exact" if m == p else f"{(m - p) / p:+.1%}" for p, m in zip(predicted, measured)]
        fig.add_trace(
            go.Bar(name="measured", x=ranks, y=measured, marker_color="#2f4b7c", text=text, textposition="outside")
        )
    fig.update_layout(
        barmode="group",
        height=320,
        title=dict(text=title, x=0.01),
        yaxis=dict(title=f"peak held ({unit})"),
        margin=dict(l=60, r=20, t=50, b=40),
    )
    return fig


def pipeline_explorer(
    *,
    p: int = 4,
    m: int = 8,
    v: int = 2,
    schedule: str = "1f1b",
    last_run: Timeline | None = None,
    last_run_label: str = "",
) -> w.VBox:
    """Controls p, m, v, schedule and a time step -> the Gantt chart up to that step, both bubble
    fractions, and the peak activations per rank (1F1B: p − r; GPipe: m); under it bubble vs m,
    and, if given, the last real run's measured Gantt, titled with ``last_run_label`` (what was run,
    e.g. "1f1b, p=2, m=4") so it is not mistaken for the simulation above it.
    ``.controls``, ``.figure``, ``.message``."""
    c = {
        "schedule": w.ToggleButtons(options=[*SCHEDULES, *V_SCHEDULES], value=schedule, description="schedule"),
        "p": w.IntSlider(min=1, max=8, value=p, description="p (ranks)"),
        "m": w.IntSlider(min=1, max=32, value=m, description="m (micro-b.)"),
        "v": w.IntSlider(min=1, max=4, value=v, description="v (chunks)"),
        "t": w.FloatSlider(min=0, max=1, step=0.02, value=1, description="time", readout_format=".0%"),
    }
    fit_controls(c.values(), "110px")
    fig, bubble_fig, message = go.FigureWidget(), go.FigureWidget(), w.HTML()

    def update(_change=None) -> None:
        s = {k: ctl.value for k, ctl in c.items()}
        is_v = s["schedule"] in V_SCHEDULES  # the V placement: always two chunks per rank
        vv = chunks_per_rank(s["schedule"], s["v"])
        c["v"].disabled = s["schedule"] != "interleaved"  # only the interleaved schedule has a choice of chunks
        c["v"].tooltip = "chunks per rank: the interleaved schedule takes any v; zb-v and dualpipe-v have 2"
        try:
            sched = make_schedule(s["schedule"], s["p"], s["m"], vv)
        except ValueError as e:
            message.value = f"<span style='color:#c62828'><b>Not a valid schedule:</b> {html.escape(str(e))}</span>"
            return
        tl = simulate(sched)
        new = gantt(
            tl,
            upto=s["t"] * tl.makespan + 1e-9,
            title=f"{s['schedule']}: p={s['p']}, m={s['m']}"
            + (f", v={vv}" if vv > 1 else "")
            + " (F = 1, B = 1, W = 1)",
        )
        show_figure(fig, new)
        unit = "chunk activations" if vv > 1 else "micro-batches"
        message.value = (
            f"bubble: idle/total <b>{tl.bubble_over_total:.1%}</b>, bubble/ideal <b>{tl.bubble_over_ideal:.1%}</b> "
            + (
                "(V placement: 2p stages, rank r holds r and 2p − 1 − r; no closed form, simulated)<br>"
                if is_v
                else f"(closed form {closed_form(s['schedule'], s['p'], s['m'], vv)['bubble_over_ideal']:.1%})<br>"
            )
            + f"peak activations held per rank ({unit}): until B {tl.peak_in_flight}"
            + (f", until W {tl.peak_held}" if sched.split_backward else "")
            + (
                f"<br><i>{c['v'].description}: off, "
                + ("the V has 2 per rank.</i>" if is_v else "only the interleaved schedule has chunks.</i>")
                if c["v"].disabled
                else ""
            )
        )
        if _change is None or _change["owner"] in (c["p"], c["v"]):  # bubble vs m depends on p and v only
            show_figure(bubble_fig, bubble_vs_m(s["p"], [1, 2, 4, 8, 16, 32], v=max(2, vv)))

    for ctl in c.values():
        ctl.observe(update, names="value")
    update()
    parts = [w.HBox([w.VBox([c["schedule"], c["t"]]), w.VBox([c["p"], c["m"], c["v"]])]), fig, message, bubble_fig]
    if last_run is not None:
        what = last_run_label or f"p={last_run.p}"
        title = f"measured on real ranks: {what} (fixed; the controls drive the simulation above)"
        parts.append(go.FigureWidget(gantt(last_run, unit="ms", title=title)))
    box = w.VBox(parts)
    box.controls, box.figure, box.bubble_figure, box.message, box.update = c, fig, bubble_fig, message, update
    return box


__all__ = ["activation_bars", "bubble_vs_m", "gantt", "gantt_pair", "pipeline_explorer"]
