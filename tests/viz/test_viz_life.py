"""Chapter 10's figures and goodput dashboard (``viz.life``): what the figure draws is the theory's,
the stale-state rule, and every control changes the figure and brings it back. Driven through the
widgets, no browser."""

import pytest

from playbook.theory.life import cluster_mtbf, daly_interval, goodput, young_interval
from playbook.viz.life import goodput_dashboard, goodput_figure, iterations_figure
from playbook.viz.widgets import is_stale


def test_the_figure_marks_young_and_daly_at_their_intervals():
    save, mtbf, restart = 3.0, 11_000.0, 300.0
    fig = goodput_figure(save, mtbf, restart, interval=600.0)
    curve, young, daly, chosen = fig.data
    assert young.x[0] == pytest.approx(young_interval(save, mtbf) / 60) and "Young" in young.name
    assert daly.x[0] == pytest.approx(daly_interval(save, mtbf) / 60) and "Daly" in daly.name
    assert chosen.y[0] == pytest.approx(goodput(600.0, save, mtbf, restart))
    best = max(curve.y)
    assert best == pytest.approx(goodput(daly_interval(save, mtbf), save, mtbf, restart), rel=1e-4)


def test_refused_settings_leave_the_figure_stale_and_the_next_valid_ones_redraw_it():
    box = goodput_dashboard(gpus=16_384, save=3.0, restart=300.0)
    drawn = box.figure.layout.title.text
    assert "16,384 GPUs" in drawn and not is_stale(box.figure)
    box.controls["gpus"].value = 131_072
    box.controls["rate"].value = 4.0  # MTBF 3600 / (131,072 · 4 · 1.97e-5) ≈ 350 s
    assert 2 * cluster_mtbf(131_072, 4 * 1.9733e-5) < 1000
    box.controls["save"].value = 1000.0  # over two MTBFs: no interval keeps up
    assert "Cannot keep up" in box.message.value and is_stale(box.figure)
    assert box.figure.layout.title.text.startswith("131,072 GPUs")  # the last drawing, and it says so
    box.controls["save"].value = 3.0
    assert not is_stale(box.figure) and "save 3 s" in box.figure.layout.title.text


def _drawn(fig) -> dict:
    """What the page draws: the figure's JSON without the widget's per-trace uids."""
    out = fig.to_plotly_json()
    return {**out, "data": [{k: v for k, v in t.items() if k != "uid"} for t in out["data"]]}


def test_every_control_changes_the_figure_and_moving_it_back_restores_it():
    box = goodput_dashboard(gpus=16_384, save=2.8, restart=300.0)
    for name, ctl in box.controls.items():
        before = _drawn(box.figure)
        options = list(ctl.options) if hasattr(ctl, "options") else None
        old = ctl.value
        if options is not None:
            values = [o[1] if isinstance(o, tuple) else o for o in options]
            ctl.value = values[(values.index(old) + 1) % len(values)]
        else:
            ctl.value = min(ctl.max, old + ctl.step) if old + ctl.step <= ctl.max else old - ctl.step
        assert _drawn(box.figure) != before, name
        ctl.value = old
        assert _drawn(box.figure) == before, name


def test_the_iterations_figure_shows_the_input_waits():
    spans = []
    for rank in (0, 1):
        t = 0.0
        for step in range(4):
            spans.append({"rank": rank, "kind": "compute", "name": "input wait", "start": t, "end": t + 0.2})
            spans.append({"rank": rank, "kind": "compute", "name": f"step {step}", "start": t + 0.2, "end": t + 0.25})
            spans.append(
                {"rank": rank, "kind": "comm", "name": "all_reduce", "axis": "dp", "start": t + 0.24, "end": t + 0.25}
            )
            t += 0.25
    fig = iterations_figure(spans, last=2)
    names = {trace.name for trace in fig.data}
    assert names == {"input wait", "step", "dp all_reduce"}
    waits = [trace for trace in fig.data if trace.name == "input wait"][0]
    assert len(waits.x) == 2 * 2 and all(x == pytest.approx(200.0) for x in waits.x)  # ms
