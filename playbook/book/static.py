"""The live dashboards of the chapters, as figures that work without a kernel.

Each ``static_*`` function builds its dashboard's figure with the same pure builder the live
dashboard calls, over a small grid of control values (:func:`~playbook.book.grid.grid_figure`),
opened at the settings the chapter's cell passes. :data:`STATIC` maps a dashboard's function name to
its static form: the book builder finds a cell whose last line calls that function and shows the
static figure in place of the widget.
"""

from __future__ import annotations

import plotly.graph_objects as go

from playbook.book.grid import grid_figure
from playbook.config import Hardware, ModelConfig
from playbook.viz.figures import memory_bars
from playbook.viz.widgets import _count, memory_budgets

MEMORY_MODELS = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b"]
POWERS = [1, 4, 8, 16, 64, 256]


def _nearest(value, options):
    """``value`` if the grid has it, else the grid's closest value (a cell may start anywhere)."""
    return value if value in options else min(options, key=lambda o: abs(o - value))


def static_memory(
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
) -> go.Figure:
    """Chapter 0's memory dashboard (:func:`~playbook.viz.widgets.memory_dashboard`): training and
    serving memory per rank over model × ZeRO stage × recomputation × dp, the other settings fixed
    at the cell's values. Same budgets (:func:`memory_budgets`), same figure (:func:`memory_bars`)."""
    models = MEMORY_MODELS if model in MEMORY_MODELS else [*MEMORY_MODELS, model]
    hw = Hardware.preset(hardware)

    def build(model, zero, recompute, dp):
        cfg = ModelConfig.preset(model)
        budgets = memory_budgets(
            cfg, seq_len=seq_len, micro_batch=micro_batch, precision=precision, recompute=recompute, zero=zero, dp=dp
        )
        title = f"{cfg.name}: {_count(cfg.num_params())} params, ZeRO-{zero} over dp={dp}, seq {seq_len:,} × micro-batch {micro_batch}"
        return memory_bars(budgets, unit=unit, capacity=hw.memory_bytes, capacity_label=hw.name, title=title)

    return grid_figure(
        build,
        {"model": models, "zero": [0, 1, 2, 3], "recompute": ["none", "selective", "full"], "dp": POWERS},
        {"model": model, "zero": zero, "recompute": recompute, "dp": _nearest(dp, POWERS)},
        note=f"{precision} precision, {hardware}; the notebook's live dashboard has every setting",
    )


STATIC = {"memory_dashboard": static_memory}

__all__ = ["STATIC", "static_memory"]
