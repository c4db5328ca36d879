"""Figures of chapter 7's engine sections: prefix-cache hits per layout, step times with and without
chunked prefill, a serve-bench report's percentiles (pure: plain data -> plotly figures)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from playbook.viz.figures import figure_layout
from playbook.viz.mesh_layout import PALETTE


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
    return figure_layout(fig, title=title)


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
    return figure_layout(fig, title=title)


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
    return figure_layout(fig, title=title)


def chunked_p99(rows: Sequence[Mapping], *, title: str = "") -> go.Figure:
    """Chunked prefill before/after: p99 TPOT and inter-token latency (ms) per schedule, measured
    beside the roofline's time for the same schedule (rows: ``schedule`` and those four keys)."""
    fig = go.Figure()
    series = (
        ("TPOT p99 measured", "tpot_measured"),
        ("TPOT p99 predicted at scale", "tpot_predicted"),
        ("inter-token p99 measured", "itl_measured"),
        ("inter-token p99 predicted at scale", "itl_predicted"),
    )
    for k, (name, key) in enumerate(series):
        ys = [1e3 * r[key] for r in rows]
        fig.add_bar(
            name=name,
            x=[r["schedule"] for r in rows],
            y=ys,
            marker_color=PALETTE[k % len(PALETTE)],
            marker_pattern_shape="/" if "predicted" in name else "",
            text=[f"{y:,.0f}" for y in ys],
            textposition="outside",
            cliponaxis=False,
        )
    fig.update_layout(barmode="group", yaxis_title="p99 (ms)")
    return figure_layout(fig, title=title)


def disagg_costs(rows: Sequence[Mapping], links: Sequence[str], *, title: str = "") -> go.Figure:
    """Per prompt length: the prefill a co-located decode waits for, against the KV transfer over
    each link (ms, log axis); rows: ``prompt``, ``prefill``, and one key per link (seconds)."""
    fig = go.Figure()
    x = [f"{r['prompt']:,} tokens" for r in rows]
    fig.add_bar(
        name="prefill (a co-located decode's stall)", x=x, y=[1e3 * r["prefill"] for r in rows], marker_color="#444444"
    )
    for k, link in enumerate(links):
        fig.add_bar(
            name=f"KV transfer, {link}", x=x, y=[1e3 * r[link] for r in rows], marker_color=PALETTE[k % len(PALETTE)]
        )
    # one tick per power of ten: a log axis labels every minor digit otherwise
    fig.update_layout(
        barmode="group", yaxis_type="log", yaxis_dtick=1, yaxis_title="milliseconds (log)", xaxis_title="prompt"
    )
    return figure_layout(fig, title=title)
