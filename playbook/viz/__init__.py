"""Compare & show: figures (pure, data -> plotly figure) and dashboards (controls -> figures).

- Shared: ``figures.py`` (colours, units, loss curves, timelines, ``figure_layout``),
  ``memory_figures.py`` (memory by category), ``memory_timeline.py`` (one step's memory over time),
  ``table.py`` (rows as a table), ``diagrams.py``,
  ``widgets.py`` (controls, stale marks, ``show_figure``).
- A module per chapter, its dashboard beside it in ``<chapter>_dashboard.py``: ``memory_dashboard``
  (0), ``dp`` (1), ``zero`` (2), ``tp`` (3), ``pp`` (4), ``cp`` (5), ``ep`` + ``moe_balance`` (6),
  ``serving`` + ``serving_engine`` + ``serving_moe`` + ``serving_spec`` (7, its dashboard
  ``serving_dashboard``), ``mesh`` + ``mesh_layout`` (8), ``plan`` + ``calibrate`` (8b),
  ``activations`` (chapter 0's formulas).
"""

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
from playbook.viz.memory_timeline import memory_timeline_figure
from playbook.viz.widgets import memory_budgets

__all__ = [
    "CATEGORY_COLORS",
    "CATEGORY_LABELS",
    "UNITS",
    "format_value",
    "loss_curves",
    "memory_bars",
    "memory_timeline_figure",
    "memory_budgets",
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
