"""Show a list of dicts as a plotly table: one column per key, numbers with about three significant
digits and thousands separators, every row shown in the narrowest notebook cell a chapter is read in.

Plotly sizes a table's columns in proportion to ``columnwidth``, wraps a cell's text at its spaces
when it is wider than its column (never inside a word or a number) and clips the rows that do not fit
the figure's height. So the table is laid out here, for :data:`~playbook.viz.figures.FIT_WIDTH`:
each column as wide as its longest unbreakable word or number, the widest narrowed first until all
fit, every text broken into lines with ``<br>`` (a header also after its underscores: ``kv_bytes_``
``per_token``), and the height counted from those lines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from playbook.viz.figures import FIT_WIDTH, TITLE_LINE_PX, figure_layout, format_value, wrap_title

CHAR_PX = {"header": 7.5, "cells": 6.8}  # a 12 px character, bold in a header (measured widths plus a margin)
PAD_PX = 16  # a cell's padding
LINE_PX = {"header": 17, "cells": 21}  # each line of a header, and each extra line of a row


def _cell(v) -> str:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return "—" if v is None else str(v)
    if isinstance(v, int):  # counts stay whole: stage 3, 16 in flight
        return f"{v:,}"
    return format_value(float(v))


def _pieces(text: str, header: bool) -> list[str]:
    """The words of one line, each with the space or underscore after it (where a line may break)."""
    return [p for p in re.split(r"(?<=[ _])" if header else r"(?<= )", text) if p]


def _length(text: str) -> int:
    return len(re.sub(r"<[^>]+>", "", text))


def _wrap(text: str, chars: int, header: bool = False) -> list[str]:
    """``text`` in lines of at most ``chars`` characters, broken after spaces (and underscores in a
    header); a line of its own (``<br>``) stays one; a word longer than ``chars`` keeps its line."""
    lines = []
    for part in text.split("<br>"):
        cur = ""
        for piece in _pieces(part, header):
            if cur and _length(cur + piece.rstrip()) > chars:
                lines.append(cur.rstrip())
                cur = piece
            else:
                cur += piece
        lines.append(cur.rstrip())
    return lines


def column_widths(texts: Sequence[Sequence[str]], width: float = FIT_WIDTH - 20) -> list[float]:
    """Pixels of text per line for each column (``texts[j]``: its header, then its cells) so that the
    columns fit ``width`` px: each as wide as its longest line, the widest narrowed first, never below
    its longest unbreakable word (then the table is wider than ``width``, and plotly squeezes it)."""

    def px(i: int, text: str) -> float:
        return _length(text) * CHAR_PX["header" if i == 0 else "cells"]

    natural = [max(px(i, line) for i, t in enumerate(col) for line in t.split("<br>")) for col in texts]
    least = [
        max(
            px(i, p.rstrip(" "))
            for i, t in enumerate(col)
            for line in t.split("<br>")
            for p in _pieces(line, i == 0) or [""]
        )
        for col in texts
    ]
    widths = [max(n, CHAR_PX["header"]) for n in natural]
    room, step = width - PAD_PX * len(widths), CHAR_PX["cells"]
    while sum(widths) > room:
        wide = [j for j in range(len(widths)) if widths[j] - step >= least[j]]
        if not wide:
            break
        widths[max(wide, key=lambda j: widths[j])] -= step
    return widths


def table(rows: Sequence[Mapping], *, columns: Sequence[str] | None = None, title: str = "") -> go.Figure:
    """A plotly table of ``rows`` (dicts), one column per key (or ``columns``); numbers printed with
    about three significant digits and thousands separators (``format_value``), every row shown
    at :data:`~playbook.viz.figures.FIT_WIDTH` px and wider."""
    columns = list(columns or (rows[0] if rows else []))
    values = [[_cell(row.get(c)) for row in rows] for c in columns]
    numeric = [
        all(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool) for r in rows if r.get(c) is not None)
        for c in columns
    ]
    widths = column_widths([[str(c), *col] for c, col in zip(columns, values)])
    heads = [_wrap(str(c), int(w / CHAR_PX["header"] + 1e-9), header=True) for c, w in zip(columns, widths)]
    cells = [[_wrap(v, int(w / CHAR_PX["cells"] + 1e-9)) for v in col] for col, w in zip(values, widths)]
    header = 14 + LINE_PX["header"] * max([len(h) for h in heads] or [1])
    heights = [26 + LINE_PX["cells"] * (max(len(col[i]) for col in cells) - 1) for i in range(len(rows))]
    fig = go.Figure(
        go.Table(
            header=dict(
                values=["<br>".join(f"<b>{line}</b>" for line in h) for h in heads],
                fill_color="#e8eef7",
                align="left",
                font=dict(size=12),
                height=header,
            ),
            cells=dict(
                values=[["<br>".join(lines) for lines in col] for col in cells],
                align=["right" if n else "left" for n in numeric],
                height=26,
                font=dict(size=12),
            ),
            columnwidth=[w + PAD_PX for w in widths],
        )
    )
    top = 50 + TITLE_LINE_PX * (wrap_title(title).count("<br>") - title.count("<br>")) if title else 10
    figure_layout(fig, title=title, height=top + header + sum(heights) + 24)
    return fig.update_layout(margin=dict(l=10, r=10, t=top, b=10))
