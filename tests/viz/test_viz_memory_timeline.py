"""The step's memory timeline figure: one stacked area per category that is ever held, phases named, the
peak marked with its value, a budget line and the totals of other runs (``viz.memory_timeline``)."""

from __future__ import annotations

from playbook.measure.memory_timeline import CATEGORIES, MemoryTimeline
from playbook.viz.memory_timeline import memory_timeline_figure


def timeline(activations):
    n = len(activations)
    series = {c: (0,) * n for c in CATEGORIES}
    series |= {"params": (4_000_000,) * n, "activations": tuple(activations)}
    phases = {"forward 1": (0.0, 1.0), "backward 1": (1.0, 2.0), "optimizer": (2.0, 2.5)}
    return MemoryTimeline(
        times_ms=(0.0, 0.5, 1.0, 1.5, 2.5)[:n], series=series, phases=phases, raw_rise=max(activations)
    )


def test_stacked_categories_phases_peak_budget_and_other_totals():
    step, fixed = timeline([0, 3_000_000, 6_000_000, 2_000_000, 0]), timeline([0, 1_000_000, 2_000_000, 1_000_000, 0])
    fig = memory_timeline_figure(step, others={"fixed": fixed}, budget=8e6, unit="MB")
    stacked = [t for t in fig.data if t.stackgroup == "step"]
    assert [t.name for t in stacked] == ["parameters", "activations"]  # the zero categories are left out
    assert list(stacked[1].y) == [0, 3, 6, 2, 0]
    other = next(t for t in fig.data if t.name == "total: fixed")
    assert list(other.y) == [4, 5, 6, 5, 4] and other.stackgroup is None
    peak = next(t for t in fig.data if t.name == "peak")
    assert (peak.x[0], peak.y[0], peak.text[0]) == (1.0, 10.0, "peak 10.0 MB")
    assert [a.text for a in fig.layout.annotations][:3] == ["forward 1", "backward 1", "optimizer"]
    assert len(fig.layout.shapes) == 2  # the backward's band and the budget line
    assert fig.layout.shapes[1].y0 == 8.0 and fig.layout.yaxis.range[1] > 10.0
