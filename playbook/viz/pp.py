"""Show pipelines: Gantt charts of schedules (simulated or measured), bubble against m, peak
activations per stage, and an explorer widget wiring p, m, v and the schedule to them.

Figures are pure (a ``Timeline`` or plain numbers in, a plotly figure out); the widget only wires
controls to them. Timelines from ``playbook.theory.pp.simulator.simulate`` are in cost units (F = 1
by default); measured ones from ``playbook.measure.pipeline.measured_timeline`` in seconds, drawn in ms.
"""

from __future__ import annotations


import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.theory.pp.simulator import Costs, Timeline, simulate
from playbook.theory.pp.schedules import SCHEDULES, V_SCHEDULES, chunks_per_rank, closed_form, make_schedule
from playbook.viz.figures import fitted_title

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
    head, top = fitted_title(
        f"{title}<br><sup>bubble: idle/total {b['idle_over_total']:.1%}, "
        f"bubble/ideal {b['bubble_over_ideal']:.1%}</sup>",
        70,
    )
    fig.update_layout(
        barmode="overlay",
        height=120 + 40 * tl.p + top - 70,
        title=head,
        xaxis=dict(title=f"time ({unit})", range=[0, tl.makespan * scale * 1.01]),
        yaxis=dict(categoryorder="array", categoryarray=ranks, autorange="reversed"),
        margin=dict(l=60, r=20, t=top, b=45),
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


__all__ = ["activation_bars", "bubble_vs_m", "gantt", "gantt_pair"]
