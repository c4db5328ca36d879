"""Dashboards: ipywidgets controls wired to the calculators in ``playbook.theory`` and the figures
in ``playbook.viz.figures``. Nothing is computed or drawn here that those modules do not already do;
a control's change recomputes the budgets, rebuilds the figure with the same pure function, and
copies its data into the live ``go.FigureWidget`` in place.
"""

from __future__ import annotations

import html

import ipywidgets as w
import plotly.graph_objects as go

from playbook.config import ModelConfig
from playbook.theory.hybrid.memory import inference_memory, training_memory

TRAINING, SERVING = "training (per rank)", "inference (per rank)"
RED, GREY = "#c62828", "#555"
STALE = f"  <i style='color:{RED}'>(stale)</i>"
POWERS_OF_TWO = lambda lo, hi: [2**k for k in range(lo, hi + 1)]  # noqa: E731


def show_figure(live: go.FigureWidget, new: go.Figure, *, keep_height: bool = False) -> None:
    """Replace ``live``'s traces and layout with ``new``'s, in one message (a layout applied piecemeal
    lost "reversed" axes on the page), at the page's default height: plotly's widget drops a height set
    before it is first shown, so a figure replaced after a control moves would come back taller than it
    was first drawn. ``keep_height`` keeps ``new``'s height instead, for a figure whose height is its
    content (a table's rows): ``live`` must then be built from its first figure
    (``go.FigureWidget(first)``), whose height the widget keeps."""
    if not keep_height:
        new.layout.height = None
    with live.batch_update():
        live.data = ()
        live.add_traces(new.data)
        live.layout = new.layout


def mark_stale(*figures: go.FigureWidget) -> None:
    """The book's one rule for settings a dashboard cannot draw (chapter 8's): every figure those
    controls drive keeps its last valid drawing, "(stale)" after its title, and the dashboard's
    message says why (:func:`refusal`). The next valid settings redraw it, and the mark goes with
    the old title."""
    for fig in figures:
        text = fig.layout.title.text or ""
        if fig.data and STALE not in text:
            fig.layout.title.text = text + STALE


def is_stale(fig: go.FigureWidget) -> bool:
    return STALE in (fig.layout.title.text or "")


def refusal(action: str, error: Exception | str) -> str:
    """The red line beside figures marked stale: what could not be done and why, in one sentence
    (``refusal("Cannot compute", e)``)."""
    return (
        f"<span style='color:{RED}'><b>{html.escape(action)}:</b> {html.escape(str(error))}</span>"
        f"<span style='color:{GREY}'> (figures marked (stale) show the last valid settings)</span>"
    )


def dense_presets() -> list[str]:
    """The presets a dense-model dashboard offers: no mixture of experts, grouped-query attention
    (what ``TPGPT`` and the per-layer counts cover)."""
    return [
        n
        for n in ModelConfig.presets()
        if not ModelConfig.preset(n).is_moe and ModelConfig.preset(n).attention == "gqa"
    ]


def fit_controls(controls, description_width: str = "90px") -> None:
    """Size every control so that no label is cut: toggle buttons as wide as their longest option
    (about 8 px a character, plus padding), checkboxes unindented with their whole description."""
    for ctl in controls:
        if isinstance(ctl, w.Checkbox):
            ctl.indent, ctl.style = False, {"description_width": "initial"}
            ctl.layout.width = "auto"
        elif isinstance(ctl, w.ToggleButtons):
            longest = max(len(str(label)) for label in ctl.options)
            ctl.style = {"description_width": description_width, "button_width": f"{8 * longest + 22}px"}
        else:  # a slider or dropdown narrows with its column instead of running past the cell's edge
            ctl.style = {"description_width": description_width}
            ctl.layout.max_width = "calc(100% - 4px)"  # its 2 px margins beside it


def memory_budgets(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    precision: str = "mixed",
    recompute: str = "none",
    zero: int = 0,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    sequence_parallel: bool = False,
    serve_dtype: str = "bf16",
    fp32_grad_accum: bool = False,
) -> dict[str, dict[str, float]]:
    """Bytes by category for one rank training ``cfg`` with Adam and one rank serving it.

    Training: :func:`~playbook.theory.hybrid.memory.training_memory` (ZeRO stage ``zero`` over ``dp``
    ranks, one of tp/pp/cp/ep > 1, one micro-batch of activations; ``fp32_grad_accum`` adds the fp32
    gradient-accumulation buffer to the gradients, mixed precision only). Serving:
    :func:`~playbook.theory.hybrid.memory.inference_memory` for ``micro_batch`` sequences of ``seq_len``
    tokens with weights and KV cache in ``serve_dtype``, split by tp, pp and ep.
    Pure: feed the result to :func:`~playbook.viz.memory_figures.memory_bars` for a static figure.
    """
    train = training_memory(
        cfg,
        seq_len=seq_len,
        micro_batch=micro_batch,
        dp=dp,
        zero=zero,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        sequence_parallel=sequence_parallel,
        recompute=recompute,
        precision=precision,
        fp32_grad_accum=fp32_grad_accum,
    )
    serve = inference_memory(cfg, batch=micro_batch, seq_len=seq_len, tp=tp, pp=pp, ep=ep, dtype=serve_dtype)
    return {TRAINING: train.as_dict(), SERVING: serve.as_dict()}


def params_label(n: float) -> str:
    """A parameter count for prose: 70.55 B, 124.4 M, 36.9 k."""
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.2f} {suffix}" if div == 1e9 else f"{n / div:.1f} {suffix}"
    return f"{n:.0f}"


__all__ = ["fit_controls", "is_stale", "mark_stale", "memory_budgets", "refusal", "show_figure"]
