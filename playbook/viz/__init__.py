"""Compare & show: figures (pure, data -> plotly figure) and dashboards (controls -> figures)."""

from playbook.viz._plotly import pio  # first: plotly.io without nbformat, before any module here imports it
from playbook.viz.figures import (
    CATEGORY_COLORS,
    CATEGORY_LABELS,
    UNITS,
    format_value,
    loss_curves,
    TEMPLATE,
    timeline,
    unit_scale,
)
from playbook.viz.memory_figures import memory_bars, predicted_vs_measured
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

# In a notebook, plotly's default sends only its JSON mimetype, which JupyterLab draws but a static
# HTML export (nbconvert) does not. Adding the "notebook" renderer embeds plotly.js once, so the
# same figures also show in exported chapters, offline.
if pio.renderers.default == "plotly_mimetype":
    pio.renderers.default = "plotly_mimetype+notebook"

# Every figure here draws in one template. Plotly applies its default template to a new figure
# without copying it, while ``update_layout(template=name)`` deep-copies the whole template each
# time (15-20 ms of CPU: most of what a small figure costs, paid again at every dashboard change).
pio.templates.default = TEMPLATE
