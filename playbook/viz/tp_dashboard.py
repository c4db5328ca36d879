"""Chapter 3's dashboard: controls (preset, t, sequence parallelism, sequence length, micro-batch,
device) -> per-rank weights and activations for every valid t, one layer's communication and time,
and the shard diagram, all from the calculators in ``playbook.theory.tp.tp`` (``tp_numbers``) drawn by
the figures of ``playbook.viz.tp``.
"""

from __future__ import annotations


import ipywidgets as w
import plotly.graph_objects as go

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.tp.comm import layer_comm, layer_seconds
from playbook.theory.tp.layout import params_per_rank, valid_tp
from playbook.theory.tp.tp import tp_block_activation_breakdown
from playbook.viz.figures import format_value, unit_scale
from playbook.viz.memory_figures import memory_bars
from playbook.viz.tp import layer_time, shard_diagram
from playbook.viz.widgets import dense_presets, fit_controls, mark_stale, refusal, show_figure


def _bytes(x: float) -> str:
    for unit in ("GB", "MB", "KB"):
        if x >= unit_scale(unit):
            return f"{format_value(x / unit_scale(unit))} {unit}"
    return f"{x:,.0f} bytes"


def tp_numbers(
    cfg: ModelConfig,
    *,
    tp: int,
    sequence_parallel: bool,
    seq_len: int,
    micro_batch: int,
    hardware: Hardware,
    efficiency: float = 0.5,
    regather: bool = False,
) -> dict:
    """Everything the dashboard shows, in bytes and seconds, 16-bit (bf16 weights and activations)."""
    regather = regather and sequence_parallel
    sizes = dict(seq_len=seq_len, micro_batch=micro_batch)
    budgets = {}
    for t in valid_tp(cfg):
        p = params_per_rank(cfg, t)
        acts = cfg.n_layers * sum(
            tp_block_activation_breakdown(
                cfg,
                **sizes,
                tp=t,
                sequence_parallel=sequence_parallel and t > 1,
                regather=regather and t > 1,
                dtype_bytes=2,
            ).values()
        )
        budgets[f"t={t}"] = {"weights": 2 * (p["split"] + p["replicated"]), "activations": acts}
    comm = layer_comm(cfg, **sizes, tp=tp, sequence_parallel=sequence_parallel, regather=regather, dtype_bytes=2)
    times = [
        layer_seconds(
            cfg,
            **sizes,
            tp=t,
            hardware=hardware,
            flops_per_s=efficiency * hardware.peak_bf16_flops,
            sequence_parallel=sequence_parallel,
            regather=regather,
        )
        for t in valid_tp(cfg)
    ]
    return {"budgets": budgets, "comm": comm, "times": times, "params": params_per_rank(cfg, tp)}


def tp_mode(sequence_parallel: bool, regather: bool) -> str:
    """How the figures name the layout: TP, TP+SP, or TP+SP (shards saved)."""
    return ("TP+SP" + (" (shards saved)" if regather else "")) if sequence_parallel else "TP"


def tp_memory_bars(cfg: ModelConfig, numbers: dict, hw: Hardware, detail: str) -> go.Figure:
    """The memory figure of ``tp_numbers``: weights and activations per rank for every valid t, in GB,
    MB or KB by the tallest bar, against the device's fit line; ``detail`` ends the title."""
    top = max(sum(b.values()) for b in numbers["budgets"].values())
    return memory_bars(
        numbers["budgets"],
        unit="GB" if top >= 1e9 else "MB" if top >= 1e6 else "KB",
        capacity=hw.usable_bytes,
        capacity_label=hw.fit_label,
        title=f"{cfg.name} per rank, bf16 weights + activations{detail}",
    )


def tp_dashboard(
    *,
    model: str = "llama-3.1-70b",
    tp: int = 8,
    sequence_parallel: bool = True,
    regather: bool = False,
    seq_len: int = 4096,
    micro_batch: int = 1,
    hardware: str = "h100-sxm",
    efficiency: float = 0.5,
) -> w.VBox:
    """Controls (preset, t, SP, regather, sequence length, micro-batch, hardware) -> per-rank weights and
    activations for every valid t, one layer's communication and time, and the shard diagram.
    Returns a VBox with ``figures`` (dict of live FigureWidgets), ``controls`` and ``message``."""
    presets = dense_presets()
    c = {
        "model": w.Dropdown(options=presets, value=model, description="model"),
        "tp": w.Dropdown(options=valid_tp(ModelConfig.preset(model)), value=tp, description="t"),
        "sequence_parallel": w.Checkbox(value=sequence_parallel, description="sequence parallel"),
        "regather": w.Checkbox(value=regather, description="SP: save shards, re-gather in backward"),
        "seq_len": w.SelectionSlider(options=[2**k for k in range(7, 18)], value=seq_len, description="seq_len"),
        "micro_batch": w.IntSlider(min=1, max=32, value=micro_batch, description="micro_batch"),
        "hardware": w.Dropdown(options=Hardware.presets(), value=hardware, description="device"),
    }
    fit_controls(c.values())
    figs = {k: go.FigureWidget() for k in ("memory", "time", "shards")}
    message = w.HTML()

    def update(change=None) -> None:
        if change is not None and change["owner"] is c["model"]:
            ok = valid_tp(ModelConfig.preset(c["model"].value))
            c["tp"].unobserve(update, names="value")
            c["tp"].options, c["tp"].value = ok, max(t for t in ok if t <= max(c["tp"].value, 1))
            c["tp"].observe(update, names="value")
        c["regather"].disabled = not c["sequence_parallel"].value  # it does nothing without SP
        c["regather"].tooltip = (
            "saving the shards is a choice of sequence parallelism: tick sequence parallel to use it"
            if c["regather"].disabled
            else "keep each rank's sequence shard and all-gather it again in the backward (less memory, more bytes)"
        )
        v = {k: ctl.value for k, ctl in c.items()}
        v["regather"] = v["regather"] and v["sequence_parallel"]
        try:
            cfg, hw = ModelConfig.preset(v["model"]), Hardware.preset(v["hardware"])
            n = tp_numbers(
                cfg,
                tp=v["tp"],
                sequence_parallel=v["sequence_parallel"],
                seq_len=v["seq_len"],
                micro_batch=v["micro_batch"],
                hardware=hw,
                efficiency=efficiency,
                regather=v["regather"],
            )
        except (ValueError, NotImplementedError) as e:
            message.value = refusal("Cannot compute", e)
            mark_stale(*figs.values())
            return
        mode = tp_mode(v["sequence_parallel"], v["regather"])
        sizes = f"seq {v['seq_len']:,} × micro-batch {v['micro_batch']}"
        show_figure(figs["memory"], tp_memory_bars(cfg, n, hw, f"<br><sup>{mode}, {sizes}</sup>"))
        show_figure(
            figs["time"],
            layer_time(
                n["times"],
                title=f"one layer per rank on {hw.name}<br><sup>compute at {efficiency:.0%} of peak "
                f"vs predicted {mode} communication</sup>",
            ),
        )
        show_figure(figs["shards"], shard_diagram(cfg, v["tp"]))
        fwd, p, t = n["comm"]["forward"], n["params"], v["tp"]
        now = n["times"][valid_tp(cfg).index(t)]
        again = ", plus 2 all-gathers to re-gather the saved shards" if v["sequence_parallel"] and v["regather"] else ""
        ops = ", ".join(f"{k.replace('_', '-')} ×{x}" for k, x in fwd.items() if k != "sent_bytes") or "none"
        lines = [
            f"<b>t={t}, {mode}</b>: each rank holds {_bytes(2 * (p['split'] + p['replicated']))} of bf16 weights: "
            f"1/{t} of every matrix, plus all {p['replicated']:,} norm weights (replicated).",
            f"<b>Per layer, forward</b>: {ops}; {_bytes(fwd['sent_bytes'])} sent per rank "
            f"(the same backward{again}) "
            f"= 8bsh(t−1)/t in 16-bit.",
            f"<b>Per layer time</b> at t={t}: compute {format_value(now['compute'] * 1e3)} ms, "
            f"communication {format_value(now['comm'] * 1e3)} ms "
            f"({'intra' if t <= hw.devices_per_node else 'inter'}-node link).",
        ]
        if v["seq_len"] > cfg.max_seq_len:
            lines.append(
                f"<span style='color:#b26a00'>Note: seq_len={v['seq_len']:,} exceeds this model's "
                f"max_seq_len={cfg.max_seq_len:,}.</span>"
            )
        message.value = "<br>".join(lines)

    for ctl in c.values():
        ctl.observe(update, names="value")
    update()
    controls = w.HBox(
        [
            w.VBox([c["model"], c["tp"], c["sequence_parallel"], c["regather"]]),
            w.VBox([c["seq_len"], c["micro_batch"], c["hardware"]]),
        ]
    )
    box = w.VBox([controls, message, figs["memory"], figs["time"], figs["shards"]])
    box.figures, box.controls, box.message, box.update = figs, c, message, update
    return box
