"""Show: pure functions from data to a plotly figure.

Every function here takes plain Python data (bytes, losses, tracer spans) and returns a
``plotly.graph_objects.Figure``; none of them starts a process, imports torch or knows about
widgets. So the same figure renders in JupyterLab, in a static HTML export, and in a test that
reads ``fig.data`` instead of looking at pixels. Dashboards (``playbook.viz.widgets``) only wire
controls to these functions.

Memory inputs are always **bytes**; ``unit`` chooses what the axis shows. Each category keeps one
colour in every figure (parameters and serving weights share the blue family); the memory figures
themselves are in ``playbook.viz.memory_figures``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import plotly.graph_objects as go

TEMPLATE = "plotly_white"  # every figure's template: plotly's default while playbook.viz is imported (see its __init__)
HEIGHT = 400

UNITS: dict[str, float] = {
    "bytes": 1,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "TB": 1e12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
}

# One colour and one label per memory category, shared by every figure.
CATEGORY_COLORS: dict[str, str] = {
    "params": "#2f6db5",
    "weights": "#7ea6dc",
    "grads": "#e8893a",
    "optimizer": "#5b9a48",
    "activations": "#c94a4a",
    "kv_cache": "#8a63b8",
}
CATEGORY_LABELS: dict[str, str] = {
    "params": "parameters",
    "weights": "weights",
    "grads": "gradients",
    "optimizer": "optimizer states",
    "activations": "activations",
    "kv_cache": "KV cache",
}

# Timeline: compute spans in greens/blues, communication in oranges/reds.
_COMPUTE_COLORS = ["#3b7dd8", "#52a852", "#2aa198", "#6c71c4", "#84b5ec", "#9bd18b"]
_COMM_COLORS = ["#e4572e", "#f29e4c", "#c0392b", "#f1c453", "#d35f8d", "#a0522d"]
_DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]


# ---- helpers -----------------------------------------------------------------------------------
def unit_scale(unit: str) -> float:
    """Bytes per ``unit`` (``"GB"`` -> 1e9, ``"GiB"`` -> 2**30); unknown units list the known ones."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(map(repr, UNITS))}; got {unit!r}")
    return UNITS[unit]


def format_value(x: float) -> str:
    """A number with about three significant digits and thousands separators: 1,432 / 31.4 / 1.88."""
    a = abs(x)
    if a >= 100 or a == 0:
        return f"{x:,.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 0.01:
        return f"{x:.2f}"
    return f"{x:.2g}"


# The narrowest notebook cell a figure must fit: a 1280 px window with JupyterLab's file browser open
# leaves an output 848 px wide (tests/browser checks every chapter there). Titles wrap to it.
FIT_WIDTH = 840
TITLE_CHARS = {"": 96, "sup": 140}  # characters per title line at 17 px (a subtitle <sup>: 12 px) in FIT_WIDTH
TITLE_LINE_PX = 24  # the margin a wrapped title's extra line takes


def _visible(text: str) -> int:
    return len(re.sub(r"<[^>]+>", "", text))


def wrap_title(title: str) -> str:
    """``title`` with every line (``<br>``-separated; a ``<sup>`` line counts as a subtitle) broken at
    spaces into lines of at most :data:`TITLE_CHARS` characters, so that no title runs past the
    right edge of a :data:`FIT_WIDTH` figure (plotly never wraps a title itself)."""
    out = []
    for line in title.split("<br>"):
        sup = line.startswith("<sup>") and line.endswith("</sup>")
        words, limit, cur = (line[5:-6] if sup else line).split(" "), TITLE_CHARS["sup" if sup else ""], ""
        parts = []
        for word in words:
            if cur and _visible(cur) + 1 + _visible(word) > limit:
                parts.append(cur)
                cur = word
            else:
                cur = f"{cur} {word}" if cur else word
        parts.append(cur)
        out += [f"<sup>{p}</sup>" for p in parts] if sup else parts
    return "<br>".join(out)


def fitted_title(title: str, top: int) -> tuple[dict, int]:
    """Plotly's ``title`` for ``title`` wrapped to :data:`FIT_WIDTH`, and the top margin it needs
    where ``top`` was enough unwrapped. A title that wrapped hangs from the figure's top edge (plotly
    centres it in the margin, which pushed its first line off the top), :data:`TITLE_LINE_PX` more
    margin per line it gained."""
    wrapped = wrap_title(title)
    grew = wrapped.count("<br>") - title.count("<br>")
    hang = dict(y=1, yref="container", yanchor="top", pad=dict(t=22)) if grew else {}
    return dict(text=wrapped, x=0.01, xanchor="left", **hang), top + TITLE_LINE_PX * grew


def figure_layout(fig: go.Figure, *, title: str, height: int = HEIGHT, **kwargs) -> go.Figure:
    """The book's layout: ``height``, ``title`` left-aligned and wrapped to fit (:func:`fitted_title`)."""
    head, top = fitted_title(title, 60) if title else (None, 30)
    fig.update_layout(height=height, title=head, margin=dict(l=70, r=30, t=top, b=50), **kwargs)
    return fig


# ---- training ----------------------------------------------------------------------------------
def loss_curves(curves: Mapping[str, list[float]], *, floor: float | None = None, title: str = "") -> go.Figure:
    """Loss against optimizer step for several runs (``{"1 rank": [...], "4 ranks": [...]}``).

    One line per run, ``x`` the step (0, 1, ...), each with its own colour and dash pattern so
    that runs that agree exactly (a parity check) still show as two lines. ``floor`` draws the
    task's entropy floor, the lowest loss any model can reach, as a dashed grey line.
    """
    fig = go.Figure()
    for i, (name, losses) in enumerate(curves.items()):
        losses = [float(x) for x in losses]
        fig.add_trace(
            go.Scatter(
                name=name,
                x=list(range(len(losses))),
                y=losses,
                mode="lines",
                line=dict(dash=_DASHES[i % len(_DASHES)], width=2.5 if i == 0 else 2),
                hovertemplate=f"<b>{name}</b><br>step %{{x}}<br>loss %{{y:.4f}}<extra></extra>",
            )
        )
    if floor is not None:
        fig.add_hline(
            y=floor,
            line_dash="dash",
            line_color="#777",
            line_width=1.5,
            annotation_text=f"entropy floor {floor:.3f}",
            annotation_position="top left",
            annotation_font_color="#555",
        )
    return figure_layout(
        fig,
        title=title,
        xaxis=dict(title="step"),
        yaxis=dict(title="cross-entropy loss (nats/token)"),
        legend=dict(title="run"),
        hovermode="x unified",
    )


# ---- communication and compute -----------------------------------------------------------------
def timeline(spans: Iterable[Mapping | object], *, title: str = "") -> go.Figure:
    """A Gantt chart of tracer spans: one row per rank, time in milliseconds since the first span.

    ``spans`` are dicts (or :class:`playbook.cluster.trace.tracer.Span` objects) with ``rank``, ``kind``
    (``"comm"`` or ``"compute"``), ``name``, ``start`` and ``end`` in seconds (``perf_counter``),
    and optionally ``bytes``, ``sent_bytes`` and ``group``; spans whose ``end`` is ``None`` (never
    waited on) are skipped. One horizontal bar trace per span name: ``base`` is the start in ms,
    ``x`` the duration in ms, ``y`` ``"rank r"``. Compute names take blues and greens, collectives
    oranges and reds, drawn thinner and on top so that overlap with compute stays visible.
    """
    rows = [s if isinstance(s, Mapping) else s.as_dict() for s in spans]
    rows = [s for s in rows if s.get("end") is not None]
    fig = go.Figure()
    if not rows:
        return figure_layout(fig, title=title or "no finished spans", xaxis=dict(title="time (ms)"))
    t0 = min(s["start"] for s in rows)
    ranks = sorted({int(s["rank"]) for s in rows})

    by_name: dict[tuple[str, str], list[Mapping]] = {}
    for s in rows:  # compute first so that communication bars are drawn on top
        by_name.setdefault((s.get("kind", "compute"), s["name"]), []).append(s)
    keys = sorted(by_name, key=lambda k: k[0] == "comm")  # stable: first-seen order within a kind
    n_comm = n_compute = 0
    for kind, name in keys:
        group = by_name[(kind, name)]
        if kind == "comm":
            color, width = _COMM_COLORS[n_comm % len(_COMM_COLORS)], 0.45
            n_comm += 1
        else:
            color, width = _COMPUTE_COLORS[n_compute % len(_COMPUTE_COLORS)], 0.8
            n_compute += 1
        fig.add_trace(
            go.Bar(
                name=name,
                orientation="h",
                y=[f"rank {int(s['rank'])}" for s in group],
                base=[(s["start"] - t0) * 1e3 for s in group],
                x=[(s["end"] - s["start"]) * 1e3 for s in group],
                width=width,
                marker=dict(color=color, line=dict(width=0.5, color="white")),
                legendgroup=kind,
                legendgrouptitle_text=kind,
                customdata=[
                    [s.get("bytes", 0) or 0, s.get("sent_bytes", 0) or 0, s.get("group", "") or ""] for s in group
                ],
                hovertemplate=(
                    f"<b>{name}</b> (%{{y}})<br>start %{{base:.3f}} ms, duration %{{x:.3f}} ms"
                    + (
                        "<br>%{customdata[0]:,} bytes, sent %{customdata[1]:,.0f}<br>group %{customdata[2]}"
                        if kind == "comm"
                        else ""
                    )
                    + "<extra></extra>"
                ),
            )
        )
    labels = [f"rank {r}" for r in ranks]
    return figure_layout(
        fig,
        title=title,
        barmode="overlay",
        # tall enough for the legend too (its title, a title per kind, an entry per name): it scrolled
        height=max(260, min(HEIGHT + 120, 120 + 45 * len(ranks)), 130 + 24 * (len(keys) + 2)),
        xaxis=dict(title="time since first span (ms)", rangemode="tozero"),
        yaxis=dict(title=None, categoryorder="array", categoryarray=labels, autorange="reversed"),
        legend=dict(title="span", groupclick="toggleitem"),
    )


__all__ = ["CATEGORY_COLORS", "CATEGORY_LABELS", "UNITS", "format_value", "loss_curves", "timeline", "unit_scale"]
