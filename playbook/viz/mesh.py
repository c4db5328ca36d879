"""Show one hybrid run rank by rank (bytes per axis, memory by category, one step's timeline), and several
layouts side by side.

Figures are pure (plain data -> plotly figure; no torch, no processes), so tests read ``fig.data``.
The inputs are the per-rank rows of a hybrid run (``playbook.parallel.hybrid.run.comm_table``:
``{rank, coords, predicted, measured, memory}``, bytes per step by axis and bytes by category).
``training_rows`` turns ``theory.hybrid.memory.training_memory`` into the rows of the chapter's table.
Where the ranks sit: ``playbook.viz.mesh_layout``; tables: ``playbook.viz.table``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.config import ModelConfig
from playbook.theory.hybrid.memory import training_memory
from playbook.viz.figures import CATEGORY_COLORS, CATEGORY_LABELS, figure_layout, timeline, unit_scale
from playbook.viz.mesh_layout import AXIS_COLORS, axis_seconds, ordered_axes, rank_grid
from playbook.viz.table import table

MEMORY = ("params", "grads", "optimizer", "activations")


# ---- one run: bytes and memory per rank ----------------------------------------------------------------
def bytes_per_axis(rows: Sequence[Mapping], *, unit: str = "KB", title: str = "") -> go.Figure:
    """One panel per axis, grouped bars per rank: bytes sent per step, predicted beside measured
    (``rows`` as ``comm_table`` returns them). ``customdata`` holds the exact bytes."""
    scale = unit_scale(unit)
    axes = ordered_axes({a for row in rows for k in ("predicted", "measured") for a in row[k]})
    fig = make_subplots(
        rows=1, cols=max(1, len(axes)), subplot_titles=[f"<b>{a}</b>" for a in axes], horizontal_spacing=0.06
    )
    x = [f"rank {row['rank']}" for row in rows]
    for i, axis in enumerate(axes):
        for kind, color in (("predicted", "#9fb7d9"), ("measured", "#2f4b7c")):
            values = [float(row[kind].get(axis, 0.0)) for row in rows]
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=[v / scale for v in values],
                    customdata=values,
                    name=kind,
                    legendgroup=kind,
                    marker_color=color,
                    showlegend=i == 0,
                    meta=axis,
                    hovertemplate=f"<b>{axis}, {kind}</b> %{{x}}<br>%{{customdata:,.0f}} bytes<extra></extra>",
                ),
                row=1,
                col=i + 1,
            )
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text=f"bytes sent per step ({unit})", row=1, col=1)
    return figure_layout(
        fig,
        title=title,
        barmode="group",
        height=380,
        legend=dict(orientation="h", yanchor="bottom", y=1.12, xanchor="right", x=1.0),
    )


def _memory(row: Mapping) -> tuple[Mapping, Mapping]:
    """(measured, predicted) bytes by category of a row: ``memory`` is either the measured dict
    itself or ``{"predicted": ..., "measured": ...}``."""
    mem = row["memory"]
    if "measured" in mem:
        return mem["measured"], mem.get("predicted") or {}
    return mem, {}


def memory_per_rank(rows: Sequence[Mapping], *, unit: str = "KB", title: str = "") -> go.Figure:
    """Stacked bars per rank, one segment per category (params, grads, optimizer, activations) as
    measured; where the rows carry a prediction of every category, a diamond marks its total."""
    scale = unit_scale(unit)
    x = [f"rank {row['rank']}" for row in rows]
    fig = go.Figure()
    for cat in MEMORY:
        values = [_memory(row)[0].get(cat) or 0 for row in rows]
        fig.add_trace(
            go.Bar(
                x=x,
                y=[v / scale for v in values],
                customdata=values,
                name=CATEGORY_LABELS[cat],
                legendgroup=cat,
                marker_color=CATEGORY_COLORS[cat],
                hovertemplate=f"<b>{CATEGORY_LABELS[cat]}</b> %{{x}}<br>%{{customdata:,}} bytes<extra></extra>",
            )
        )
    predicted = [_memory(row)[1] for row in rows]
    if all(p and all(p.get(c) is not None for c in MEMORY) for p in predicted):
        totals = [sum(p[c] for c in MEMORY) for p in predicted]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[t / scale for t in totals],
                customdata=totals,
                mode="markers",
                name="predicted total",
                legendgroup="predicted",
                marker=dict(symbol="diamond", size=11, color="#222"),
                hovertemplate="predicted total %{x}<br>%{customdata:,.0f} bytes<extra></extra>",
            )
        )
    return figure_layout(
        fig,
        title=title,
        barmode="stack",
        height=380,
        yaxis=dict(title=f"bytes ({unit}), measured"),
        legend=dict(traceorder="normal"),
    )


def step_timeline(spans: Sequence[Mapping], *, step: int = -1, title: str = "") -> go.Figure:
    """One training step on every rank (``figures.timeline``), from a rank set's trace: the window of
    each rank's compute span ``"step N"``; collectives named by their mesh axis (``"tp all_reduce"``),
    compute regions by their direction (``"forward"``, ``"backward"``)."""
    steps = sorted(
        {int(s["name"].split()[1]) for s in spans if s["kind"] == "compute" and s["name"].startswith("step ")}
    )
    if not steps:
        return timeline([], title=title)
    n = steps[step]
    window = {s["rank"]: (s["start"], s["end"]) for s in spans if s["kind"] == "compute" and s["name"] == f"step {n}"}
    shown = []
    for s in spans:
        lo, hi = window.get(s["rank"], (0.0, -1.0))
        if s.get("end") is None or not lo <= s["start"] <= hi or s["name"].startswith("step "):
            continue
        if s["kind"] == "comm":
            name = f"{s.get('axis') or s.get('group', '')} {s['name']}".strip()
        else:
            name = "backward" if "backward" in s["name"] else "forward" if "forward" in s["name"] else s["name"]
        shown.append({**s, "name": name})
    return timeline(shown, title=title or f"step {n} on every rank")


# ---- several layouts side by side -----------------------------------------------------------------------
def layout_summary(rows: Sequence[Mapping]) -> dict:
    """The rank that sends most and the rank that holds most: ``{"bytes": {axis: bytes}, "sent",
    "memory": {category: bytes}, "held", "busiest", "fullest"}`` (measured)."""
    busiest = max(rows, key=lambda r: sum(r["measured"].values()))
    fullest = max(rows, key=lambda r: sum(_memory(r)[0].get(c) or 0 for c in MEMORY))
    memory = {c: _memory(fullest)[0].get(c) or 0 for c in MEMORY}
    return {
        "bytes": dict(busiest["measured"]),
        "sent": sum(busiest["measured"].values()),
        "busiest": busiest["rank"],
        "memory": memory,
        "held": sum(memory.values()),
        "fullest": fullest["rank"],
    }


def compare_layouts(runs: Mapping[str, Sequence[Mapping]], *, unit: str = "KB", title: str = "") -> go.Figure:
    """Layouts side by side: left, bytes sent per step by the busiest rank, stacked by axis; right,
    memory of the fullest rank, stacked by category (both measured; ``layout_summary``)."""
    scale = unit_scale(unit)
    names, summary = list(runs), {k: layout_summary(v) for k, v in runs.items()}
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.1,
        subplot_titles=["bytes sent per step, busiest rank", "memory, fullest rank"],
    )
    for axis in ordered_axes({a for s in summary.values() for a in s["bytes"]}):
        values = [summary[n]["bytes"].get(axis, 0.0) for n in names]
        fig.add_trace(
            go.Bar(
                x=names,
                y=[v / scale for v in values],
                customdata=values,
                name=axis,
                legendgroup="axis",
                legendgrouptitle_text="axis",
                marker_color=AXIS_COLORS.get(axis, "#7f7f7f"),
                hovertemplate=f"<b>{axis}</b> %{{x}}<br>%{{customdata:,.0f}} bytes<extra></extra>",
            ),
            row=1,
            col=1,
        )
    for cat in MEMORY:
        values = [summary[n]["memory"][cat] for n in names]
        fig.add_trace(
            go.Bar(
                x=names,
                y=[v / scale for v in values],
                customdata=values,
                name=CATEGORY_LABELS[cat],
                legendgroup="memory",
                legendgrouptitle_text="memory",
                marker_color=CATEGORY_COLORS[cat],
                hovertemplate=f"<b>{CATEGORY_LABELS[cat]}</b> %{{x}}<br>%{{customdata:,}} bytes<extra></extra>",
            ),
            row=1,
            col=2,
        )
    fig.update_yaxes(title_text=f"bytes ({unit})", rangemode="tozero")
    figure_layout(fig, title=title, barmode="stack", height=440)
    return fig.update_layout(margin=dict(t=100))


def training_rows(
    cfg: ModelConfig, layouts: Sequence[tuple[int, int]], *, seq_len: int, micro_batch: int = 1, zero: int = 1
) -> list[dict]:
    """Training memory per device for ``(tp, dp)`` layouts (``training_memory``: mixed-precision Adam,
    Megatron TP with sequence parallelism, ZeRO stage ``zero`` over dp; Rajbhandari et al. 2019,
    Korthikanti et al. 2022), by category, in bytes."""
    return [
        {
            "layout": f"tp{tp}×dp{dp}",
            **training_memory(
                cfg, seq_len=seq_len, micro_batch=micro_batch, tp=tp, dp=dp, zero=zero, sequence_parallel=True
            ).as_dict(),
        }
        for tp, dp in layouts
    ]


# rank_grid, axis_seconds and table are imported from here by chapter 8 (notebooks/08_hybrid_mesh.ipynb,
# 08b_planning.ipynb); their homes are viz.mesh_layout and viz.table
__all__ = [
    "axis_seconds",
    "bytes_per_axis",
    "compare_layouts",
    "layout_summary",
    "memory_per_rank",
    "rank_grid",
    "step_timeline",
    "table",
    "training_rows",
]
