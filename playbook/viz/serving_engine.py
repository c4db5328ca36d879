"""Figures of chapter 7's engine sections: prefix-cache hits per layout, step times with and without
chunked prefill, a serve-bench report's percentiles (pure: plain data -> plotly figures)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from playbook.viz.figures import _layout
from playbook.viz.mesh import PALETTE


def prefix_hits(series: Mapping[str, Sequence[Mapping]], *, title: str = "") -> go.Figure:
    """Grouped bars: hit rate (%) per layout, one bar per series (e.g. predicted / measured, by router)."""
    fig = go.Figure()
    for k, (name, rows) in enumerate(series.items()):
        fig.add_bar(
            name=name,
            x=[r["layout"] for r in rows],
            y=[100 * r["hit_rate"] for r in rows],
            marker_color=PALETTE[k % len(PALETTE)],
            text=[f"{100 * r['hit_rate']:.0f}%" for r in rows],
            textposition="outside",
        )
    fig.update_layout(barmode="group", yaxis_title="prompt tokens found cached (%)", yaxis_range=[0, 100])
    return _layout(fig, title=title)


def step_times(runs: Mapping[str, Sequence[float]], *, title: str = "") -> go.Figure:
    """Each scheduler step's seconds (ms), one line per run: a stalled step stands out as a spike."""
    fig = go.Figure()
    for k, (name, seconds) in enumerate(runs.items()):
        fig.add_scatter(
            name=name,
            x=list(range(len(seconds))),
            y=[1e3 * s for s in seconds],
            mode="lines+markers",
            line_color=PALETTE[k % len(PALETTE)],
        )
    fig.update_layout(xaxis_title="scheduler step", yaxis_title="step time (ms)")
    return _layout(fig, title=title)


def latency_percentiles(report: Mapping, *, title: str = "") -> go.Figure:
    """A serve-bench report: p50/p90/p99 (ms) of TTFT, TPOT, inter-token and e2e, grouped by metric."""
    fig = go.Figure()
    metrics = ("ttft", "tpot", "itl", "e2e")
    for k, q in enumerate(("p50", "p90", "p99")):
        ys = [1e3 * report["measured"][m][q] for m in metrics]
        fig.add_bar(name=q, x=list(metrics), y=ys, marker_color=PALETTE[k], text=[f"{y:,.0f}" for y in ys])
    # linear, each bar labelled: a log axis over 40-900 ms printed every minor digit as a tick label
    fig.update_traces(textposition="outside", cliponaxis=False)
    fig.update_layout(barmode="group", yaxis_title="measured (ms)")
    return _layout(fig, title=title)
