"""Show a list of dicts as a plotly table: one column per key, numbers with about three significant
digits and thousands separators, each row as tall as its longest wrapped cell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from playbook.viz.figures import figure_layout, format_value


def table(rows: Sequence[Mapping], *, columns: Sequence[str] | None = None, title: str = "") -> go.Figure:
    """A plotly table of ``rows`` (dicts), one column per key (or ``columns``); numbers printed with
    about three significant digits and thousands separators (``format_value``)."""
    columns = list(columns or (rows[0] if rows else []))

    def cell(v) -> str:
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return "—" if v is None else str(v)
        if isinstance(v, int):  # counts stay whole: stage 3, 16 in flight
            return f"{v:,}"
        return format_value(float(v))

    values = [[cell(row.get(c)) for row in rows] for c in columns]
    numeric = [
        all(
            isinstance(row.get(c), (int, float)) and not isinstance(row.get(c), bool)
            for row in rows
            if row.get(c) is not None
        )
        for c in columns
    ]
    widths = [1.2] + [1] * (len(columns) - 1)
    chars = [max(6, 950 * w / sum(widths) / 7) for w in widths]  # characters per header line at ~7 px each
    lines = max([-(-len(c) // int(n)) for c, n in zip(columns, chars)] or [1])
    header = 14 + 17 * lines
    # a cell's text wraps at its column's width: each row as tall as its longest cell
    row_lines = [
        max([-(-len(values[j][i]) // int(chars[j])) for j in range(len(columns))] or [1]) for i in range(len(rows))
    ]
    heights = [26 + 21 * (n - 1) for n in row_lines]
    fig = go.Figure(
        go.Table(
            header=dict(
                values=[f"<b>{c}</b>" for c in columns],
                fill_color="#e8eef7",
                align="left",
                font=dict(size=12),
                height=header,
            ),
            cells=dict(values=values, align=["right" if n else "left" for n in numeric], height=26, font=dict(size=12)),
            columnwidth=widths,
        )
    )
    figure_layout(fig, title=title, height=(50 if title else 10) + header + sum(heights) + 24)
    return fig.update_layout(margin=dict(l=10, r=10, t=50 if title else 10, b=10))
