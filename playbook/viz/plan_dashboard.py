"""The planner's what-if dashboard: model, GPUs, context, global batch and hardware -> the ranked
layouts (a table), their step time by part (``viz.plan.step_breakdown``) and the rejections by
reason, all from ``playbook.theory.plan.planner.plan`` (no ranks start).

Every control re-plans. The teaching presets (``gpt-*``) are not offered: their max_seq_len (64 or
128 tokens) is below every context on the slider. A setting the planner refuses (nothing fits, no
layout divides the model) is explained in one red line and the figures keep the last plan, marked
stale. Plans are cached by their settings, so moving back to a setting is instant; a new plan of
16,384 GPUs takes a few seconds on a laptop.
"""

from __future__ import annotations

import html
from functools import lru_cache

import ipywidgets as w
import plotly.graph_objects as go

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.plan.cost import DEFAULT_OVERLAP
from playbook.theory.plan.schedule import PLAN_SCHEDULES
from playbook.theory.plan.search import Plan
from playbook.theory.plan.planner import plan
from playbook.viz.figures import FIT_WIDTH
from playbook.viz.table import table
from playbook.viz.plan import candidate_rows, rejected_rows, step_breakdown
from playbook.viz.widgets import GREY, RED, STALE, mark_stale, show_figure

WIDTH = FIT_WIDTH  # the narrowest cell a chapter is read in (1280 px, file browser open)
POW2 = lambda lo, hi: [2**k for k in range(lo, hi + 1)]  # noqa: E731


def models() -> list[str]:
    """The presets a real cluster trains (the teaching ``gpt-*`` ones are too short for any context here)."""
    return [m for m in ModelConfig.presets() if not m.startswith("gpt-")]


@lru_cache(maxsize=64)
def cached_plan(
    model: str,
    hardware: str,
    gpus: int,
    seq_len: int,
    global_batch: int,
    activations: str = "production",
    schedules: tuple[str, ...] = PLAN_SCHEDULES,
    overlap: str = DEFAULT_OVERLAP,
) -> Plan:
    """``theory.plan.planner.plan`` for preset names, remembered (the notebook and the dashboard share it)."""
    hw = Hardware.preset(hardware)
    sizes = dict(gpus=gpus, seq_len=seq_len, global_batch=global_batch, activations=activations, schedules=schedules)
    sizes["overlap"] = overlap
    return plan(ModelConfig.preset(model), hw, **sizes)


def summary(p: Plan) -> str:
    """One paragraph: how many layouts fit, the fastest, and the rejections by reason."""
    best = p.candidates[0]
    turned = ", ".join(f"{kind} {n:,}" for kind, (n, _) in sorted(p.rejected.items(), key=lambda kv: -kv[1][0]))
    return (
        f"<b>{len(p.candidates)}</b> layouts of {p.gpus:,} × {p.hardware} fit {p.model} "
        f"(seq {p.seq_len:,}, global batch {p.global_batch:,}, {p.activations} activations, overlap {p.overlap}); fastest <b>{html.escape(str(best.layout))}</b>: "
        f"{best.cost.total:.3g} s per step, MFU {best.mfu:.0%}, {best.memory / 1e9:.1f} GB per GPU."
        f"<br><span style='color:{GREY}'>rejected: {html.escape(turned) or 'none'}; "
        f"{p.dominated:,} slower variants of kept layouts not shown</span>"
    )


def plan_dashboard(
    *,
    model: str = "llama-3.1-70b",
    hardware: str = "h100-sxm",
    gpus: int = 64,
    seq_len: int = 8192,
    global_batch: int = 512,
    top: int = 6,
) -> w.VBox:
    """Controls -> the planner's ranked table, step-time breakdown and rejections.

    Returns a ``VBox`` with extra attributes: ``controls`` (model, hardware, gpus, seq_len,
    global_batch, top), ``figures`` (``table``, ``breakdown``: live ``go.FigureWidget``),
    ``message`` (the summary, or the red line of a refused setting), ``rejected`` (an ``HTML``
    list of the rejection reasons) and ``update``.
    """
    style = {"description_width": "95px"}
    c = {
        "model": w.Dropdown(options=models(), value=model, description="model"),
        "hardware": w.Dropdown(options=Hardware.presets(), value=hardware, description="device"),
        "gpus": w.SelectionSlider(options=POW2(3, 14), value=gpus, description="GPUs"),
        "seq_len": w.SelectionSlider(options=POW2(10, 17), value=seq_len, description="context"),
        "global_batch": w.SelectionSlider(options=POW2(4, 12), value=global_batch, description="global batch"),
        "top": w.IntSlider(min=1, max=12, value=top, description="layouts shown"),
    }
    for ctl in c.values():
        ctl.style = style
    figs = {"table": go.FigureWidget(), "breakdown": go.FigureWidget()}
    message, rejected = w.HTML(), w.HTML()

    def update(_change=None) -> None:
        v = {k: ctl.value for k, ctl in c.items()}
        message.value = f"<span style='color:{GREY}'>planning {v['model']} on {v['gpus']:,} GPUs…</span>"
        try:
            p = cached_plan(v["model"], v["hardware"], v["gpus"], v["seq_len"], v["global_batch"])
        except ValueError as e:
            message.value = (
                f"<span style='color:{RED}'><b>Cannot plan:</b> {html.escape(str(e))}</span>"
                f"<span style='color:{GREY}'> (the figures show the last plan)</span>"
            )
            mark_stale(*figs.values())
            if rejected.value and STALE not in rejected.value:
                rejected.value = f"<div>rejections of the last plan{STALE}</div>" + rejected.value
            return
        name = f"{p.model} on {p.gpus:,} × {p.hardware}, seq {p.seq_len:,}, batch {p.global_batch:,}"
        rows = table(candidate_rows(p, v["top"]), title=f"{name}: the fastest layouts that fit")
        rows.update_layout(width=WIDTH)  # the width ``table`` sizes its rows for, and the height they take
        if figs["table"].data:
            show_figure(figs["table"], rows, keep_height=True)
        else:  # the first drawing: a widget keeps the height it is built with (show_figure)
            figs["table"] = go.FigureWidget(rows)
        show_figure(figs["breakdown"], step_breakdown(p, top=v["top"], title=f"{name}: why they rank so"))
        message.value = summary(p)
        rejected.value = "".join(
            f"<div style='color:{GREY}'>• <b>{r['layouts']:,}</b> {html.escape(r['reason'])}, e.g. "
            f"<code>{html.escape(r['for example'])}</code></div>"
            for r in rejected_rows(p)
        )

    for ctl in c.values():
        ctl.observe(update, names="value")
    update()

    left = w.VBox([c["model"], c["hardware"], c["top"]])
    right = w.VBox([c["gpus"], c["seq_len"], c["global_batch"]])
    box = w.VBox([w.HBox([left, right]), message, figs["table"], figs["breakdown"], rejected])
    box.controls, box.figures, box.message, box.rejected, box.update = c, figs, message, rejected, update
    return box


__all__ = ["cached_plan", "models", "plan_dashboard", "summary"]
