"""Chapter 0's dashboard: a model, a sequence, a micro-batch and a layout in; the training and serving budgets
per rank by category out, with whether they fit the chosen device (``theory.hybrid.memory``).
"""

from __future__ import annotations

import html

import ipywidgets as w
import plotly.graph_objects as go

from playbook.config import ModelConfig
from playbook.hardware import MEM_UTIL, Hardware
from playbook.viz.figures import format_value, unit_scale
from playbook.viz.memory_figures import memory_bars
from playbook.viz.widgets import (
    POWERS_OF_TWO,
    SERVING,
    TRAINING,
    fit_controls,
    mark_stale,
    memory_budgets,
    params_label,
    refusal,
)


def _summary(
    cfg: ModelConfig, budgets: dict, hw: Hardware, unit: str, precision: str, seq_len: int, grad_accum: bool = False
) -> str:
    s = unit_scale(unit)
    fmt = lambda b: f"{format_value(b / s)} {unit}"  # noqa: E731
    cap, psi = hw.usable_bytes, cfg.num_params()  # the product's one rule (hardware.MEM_UTIL)
    where = f"{MEM_UTIL * 100:.0f} % of the {fmt(hw.capacity_bytes)} it reports"

    def fits(total: float) -> str:
        if total <= cap:
            return f"<span style='color:#2e7d32'>fits one {hw.name} ({where}, {total / cap:.0%} used)</span>"
        return f"<span style='color:#c62828'>does not fit one {hw.name} ({where}): {total / cap:.1f}× that</span>"

    train, serve = budgets[TRAINING]["total"], budgets[SERVING]["total"]
    per = (
        20 if grad_accum else 16
    )  # 2 + 2 + 12 bytes mixed (+ 4 for an fp32 grad buffer beside the bf16 one), 4 + 4 + 8 in fp32
    extra = " with its fp32 gradient-accumulation buffer" if grad_accum else ""
    lines = [
        f"<b>Training</b>: {fmt(train)} per rank, {fits(train)}.",
        f"<b>Serving</b> in bf16: {fmt(serve)} per rank, {fits(serve)}.",
        f"Reminders for Ψ = {params_label(psi)} parameters: weights alone are 2Ψ = {fmt(2 * psi)} in bf16; "
        f"Adam in {precision} precision{extra} keeps {per}Ψ = {fmt(per * psi)} of model state before ZeRO shards it.",
    ]
    if seq_len > cfg.max_seq_len:
        lines.append(
            f"<span style='color:#b26a00'>Note: seq_len={seq_len:,} exceeds this model's "
            f"max_seq_len={cfg.max_seq_len:,}.</span>"
        )
    return "<br>".join(lines)


def memory_dashboard(
    *,
    model: str = "llama-3.1-70b",
    seq_len: int = 4096,
    micro_batch: int = 1,
    precision: str = "mixed",
    recompute: str = "none",
    zero: int = 0,
    dp: int = 8,
    hardware: str = "h100-sxm",
    unit: str = "GB",
) -> w.VBox:
    """Memory per rank for training and serving a preset, with controls for every setting.

    Returns a ``VBox`` with three extra attributes: ``figure`` (the live ``go.FigureWidget``, built by
    :func:`~playbook.viz.memory_figures.memory_bars` from :func:`memory_budgets`), ``controls`` (a dict from
    setting name to its widget: ``model``, ``seq_len``, ``micro_batch``, ``precision``,
    ``recompute``, ``zero``, ``theory.dp.dp``, ``theory.tp.tp``, ``pp``, ``cp``, ``ep``, ``sequence_parallel``,
    ``fp32_grad_accum``, ``hardware``, ``unit``) and ``message`` (an ``HTML`` widget with
    the summary, or a red error when the calculator refuses the settings).
    """
    c = {
        "model": w.Dropdown(options=ModelConfig.presets(), value=model, description="model"),
        "hardware": w.Dropdown(options=Hardware.presets(), value=hardware, description="device"),
        "seq_len": w.SelectionSlider(options=POWERS_OF_TWO(7, 17), value=seq_len, description="seq_len"),
        "micro_batch": w.IntSlider(min=1, max=64, value=micro_batch, description="micro_batch"),
        "dp": w.SelectionSlider(options=POWERS_OF_TWO(0, 10), value=dp, description="dp"),
        "tp": w.SelectionSlider(options=POWERS_OF_TWO(0, 6), value=1, description="tp"),
        "pp": w.SelectionSlider(options=POWERS_OF_TWO(0, 6), value=1, description="pp"),
        "cp": w.SelectionSlider(options=POWERS_OF_TWO(0, 6), value=1, description="cp"),
        "ep": w.SelectionSlider(options=POWERS_OF_TWO(0, 8), value=1, description="ep"),
        "sequence_parallel": w.Checkbox(value=False, description="sequence parallel (needs tp > 1)"),
        "fp32_grad_accum": w.Checkbox(value=False, description="fp32 grad accumulation (mixed only)"),
        "zero": w.ToggleButtons(options=[0, 1, 2, 3], value=zero, description="ZeRO stage"),
        "precision": w.ToggleButtons(options=["mixed", "fp32"], value=precision, description="precision"),
        "recompute": w.ToggleButtons(options=["none", "selective", "full"], value=recompute, description="recompute"),
        "unit": w.ToggleButtons(options=["GB", "GiB"], value=unit, description="unit"),
    }
    fit_controls(c.values())
    fig = go.FigureWidget()
    message = w.HTML()

    def settings() -> dict:
        return {k: ctl.value for k, ctl in c.items()}

    def update(_change=None) -> None:
        v = settings()
        # a control that would change nothing is disabled, and its description says when it counts
        c["sequence_parallel"].disabled = v["tp"] == 1
        c["sequence_parallel"].tooltip = (
            "sequence parallelism splits what tensor parallelism leaves whole: set tp > 1 to use it"
            if v["tp"] == 1
            else "split the norms' and the residual's activations over the tp ranks"
        )
        c["fp32_grad_accum"].disabled = v["precision"] == "fp32"
        c["fp32_grad_accum"].tooltip = (
            "fp32 gradients need no second fp32 copy: choose mixed precision to use it"
            if v["precision"] == "fp32"
            else "keep the bf16 gradients and add an fp32 buffer that accumulates them (4 bytes per parameter, "
            "20 in all; Megatron-LM's main_grad replaces the bf16 gradient instead: 18, "
            "model_state_bytes(fp32_grad_accum='main_grad'))"
        )
        try:
            cfg, hw = ModelConfig.preset(v["model"]), Hardware.preset(v["hardware"])
            budgets = memory_budgets(
                cfg,
                seq_len=v["seq_len"],
                micro_batch=v["micro_batch"],
                precision=v["precision"],
                recompute=v["recompute"],
                zero=v["zero"],
                dp=v["dp"],
                tp=v["tp"],
                pp=v["pp"],
                cp=v["cp"],
                ep=v["ep"],
                sequence_parallel=v["sequence_parallel"] and v["tp"] > 1,
                fp32_grad_accum=v["fp32_grad_accum"] and v["precision"] == "mixed",
            )
        except (ValueError, NotImplementedError) as e:
            message.value = refusal("Cannot compute", e)
            mark_stale(fig)
            return
        new = memory_bars(
            budgets,
            unit=v["unit"],
            capacity=hw.usable_bytes,
            capacity_label=hw.fit_label_in(v["unit"]),  # one unit per label: the line's in the axis's
            title=f"{cfg.name}: {params_label(cfg.num_params())} params<br><sup>ZeRO-{v['zero']} over dp={v['dp']}"
            + "".join(f", {d}={v[d]}" for d in ("tp", "pp", "cp", "ep") if v[d] > 1)
            + f", seq {v['seq_len']:,} × micro-batch {v['micro_batch']}</sup>",
        )
        if [t.name for t in fig.data] != [t.name for t in new.data]:  # first call, or categories changed
            fig.data = ()
            fig.add_traces(new.data)
            fig.layout = new.layout
        with fig.batch_update():
            for old, fresh in zip(fig.data, new.data):
                old.update(x=fresh.x, y=fresh.y, customdata=fresh.customdata, hovertemplate=fresh.hovertemplate)
            for key in ("title", "yaxis", "annotations", "shapes"):
                fig.layout[key] = new.layout[key]
        grad_accum = v["fp32_grad_accum"] and v["precision"] == "mixed"
        off = [c[k] for k in ("sequence_parallel", "fp32_grad_accum") if c[k].disabled]  # say why, on screen
        message.value = _summary(cfg, budgets, hw, v["unit"], v["precision"], v["seq_len"], grad_accum) + "".join(
            f"<br><i>{html.escape(ctl.description)}: off, {html.escape(ctl.tooltip)}.</i>" for ctl in off
        )

    for ctl in c.values():
        ctl.observe(update, names="value")
    update()

    left = w.VBox([c["model"], c["hardware"], c["seq_len"], c["micro_batch"], c["dp"]])
    middle = w.VBox([c["tp"], c["pp"], c["cp"], c["ep"], c["sequence_parallel"]])
    right = w.VBox([c["zero"], c["precision"], c["fp32_grad_accum"], c["recompute"], c["unit"]])
    box = w.VBox([w.HBox([left, middle, right]), fig, message])
    box.figure, box.controls, box.message, box.update = fig, c, message, update
    return box
