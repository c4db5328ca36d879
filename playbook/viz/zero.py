"""Show ZeRO: memory per rank by stage, transient whole units over a step, bytes sent per step, and a
dashboard that answers "which stage, how many ranks, which GPU" for the large presets.

Figures are pure (data -> plotly figure, no torch); the dashboard only wires controls to them and to
the calculators in ``playbook.theory`` (``training_memory`` for the paper's per-rank budget,
``theory.zero`` for the communication of our units).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

import ipywidgets as w
import plotly.graph_objects as go

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.memory import training_memory
from playbook.theory.zero import STAGES, zero_comm_per_step
from playbook.viz.figures import _layout, format_value, unit_scale
from playbook.viz.memory_figures import memory_bars
from playbook.viz.widgets import STALE, fit_controls, show_figure

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
    return _layout(
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
    return _layout(
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


def zero_dashboard(
    *,
    model: str = "llama-3.1-8b",
    dp: int = 8,
    stage: int = 1,
    precision: str = "mixed",
    seq_len: int = 4096,
    recompute: str = "selective",
) -> w.VBox:
    """Model preset, DP degree, ZeRO stage and precision -> memory per rank by category (which GPU it
    fits on) and bytes sent per step by collective for every stage (the chosen one outlined).

    Returns a ``VBox`` with ``memory_figure`` and ``comm_figure`` (``go.FigureWidget``), ``controls`` (dict of
    widgets: model, dp, stage, precision, seq_len, recompute), ``message`` (HTML) and ``update``.
    """
    c = {
        "model": w.Dropdown(
            # dense presets with their own head: the ZeRO calculators count those (MoE is chapter 6's)
            options=[
                m
                for m in ModelConfig.presets()
                if not (ModelConfig.preset(m).tie_embeddings or ModelConfig.preset(m).is_moe)
            ],
            value=model,
            description="model",
        ),
        "dp": w.SelectionSlider(options=[2**k for k in range(11)], value=dp, description="dp"),
        "stage": w.ToggleButtons(options=list(STAGES), value=stage, description="ZeRO stage"),
        "precision": w.ToggleButtons(options=["mixed", "fp32"], value=precision, description="precision"),
        "seq_len": w.SelectionSlider(options=[2**k for k in range(5, 16)], value=seq_len, description="seq_len"),
        "recompute": w.ToggleButtons(options=["none", "selective", "full"], value=recompute, description="recompute"),
    }
    fit_controls(c.values(), "80px")
    memory, comm, message = go.FigureWidget(), go.FigureWidget(), w.HTML()

    def update(_change=None) -> None:
        v = {k: ctl.value for k, ctl in c.items()}
        try:
            cfg = ModelConfig.preset(v["model"])
            seq = min(v["seq_len"], cfg.max_seq_len)
            budget = zero_budget(
                cfg, dp=v["dp"], stage=v["stage"], precision=v["precision"], seq_len=seq, recompute=v["recompute"]
            )
            volumes = {
                STAGE_NAMES[s]: zero_comm_per_step(
                    cfg, stage=s, world_size=v["dp"], precision=v["precision"], loss_bytes=0
                )
                for s in STAGES
            }
        except (ValueError, NotImplementedError) as e:
            message.value = f"<span style='color:#c62828'><b>Cannot compute:</b> {html.escape(str(e))}</span>"
            for live in (memory, comm):  # the figures keep the last valid settings, and say so
                if live.data and STALE not in (live.layout.title.text or ""):
                    live.layout.title.text = (live.layout.title.text or "") + STALE
            return
        fits = fitting_devices(budget["total"])
        smallest = next((name for name, _, ok in fits if ok), None)
        show_figure(
            memory,
            memory_bars(
                {f"{STAGE_NAMES[v['stage']]}, dp={v['dp']}": budget},
                unit="GB",
                capacity=Hardware.preset(smallest).usable_bytes if smallest else None,
                capacity_label=Hardware.preset(smallest).fit_label if smallest else "",
                title=f"{cfg.name}: memory per rank, seq {seq:,}, micro-batch 1, {v['recompute']} recomputation",
            ),
        )
        fig = comm_volume_bars(
            volumes, unit="GB", title=f"bytes sent per rank per step, dp={v['dp']} ({v['precision']})"
        )
        fig.add_shape(
            type="rect",
            xref="x",
            yref="paper",
            x0=v["stage"] - 0.4,
            x1=v["stage"] + 0.4,
            y0=0,
            y1=1,
            line=dict(color="#333", width=2, dash="dot"),
        )
        show_figure(comm, fig)
        cells = " ".join(
            f"<span style='color:{'#2e7d32' if ok else '#c62828'}'>{'✔' if ok else '✘'} {name} "
            f"({format_value(cap / 1e9)} GB)</span>"
            for name, cap, ok in fits
        )
        message.value = (
            f"<b>{format_value(budget['total'] / 1e9)} GB per rank</b> "
            f"(model state {format_value((budget['params'] + budget['grads'] + budget['optimizer']) / 1e9)} GB, "
            f"activations {format_value(budget['activations'] / 1e9)} GB). Fits: {cells}"
        )

    for ctl in c.values():
        ctl.observe(update, names="value")
    update()
    box = w.VBox(
        [
            w.HBox([w.VBox([c["model"], c["dp"], c["seq_len"]]), w.VBox([c["stage"], c["precision"], c["recompute"]])]),
            message,
            memory,
            comm,
        ]
    )
    box.memory_figure, box.comm_figure, box.controls, box.message, box.update = memory, comm, c, message, update
    return box


def moments_table(predicted: Mapping[str, Mapping[str, int]], measured: Mapping[str, Mapping[str, int]]) -> str:
    """Predicted and measured bytes per category at each moment of a step, as aligned text rows."""
    cats = ("params", "grads", "optimizer")
    lines = [f"{'moment':<15}" + "".join(f"{c + ' (pred / meas)':>32}" for c in cats)]
    for moment, want in predicted.items():
        got = measured[moment]
        cells = "".join(f"{f'{want[c]:,} / {got[c]:,}':>30}{'  ' if want[c] == got[c] else ' ≠'}" for c in cats)
        lines.append(f"{moment:<15}{cells}")
    return "\n".join(lines)


__all__ = [
    "comm_volume_bars",
    "fitting_devices",
    "gathered_over_time",
    "moments_table",
    "zero_budget",
    "zero_dashboard",
]
