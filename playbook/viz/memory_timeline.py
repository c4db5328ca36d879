"""Show one training step's memory over time, stacked by category (``measure.memory_timeline``'s
timeline), with the step's phases shaded, its peak marked, a budget line and, for comparison, the
total of other runs of the same step. Pure: a timeline in, a plotly figure out.
"""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from playbook.viz.figures import CATEGORY_LABELS, figure_layout, format_value, unit_scale
from playbook.viz.memory_figures import category_color

# Bottom to top: what is held all step first, then what comes and goes.
STACK_ORDER = ("params", "optimizer", "inputs", "grads", "activations", "autograd detail", "temporaries", "unknown")
_OTHER_COLORS = ("#1b9e77", "#7570b3", "#e7298a", "#66a61e")


def memory_timeline_figure(
    timeline,
    *,
    others: Mapping[str, object] | None = None,
    budget: float | None = None,
    unit: str = "MB",
    title: str = "",
) -> go.Figure:
    """Bytes held over one step, one stacked area per category that is ever non-zero.

    ``timeline`` has ``times_ms``, ``series`` ({category: bytes per time}), ``phases`` ({name: (start,
    end) ms}), ``total`` and ``peak_index`` (a ``measure.memory_timeline.MemoryTimeline``). Each
    backward phase is shaded and every phase named at the top; the peak gets a marker with its value.
    ``others`` ({label: timeline}) adds each one's total as a line; ``budget`` (bytes) a dashed line.
    """
    scale = unit_scale(unit)
    fig = go.Figure()
    cats = [c for c in STACK_ORDER if any(timeline.series.get(c, ()))]
    cats += [c for c in timeline.series if c not in cats and any(timeline.series[c])]
    for i, cat in enumerate(cats):
        fig.add_trace(
            go.Scatter(
                x=timeline.times_ms,
                y=[b / scale for b in timeline.series[cat]],
                name=CATEGORY_LABELS.get(cat, cat),
                stackgroup="step",
                mode="lines",
                line=dict(width=0.5, color=category_color(cat, i)),
                hovertemplate=f"<b>{CATEGORY_LABELS.get(cat, cat)}</b><br>%{{x:.1f}} ms: %{{y:,.4g}} {unit}<extra></extra>",
            )
        )
    for j, (label, other) in enumerate((others or {}).items()):
        fig.add_trace(
            go.Scatter(
                x=other.times_ms,
                y=[b / scale for b in other.total],
                name=f"total: {label}",
                mode="lines",
                line=dict(width=2, dash="dot", color=_OTHER_COLORS[j % len(_OTHER_COLORS)]),
                hovertemplate=f"<b>{label}</b><br>%{{x:.1f}} ms: %{{y:,.4g}} {unit}<extra></extra>",
            )
        )
    for name, (start, end) in timeline.phases.items():
        if name.startswith("backward"):
            fig.add_vrect(x0=start, x1=end, fillcolor="#888", opacity=0.08, line_width=0, layer="below")
        fig.add_annotation(
            x=(start + end) / 2, y=1, yref="paper", yanchor="bottom", showarrow=False, text=name, font=dict(size=11)
        )
    i = timeline.peak_index
    peak = timeline.total[i]
    fig.add_trace(
        go.Scatter(
            x=[timeline.times_ms[i]],
            y=[peak / scale],
            mode="markers+text",
            marker=dict(size=9, color="#222", symbol="diamond"),
            text=[f"peak {format_value(peak / scale)} {unit}"],
            textposition="top right",
            name="peak",
            showlegend=False,
            hovertemplate=f"peak: %{{y:,.4g}} {unit} at %{{x:.1f}} ms<extra></extra>",
        )
    )
    if budget is not None:
        fig.add_hline(
            y=budget / scale,
            line_dash="dash",
            line_color="#444",
            line_width=1.5,
            annotation_text=f"budget {format_value(budget / scale)} {unit}",
            annotation_position="bottom right",
        )
    top = max([peak, budget or 0.0, *(max(o.total) for o in (others or {}).values())]) / scale
    figure_layout(
        fig,
        title=title,
        height=430,
        xaxis=dict(title="time since the step began (ms)"),
        yaxis=dict(title=f"memory held ({unit})", range=[0, top * 1.15], rangemode="tozero"),
        legend=dict(title="category", traceorder="normal"),
    )
    fig.update_layout(margin_t=80 if title else 40)  # room for the phase names above the plot
    return fig
