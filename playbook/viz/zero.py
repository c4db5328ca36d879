"""Show ZeRO: memory per rank by stage, transient whole units over a step, bytes sent per step, and a
dashboard that answers "which stage, how many ranks, which GPU" for the large presets.

Figures are pure (data -> plotly figure, no torch); the dashboard only wires controls to them and to
the calculators in ``playbook.theory`` (``training_memory`` for the paper's per-rank budget,
``theory.zero.zero`` for the communication of our units).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.hybrid.memory import training_memory
from playbook.viz.figures import figure_layout, format_value, unit_scale

OP_COLORS = {"all_reduce": "#c0392b", "reduce_scatter": "#e4572e", "all_gather": "#f29e4c"}
STAGE_NAMES = {0: "DP (ZeRO-0)", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


def comm_volume_bars(volumes: Mapping[str, Mapping[str, float]], *, unit: str = "KB", title: str = "") -> go.Figure:
    """Bytes one rank sends per step, one stacked bar per run, one segment per collective.

    ``volumes`` maps a bar's name to ``{op: bytes}`` (e.g. ``{"DP": {"all_reduce": ...}, "ZeRO-3":
    {"all_gather": ..., "reduce_scatter": ...}}``). One trace per op (``name`` the op), ``y`` in
    ``unit``, the exact bytes in ``customdata``; each bar's total is written above it.
    """
    scale = unit_scale(unit)
    names = list(volumes)
    ops = [op for op in OP_COLORS if any(op in v for v in volumes.values())]
    ops += sorted({op for v in volumes.values() for op in v} - set(ops))
    fig = go.Figure()
    for op in ops:
        byts = [float(volumes[n].get(op, 0.0)) for n in names]
        fig.add_trace(
            go.Bar(
                name=op,
                x=names,
                y=[b / scale for b in byts],
                customdata=byts,
                marker_color=OP_COLORS.get(op, "#7f7f7f"),
                hovertemplate=f"<b>{op}</b> (%{{x}})<br>%{{y:,.4g}} {unit}<br>%{{customdata:,.0f}} bytes<extra></extra>",
            )
        )
    totals = [sum(volumes[n].values()) for n in names]
    for name, total in zip(names, totals):
        fig.add_annotation(
            x=name,
            y=total / scale,
            text=f"<b>{format_value(total / scale)} {unit}</b>",
            showarrow=False,
            yanchor="bottom",
            yshift=3,
        )
    top = max([*totals, 1.0]) / scale
    return figure_layout(
        fig,
        title=title,
        barmode="stack",
        xaxis=dict(type="category"),
        yaxis=dict(title=f"sent per rank per step ({unit})", range=[0, top * 1.18]),
        legend=dict(title="collective"),
        bargap=0.45,
    )


def gathered_over_time(
    logs: Mapping[str, Sequence[tuple[float, str, int]]], *, unit: str = "KB", title: str = ""
) -> go.Figure:
    """ZeRO-3's whole-unit buffers (gathered weights + flat unit gradients) held over one step.

    ``logs`` maps a run's name to its ``(time in s, phase, bytes)`` samples (``ShardedResult.gathered_log``);
    each is drawn as a step line, time in ms from its own first sample, so that runs of different
    length (with and without prefetch) share the axis. ``customdata`` holds the exact bytes.
    """
    scale = unit_scale(unit)
    fig = go.Figure()
    for i, (name, log) in enumerate(logs.items()):
        if not log:
            continue
        t0 = log[0][0]
        fig.add_trace(
            go.Scatter(
                name=name,
                x=[(t - t0) * 1e3 for t, _, _ in log],
                y=[b / scale for _, _, b in log],
                customdata=[[b, phase] for _, phase, b in log],
                mode="lines+markers",
                line_shape="hv",
                line=dict(width=2.5 - i * 0.5, dash=["solid", "dash", "dot"][i % 3]),
                hovertemplate=f"<b>{name}</b><br>%{{x:.2f}} ms (%{{customdata[1]}})<br>%{{customdata[0]:,}} bytes<extra></extra>",
            )
        )
    return figure_layout(
        fig,
        title=title,
        xaxis=dict(title="time since the first gather (ms)"),
        yaxis=dict(title=f"whole units held ({unit})", rangemode="tozero"),
        legend=dict(title="run"),
    )


# ---- the dashboard -----------------------------------------------------------------------------
def zero_budget(
    cfg: ModelConfig,
    *,
    dp: int,
    stage: int,
    precision: str = "mixed",
    seq_len: int = 4096,
    micro_batch: int = 1,
    recompute: str = "selective",
) -> dict[str, float]:
    """Bytes per rank by category, the ZeRO paper's formulas (``training_memory``) plus activations."""
    return training_memory(
        cfg, seq_len=seq_len, micro_batch=micro_batch, dp=dp, zero=stage, precision=precision, recompute=recompute
    ).as_dict()


def fitting_devices(total: float) -> list[tuple[str, float, bool]]:
    """(hardware preset, the bytes a fit is judged against, whether ``total`` bytes fit) for every
    profile in data/hardware/, smallest first: ``Hardware.usable_bytes``, 90 % of what the device reports."""
    rows = [(name, Hardware.preset(name).usable_bytes) for name in Hardware.presets()]
    return [(name, cap, total <= cap) for name, cap in sorted(rows, key=lambda r: r[1])]


def moments_table(predicted: Mapping[str, Mapping[str, int]], measured: Mapping[str, Mapping[str, int]]) -> str:
    """Predicted and measured bytes per category at each moment of a step, as aligned text rows, each
    column as wide as its widest entry (a row that wraps in a narrow notebook cannot be read down its
    columns); ``≠`` marks a measured value that differs from its prediction."""
    cats = ("params", "grads", "optimizer")
    rows = [
        [f"{want[c]:,} / {measured[moment][c]:,}" + ("" if want[c] == measured[moment][c] else " ≠") for c in cats]
        for moment, want in predicted.items()
    ]
    heads = [f"{c} (pred / meas)" for c in cats]
    widths = [max(len(x) for x in col) for col in zip(heads, *rows)]
    first = max(len("moment"), *map(len, predicted))
    line = lambda label, cells: f"{label:<{first}}" + "".join(f"  {x:>{n}}" for x, n in zip(cells, widths))  # noqa: E731
    return "\n".join([line("moment", heads)] + [line(m, r) for m, r in zip(predicted, rows)])


__all__ = [
    "comm_volume_bars",
    "fitting_devices",
    "gathered_over_time",
    "moments_table",
    "zero_budget",
]
