"""The steps' memory timeline figure: one panel per run, one stacked area per category that is ever held,
phases named, each peak marked with its value, a budget line in every panel (``viz.memory_timeline``)."""

from __future__ import annotations

from playbook.measure.memory_timeline import CATEGORIES, MemoryTimeline
from playbook.viz.memory_timeline import memory_timeline_figure


def timeline(activations, grads=None):
    n = len(activations)
    series = {c: (0,) * n for c in CATEGORIES}
    series |= {"params": (4_000_000,) * n, "activations": tuple(activations), "grads": tuple(grads or (0,) * n)}
    phases = {"forward 1": (0.0, 1.0), "backward 1": (1.0, 2.0), "optimizer": (2.0, 2.5)}
    return MemoryTimeline(times_ms=(0.0, 0.5, 1.0, 1.5, 2.5), series=series, phases=phases, raw_rise=0)


def test_one_panel_stacked_by_category_with_phases_peak_and_budget():
    fig = memory_timeline_figure(timeline([0, 3_000_000, 6_000_000, 2_000_000, 0]), budget=8e6, unit="MB")
    stacked = [t for t in fig.data if t.stackgroup]
    assert [t.name for t in stacked] == ["parameters", "activations"]  # the categories never held are left out
    assert list(stacked[1].y) == [0, 3, 6, 2, 0]
    peak = next(t for t in fig.data if t.name == "peak")
    assert (peak.x[0], peak.y[0], peak.text[0]) == (1.0, 10.0, "peak 10.0 MB")
    texts = [a.text for a in fig.layout.annotations]
    assert texts == ["forward 1", "backward 1", "optimizer", "budget 8.00 MB"]
    assert [s.type for s in fig.layout.shapes] == ["rect", "line"] and fig.layout.shapes[1].y0 == 8.0
    assert fig.layout.yaxis.range[1] > 10.0


def test_several_runs_one_panel_each_on_one_scale_and_one_legend_entry_per_category():
    runs = {
        "as is": timeline([0, 3e6, 6e6, 2e6, 0]),
        "fixed": timeline([0, 1e6, 2e6, 1e6, 0], grads=[0, 0, 1e6, 1e6, 1e6]),
    }
    fig = memory_timeline_figure(runs, budget=8e6)
    assert [a.text for a in fig.layout.annotations][:2] == ["as is", "fixed"]  # the panels' titles
    assert {t.stackgroup for t in fig.data if t.stackgroup} == {"run 1", "run 2"}
    assert [t.name for t in fig.data if t.showlegend is not False] == ["parameters", "activations", "gradients"]
    assert fig.layout.yaxis.range == fig.layout.yaxis2.range  # one scale: the fix's panel is visibly lower
    peaks = [t.y[0] for t in fig.data if t.name == "peak"]
    assert peaks == [10.0, 7.0]
    assert sum(s.type == "line" for s in fig.layout.shapes) == 2  # the budget in each panel
