"""Chapter 2's dashboard: which ZeRO stage, how many ranks, which GPU, for the large presets (memory per rank
by stage from ``theory.hybrid.memory.training_memory``, bytes per step from ``theory.zero.zero``).
"""

from __future__ import annotations


import ipywidgets as w
import plotly.graph_objects as go

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.zero.zero import STAGES, zero_comm_per_step
from playbook.viz.figures import format_value
from playbook.viz.memory_figures import memory_bars
from playbook.viz.widgets import fit_controls, mark_stale, refusal, show_figure
from playbook.viz.zero import STAGE_NAMES, comm_volume_bars, fitting_devices, zero_budget


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
    lengths, wanted = list(c["seq_len"].options), {"seq_len": seq_len}

    def fit_seq_len() -> None:
        """Offer only the lengths the model takes, so the slider shows the length the figures use;
        the length last asked for comes back with a model that takes it."""
        longest = ModelConfig.preset(c["model"].value).max_seq_len
        ok = [n for n in lengths if n <= longest] or [longest]
        c["seq_len"].unobserve(update, names="value")
        c["seq_len"].options = ok  # (resets the value to the first option)
        c["seq_len"].value = max([n for n in ok if n <= wanted["seq_len"]] or ok[:1])
        c["seq_len"].observe(update, names="value")

    def update(change=None) -> None:
        if change is not None and change["owner"] is c["seq_len"]:
            wanted["seq_len"] = change["new"]
        try:
            if change is None or change["owner"] is c["model"]:
                fit_seq_len()
            v = {k: ctl.value for k, ctl in c.items()}
            cfg = ModelConfig.preset(v["model"])
            seq = v["seq_len"]
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
            message.value = refusal("Cannot compute", e)
            mark_stale(memory, comm)
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
