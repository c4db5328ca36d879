"""Show training steps' memory over time, stacked by category (``measure.memory_timeline``'s timelines):
one panel per run on one memory scale, each with its step's phases shaded and named, its peak marked
and a budget line. Pure: timelines in, a plotly figure out.
"""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.viz.figures import CATEGORY_LABELS, figure_layout, format_value, unit_scale
from playbook.viz.memory_figures import category_color

# Bottom to top: what is held all step first, then what comes and goes.
STACK_ORDER = ("params", "optimizer", "inputs", "grads", "activations", "autograd detail", "temporaries", "unknown")
PANEL_HEIGHT = 300


def memory_timeline_figure(
    timelines,
    *,
    budget: float | None = None,
    unit: str = "MB",
    title: str = "",
) -> go.Figure:
    """Bytes held over a step, one stacked area per category that is ever non-zero; one panel per run.

    ``timelines``: one timeline, or ``{label: timeline}`` for several runs (one panel each, top to
    bottom, the same y range). A timeline has ``times_ms``, ``series`` ({category: bytes per time}),
    ``phases`` ({name: (start, end) ms}), ``total`` and ``peak_index`` (a
    ``measure.memory_timeline.MemoryTimeline``). In each panel the backward phases are shaded and every
    phase is named at the top, and the peak is marked with its value; ``budget`` (bytes) is a dashed line.
    """
    runs = dict(timelines) if isinstance(timelines, Mapping) else {"": timelines}
    scale = unit_scale(unit)
    labels = list(runs)
    fig = make_subplots(rows=len(runs), cols=1, subplot_titles=labels if any(labels) else None, vertical_spacing=0.14)
    shown: set[str] = set()
    for row, run in enumerate(runs.values(), start=1):
        cats = [c for c in STACK_ORDER if any(run.series.get(c, ()))]
        cats += [c for c in run.series if c not in cats and any(run.series[c])]
        for i, cat in enumerate(cats):
            label = CATEGORY_LABELS.get(cat, cat)
            fig.add_trace(
                go.Scatter(
                    x=run.times_ms,
                    y=[b / scale for b in run.series[cat]],
                    name=label,
                    legendgroup=cat,
                    showlegend=cat not in shown,
                    stackgroup=f"run {row}",
                    mode="lines",
                    line=dict(width=0.5, color=category_color(cat, i)),
                    hovertemplate=f"<b>{label}</b><br>%{{x:.1f}} ms: %{{y:,.4g}} {unit}<extra></extra>",
                ),
                row=row,
                col=1,
            )
            shown.add(cat)
        _phases_and_peak(fig, run, row, scale, unit)
    top = max([budget or 0.0, *(max(r.total) for r in runs.values())]) / scale
    for row in range(1, len(runs) + 1) if budget is not None else ():
        axis = "" if row == 1 else str(row)
        fig.add_hline(y=budget / scale, line_dash="dash", line_color="#444", line_width=1.5, row=row, col=1)
        fig.add_annotation(
            x=1, xref=f"x{axis} domain", y=budget / scale, yref=f"y{axis}", xanchor="right", yanchor="top",
            showarrow=False, text=f"budget {format_value(budget / scale)} {unit}", font_color="#444",
        )  # fmt: skip
    fig.update_yaxes(title_text=f"held ({unit})", range=[0, top * 1.2])
    fig.update_xaxes(title_text="time since the step began (ms)", row=len(runs), col=1)
    figure_layout(
        fig, title=title, height=PANEL_HEIGHT * len(runs) + 90, legend=dict(title="category", traceorder="normal")
    )
    return fig


def _phases_and_peak(fig: go.Figure, run, row: int, scale: float, unit: str) -> None:
    axis = "" if row == 1 else str(row)
    for name, (start, end) in run.phases.items():
        if name.startswith("backward"):
            fig.add_vrect(x0=start, x1=end, fillcolor="#888", opacity=0.08, line_width=0, layer="below", row=row, col=1)
        fig.add_annotation(
            x=(start + end) / 2, xref=f"x{axis}", y=1, yref=f"y{axis} domain", yanchor="top", showarrow=False,
            text=name, font=dict(size=10, color="#555"),
        )  # fmt: skip
    i = run.peak_index
    fig.add_trace(
        go.Scatter(
            x=[run.times_ms[i]],
            y=[run.total[i] / scale],
            mode="markers+text",
            marker=dict(size=9, color="#222", symbol="diamond"),
            text=[f"peak {format_value(run.total[i] / scale)} {unit}"],
            textposition="middle right",
            name="peak",
            showlegend=False,
            hovertemplate=f"peak: %{{y:,.4g}} {unit} at %{{x:.1f}} ms<extra></extra>",
        ),
        row=row,
        col=1,
    )
