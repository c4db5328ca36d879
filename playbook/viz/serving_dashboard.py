"""Chapter 7's dashboard: a serving layout (model, device, GPUs, context, tp, router) -> one figure
with three panels for every tp × dp layout of those GPUs: the KV room each GPU keeps after its
weights and the activation peak (``theory.serving.serving.kv_capacity``, vLLM's profiling rule),
the prefix-cache hits of a conversation trace routed over the replicas
(``theory.serving.prefix_cache.prefix_layouts``, SGLang's RadixAttention reuse, Zheng et al. 2024)
and the latency per token at batch 1 and with every sequence that fits (``theory.serving.layouts``,
the roofline of Pope et al. 2022). The chosen tp is outlined; a line of numbers says what it gives.
"""

from __future__ import annotations

import functools

import ipywidgets as w
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.serving import conversations, prefix_layouts
from playbook.theory.serving.layouts import compare_layouts
from playbook.theory.serving.serving import MEM_UTIL
from playbook.viz.figures import CATEGORY_COLORS, CATEGORY_LABELS, FIT_WIDTH, figure_layout, format_value
from playbook.viz.widgets import GREY, POWERS_OF_TWO, dense_presets, fit_controls, mark_stale, refusal, show_figure

ROUTERS = ("round-robin", "prefix")
TPS = (1, 2, 4, 8)
PANELS = ("KV room per GPU (GB)", "prefix-cache hits (% of prompt tokens)", "latency per token (ms)")
ROOM = {"weights": "weights_per_gpu", "activations": "activations_per_gpu", "kv_cache": "kv_per_gpu"}  # bottom up
LATENCY = {"tpot_batch1": ("batch 1", "#9e9e9e"), "tpot": ("every sequence that fits", "#3b7dd8")}


@functools.lru_cache(maxsize=8)
def trace(vocab: int):
    """Eight conversations in two groups sharing a 512-token system prompt, three turns each: the
    prefix a router can keep on one replica (``theory.serving.workload.conversations``)."""
    return conversations(
        n=8, groups=2, turns=3, system=512, user=(64, 192), answer=(64, 192), new=(32, 64), vocab=vocab, seed=0
    )


@functools.lru_cache(maxsize=64)
def serving_plan(model: str, hardware: str, gpus: int, context: int, router: str) -> tuple[list[dict], dict]:
    """Every tp × dp = ``gpus`` layout that fits a ``context``-token sequence (``compare_layouts``), and
    each one's prefix-cache row for the trace (``prefix_layouts``), by tp. Raises ``ValueError`` when
    none fits, naming what would."""
    cfg, hw = ModelConfig.preset(model), Hardware.preset(hardware)
    rows = compare_layouts(cfg, hw, gpus=gpus, context=context)
    for r in rows:  # what the engine may fill (MEM_UTIL of the device) less weights and KV: one forward's peak
        r["activations_per_gpu"] = MEM_UTIL * hw.capacity_bytes - r["weights_per_gpu"] - r["kv_per_gpu"]
    if not rows:
        raise ValueError(
            f"{model} at context {context:,} fits no tp × dp layout of {gpus} × {hardware} "
            "(its weights and one sequence exceed every replica): add GPUs or shorten the context"
        )
    hits = prefix_layouts(
        cfg, hw, trace(cfg.vocab_size), gpus=gpus, tps=[r["tp"] for r in rows], context=context, router=router
    )
    return rows, {h["tp"]: h for h in hits}


def serving_figure(rows: list[dict], hits: dict, *, tp: int, title: str = "") -> go.Figure:
    """Three panels, one bar (or group) per layout in ``rows``; the layout with ``tp`` outlined."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=PANELS, horizontal_spacing=0.09)
    names = [r["layout"] for r in rows]
    edge = [3 if r["tp"] == tp else 0 for r in rows]
    outline = dict(line=dict(width=edge, color="#222"))
    base = [0.0] * len(rows)
    for cat in ROOM:
        y = [r[ROOM[cat]] / 1e9 for r in rows]
        fig.add_bar(
            x=names,
            y=y,
            base=base,
            offsetgroup="room",
            name=CATEGORY_LABELS[cat],
            legendgroup=cat,
            marker=dict(color=CATEGORY_COLORS[cat], **outline),
            row=1,
            col=1,
        )
        base = [b + v for b, v in zip(base, y)]
    fig.add_bar(
        x=names,
        y=[100 * hits[r["tp"]]["hit_rate"] for r in rows],
        name="prefix hits",
        marker=dict(color="#3aa6a0", **outline),
        text=[f"{100 * hits[r['tp']]['hit_rate']:.0f}%" for r in rows],
        textposition="inside",
        showlegend=False,
        row=1,
        col=2,
    )
    for key, (label, color) in LATENCY.items():
        fig.add_bar(
            x=names,
            y=[r[key] * 1e3 for r in rows],
            name=f"per token, {label}",
            legendgroup=key,
            marker=dict(color=color, **outline),
            row=1,
            col=3,
        )
    fig.update_layout(barmode="group")
    fig.update_yaxes(range=[0, 100], row=1, col=2)
    figure_layout(fig, title=title, height=420)
    return fig.update_layout(
        width=FIT_WIDTH, legend=dict(orientation="h", x=0, y=-0.18, yanchor="top"), margin=dict(l=50, r=20, b=90)
    )


def summary(row: dict, hit: dict, router: str, context: int) -> str:
    """The chosen layout's numbers in two lines."""
    ms = row["tpot"] * 1e3
    return (
        f"<b>{row['layout']}</b>: {row['dp']} replica{'s' if row['dp'] > 1 else ''} of {row['tp']} GPU"
        f"{'s' if row['tp'] > 1 else ''}; weights {format_value(row['weights_per_gpu'] / 1e9)} GB per GPU leave "
        f"{format_value(row['kv_per_gpu'] / 1e9)} GB of KV cache, <b>{row['seqs_per_replica']:,} sequences</b> of "
        f"{context:,} tokens per replica ({row['seqs']:,} in all).<br>"
        f"The {router} router finds <b>{100 * hit['hit_rate']:.0f}%</b> of the trace's prompt tokens cached "
        f"(median time to first token {format_value(hit['ttft_p50'] * 1e3)} ms, "
        f"{format_value(hit['ttft_p50_no_cache'] * 1e3)} ms without the cache); a token every "
        f"{format_value(row['tpot_batch1'] * 1e3)} ms at batch 1, {format_value(ms)} ms at "
        f"{row['seqs_per_replica']:,} sequences: <b>{row['tokens_per_s']:,.0f} tokens/s</b> in all."
    )


def serving_dashboard(
    *,
    model: str = "llama-3.1-70b",
    hardware: str = "h100-sxm",
    gpus: int = 8,
    context: int = 8192,
    tp: int = 4,
    router: str = "prefix",
) -> w.VBox:
    """Controls -> ``serving_figure`` for every layout of ``gpus`` and a line on the chosen ``tp``.
    Settings it cannot draw (no layout fits, a tp that is not one of them) keep the last figure marked
    (stale) and say why in one red line (``widgets.mark_stale``). Returns a ``VBox`` with ``figure``,
    ``controls`` (name -> widget), ``message`` and ``update``."""
    c = {
        "model": w.Dropdown(options=dense_presets(), value=model, description="model"),
        "hardware": w.Dropdown(options=Hardware.presets(), value=hardware, description="device"),
        "gpus": w.SelectionSlider(options=POWERS_OF_TWO(0, 6), value=gpus, description="GPUs"),
        "context": w.SelectionSlider(options=POWERS_OF_TWO(10, 17), value=context, description="context"),
        "tp": w.ToggleButtons(options=list(TPS), value=tp, description="tp"),
        "router": w.ToggleButtons(options=list(ROUTERS), value=router, description="router"),
    }
    fit_controls(c.values())
    fig, message = go.FigureWidget(), w.HTML()

    def update(_change=None) -> None:
        v = {k: ctl.value for k, ctl in c.items()}
        try:
            rows, hits = serving_plan(v["model"], v["hardware"], v["gpus"], v["context"], v["router"])
            chosen = [r for r in rows if r["tp"] == v["tp"]]
            if not chosen:
                fits = ", ".join(f"tp={r['tp']}" for r in rows)
                raise ValueError(
                    f"tp={v['tp']} is no layout of {v['gpus']} GPUs that fits {v['model']} here; try {fits}"
                )
        except ValueError as e:
            message.value = refusal("Cannot serve", e)
            mark_stale(fig)
            return
        title = f"{v['model']} on {v['gpus']} × {v['hardware']}, context {v['context']:,} (predicted)"
        show_figure(fig, serving_figure(rows, hits, tp=v["tp"], title=title))
        message.value = (
            f"<div style='color:{GREY}'>{summary(chosen[0], hits[v['tp']], v['router'], v['context'])}</div>"
        )

    for ctl in c.values():
        ctl.observe(update, names="value")
    update()
    left = w.VBox([c["model"], c["hardware"], c["gpus"]])
    right = w.VBox([c["context"], c["tp"], c["router"]])
    box = w.VBox([w.HBox([left, right]), fig, message])
    box.figure, box.controls, box.message, box.update = fig, c, message, update
    return box


__all__ = ["serving_dashboard", "serving_figure", "serving_plan", "summary", "trace"]
