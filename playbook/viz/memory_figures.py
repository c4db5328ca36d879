"""Show memory by category: stacked bars per configuration against a device's capacity
(``memory_bars``) and predicted beside measured bytes (``predicted_vs_measured``). Pure: bytes in,
plotly figure out; each category keeps its colour and label from ``playbook.viz.figures``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import plotly.graph_objects as go

from playbook.viz.figures import CATEGORY_COLORS, CATEGORY_LABELS, figure_layout, format_value, unit_scale

OFF_SCALE = 5  # memory_bars draws the capacity line only up to this many times the tallest bar
# Keys of a measured or predicted dict that are sums of the categories, not categories.
_TOTAL_KEYS = {"total", "peak", "cuda_allocated", "cuda_reserved"}
_EXTRA_COLORS = ["#3aa6a0", "#b8860b", "#d36fa5", "#7f7f7f", "#4c4c9d", "#9c6b30"]


def category_color(category: str, index: int = 0) -> str:
    return CATEGORY_COLORS.get(category, _EXTRA_COLORS[index % len(_EXTRA_COLORS)])


def _categories(dicts: Iterable[Mapping[str, float | None]]) -> list[str]:
    """Categories in a fixed order: the known ones first (as in CATEGORY_COLORS), then the rest as met."""
    seen: list[str] = []
    for d in dicts:
        for k in d:
            if k not in _TOTAL_KEYS and k not in seen:
                seen.append(k)
    known = [k for k in CATEGORY_COLORS if k in seen]
    return known + [k for k in seen if k not in CATEGORY_COLORS]


def memory_bars(
    budgets: Mapping[str, Mapping[str, float | None]],
    *,
    unit: str = "GB",
    capacity: float | None = None,
    capacity_label: str = "",
    title: str = "",
) -> go.Figure:
    """One stacked bar per budget, one coloured segment per memory category.

    ``budgets`` maps a bar's name to bytes by category, e.g.
    ``{"training (per rank)": training_memory(...).as_dict(), "inference (per rank)": ...}`` or
    ``{"predicted": ..., "measured": ...}``. Sums (``total``, ``peak``, ``cuda_*``) and ``None``
    values are ignored; a category that is zero in every budget is left out. One trace per
    category, named by :data:`CATEGORY_LABELS` with the key in ``legendgroup``; ``y`` is in
    ``unit`` and ``customdata`` holds the exact bytes. Each bar's total is written above it, and
    ``capacity`` (bytes, e.g. ``Hardware.usable_bytes``: what a fit is judged against) draws a dashed line labelled
    ``capacity_label``; when it is more than :data:`OFF_SCALE` times the tallest bar it is named
    in a note above the plot instead, so that small budgets stay readable.
    """
    scale = unit_scale(unit)
    names = list(budgets)
    fig = go.Figure()
    for i, cat in enumerate(_categories(budgets.values())):
        raw = [budgets[n].get(cat) for n in names]
        if not any(raw):
            continue
        byts = [None if v is None else float(v) for v in raw]
        fig.add_trace(
            go.Bar(
                name=CATEGORY_LABELS.get(cat, cat),
                legendgroup=cat,
                x=names,
                y=[None if b is None else b / scale for b in byts],
                customdata=byts,
                marker_color=category_color(cat, i),
                hovertemplate=(
                    f"<b>{CATEGORY_LABELS.get(cat, cat)}</b> (%{{x}})<br>"
                    f"%{{y:,.4g}} {unit}<br>%{{customdata:,.0f}} bytes<extra></extra>"
                ),
            )
        )
    totals = [sum(float(v) for k, v in budgets[n].items() if k not in _TOTAL_KEYS and v) for n in names]
    for name, total in zip(names, totals):
        fig.add_annotation(
            x=name,
            y=total / scale,
            text=f"<b>{format_value(total / scale)} {unit}</b>",
            showarrow=False,
            yanchor="bottom",
            yshift=3,
            font=dict(size=13),
        )
    tallest = max([*totals, 0.0])
    top = tallest
    if capacity is not None:
        label = f"{capacity_label or 'capacity'}: {format_value(capacity / scale)} {unit}"
        if tallest == 0 or capacity <= OFF_SCALE * tallest:
            top = max(top, capacity)
            fig.add_hline(
                y=capacity / scale,
                line_dash="dash",
                line_color="#444",
                line_width=1.5,
                annotation_text=label,
                annotation_position=_clear_side(totals, capacity),
                annotation_font_color="#444",
            )
        else:  # a line far above would flatten the bars: name it instead
            fig.add_annotation(
                xref="paper",
                yref="paper",
                x=1,
                y=1,
                xanchor="right",
                yanchor="bottom",
                showarrow=False,
                text=f"{label} (off the scale: {capacity / tallest:,.0f}× the tallest bar)",
                font_color="#444",
            )
    top = (top or 1) / scale
    return figure_layout(
        fig,
        title=title,
        barmode="stack",
        xaxis=dict(type="category"),
        yaxis=dict(title=f"memory ({unit})", range=[0, top * 1.15], rangemode="tozero"),
        legend=dict(title="category", traceorder="normal"),
        bargap=0.45,
    )


def _clear_side(totals: list[float], capacity: float) -> str:
    """Where the capacity line's label does not sit on a bar's total: above its right end, unless the
    last bar's total is near the line (then the left end, or below the line if both ends are)."""
    near = [abs(t - capacity) < 0.06 * max(*totals, capacity) for t in (totals[0], totals[-1])] if totals else [0, 0]
    return "top right" if not near[1] else "top left" if not near[0] else "bottom right"


def predicted_vs_measured(
    predicted: Mapping[str, float | None],
    measured: Mapping[str, float | None],
    *,
    unit: str = "KB",
    title: str = "",
) -> go.Figure:
    """Predicted and measured bytes side by side for each category (or each collective).

    Two traces, ``"predicted"`` and ``"measured"``, with ``x`` the categories (memory keys shown
    by their :data:`CATEGORY_LABELS`; other keys such as ``"all_reduce"`` as given), ``y`` in
    ``unit`` and the exact bytes in ``customdata``. The measured bars carry the relative
    difference (measured - predicted) / predicted as text, e.g. ``"+0.4%"`` (``"exact"`` when
    equal). Sums such as
    ``total`` are left out.
    """
    scale = unit_scale(unit)
    cats = _categories([predicted, measured])
    labels = [CATEGORY_LABELS.get(c, c) for c in cats]

    def diff(c: str) -> str:
        p, m = predicted.get(c), measured.get(c)
        if p is None or m is None:
            return "n/a"
        if m == p:
            return "exact"
        if p == 0:
            return "n/a"
        return f"{(m - p) / p:+.1%}"

    diffs = [diff(c) for c in cats]
    fig = go.Figure()
    for name, values, color in (("predicted", predicted, "#9fb7d9"), ("measured", measured, "#2f4b7c")):
        byts = [None if values.get(c) is None else float(values[c]) for c in cats]
        fig.add_trace(
            go.Bar(
                name=name,
                x=labels,
                y=[None if b is None else b / scale for b in byts],
                customdata=[[b, d] for b, d in zip(byts, diffs)],
                text=diffs if name == "measured" else None,
                textposition="outside",
                cliponaxis=False,
                marker_color=color,
                hovertemplate=(
                    f"<b>{name}</b> %{{x}}<br>%{{y:,.4g}} {unit}<br>%{{customdata[0]:,.0f}} bytes"
                    "<br>measured vs predicted: %{customdata[1]}<extra></extra>"
                ),
            )
        )
    return figure_layout(
        fig,
        title=title,
        barmode="group",
        yaxis=dict(title=f"bytes ({unit})", rangemode="tozero"),
        xaxis=dict(title=None, type="category"),
        legend=dict(title=None, orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
        uniformtext=dict(minsize=9, mode="show"),
    )
