"""Compare & show: figures (pure, data -> plotly figure) and dashboards (controls -> figures)."""

from playbook.viz.figures import (
    CATEGORY_COLORS,
    CATEGORY_LABELS,
    UNITS,
    format_value,
    loss_curves,
    memory_bars,
    predicted_vs_measured,
    timeline,
    unit_scale,
)
from playbook.viz.widgets import memory_budgets, memory_dashboard

__all__ = [
    "CATEGORY_COLORS",
    "CATEGORY_LABELS",
    "UNITS",
    "format_value",
    "loss_curves",
    "memory_bars",
    "memory_budgets",
    "memory_dashboard",
    "predicted_vs_measured",
    "timeline",
    "unit_scale",
]
