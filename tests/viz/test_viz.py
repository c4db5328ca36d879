"""Figures and dashboards, checked by their data (never by pixels)."""

import plotly.graph_objects as go
import pytest

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.hybrid.memory import inference_memory, training_memory
from playbook.viz import (
    UNITS,
    CATEGORY_COLORS,
    loss_curves,
    memory_bars,
    memory_budgets,
    predicted_vs_measured,
    timeline,
    unit_scale,
)
from playbook.viz.memory_dashboard import memory_dashboard
from playbook.viz.widgets import STALE


def traces_by_group(fig):
    return {t.legendgroup: t for t in fig.data}


# ---- memory_bars -------------------------------------------------------------------------------
def test_memory_bars_converts_units_and_skips_zero_categories():
    budgets = {
        "predicted": {"params": 2e9, "grads": 2e9, "optimizer": 12e9, "activations": 0.0, "total": 16e9},
        "measured": {"params": 2e9, "grads": 2e9, "optimizer": 12e9, "activations": 0.0, "total": 16e9},
    }
    fig = memory_bars(budgets, unit="GB")
    assert isinstance(fig, go.Figure)
    traces = traces_by_group(fig)
    assert list(traces) == ["params", "grads", "optimizer"]  # activations all zero, total ignored
    assert list(traces["params"].x) == ["predicted", "measured"]
    assert list(traces["params"].y) == [2.0, 2.0]
    assert list(traces["optimizer"].y) == [12.0, 12.0]
    assert list(traces["params"].customdata) == [2e9, 2e9]  # exact bytes for the hover
    assert fig.layout.barmode == "stack"
    assert "GB" in fig.layout.yaxis.title.text
    assert [a.text for a in fig.layout.annotations] == ["<b>16.0 GB</b>", "<b>16.0 GB</b>"]
    assert [a.y for a in fig.layout.annotations] == [16.0, 16.0]


@pytest.mark.parametrize("unit, expected", [("GiB", 2.0), ("MB", 2**31 / 1e6), ("KB", 2**31 / 1e3), ("bytes", 2.0**31)])
def test_memory_bars_units(unit, expected):
    fig = memory_bars({"one": {"weights": 2**31, "kv_cache": 2**30}}, unit=unit)
    w, kv = traces_by_group(fig)["weights"], traces_by_group(fig)["kv_cache"]
    assert w.y[0] == pytest.approx(expected)
    assert kv.y[0] == pytest.approx(expected / 2)
    assert w.marker.color == CATEGORY_COLORS["weights"]


def test_memory_bars_capacity_line_and_bad_unit():
    fig = memory_bars({"a": {"params": 100e9}}, capacity=80e9, capacity_label="H100 80 GB")
    (line,) = fig.layout.shapes
    assert line.y0 == line.y1 == 80.0 and line.line.dash == "dash"
    assert any("H100 80 GB" in a.text for a in fig.layout.annotations)
    assert fig.layout.yaxis.range[1] >= 80.0  # the line is inside the plot
    assert not memory_bars({"a": {"params": 1e9}}).layout.shapes
    small = memory_bars({"a": {"params": 1e9}}, capacity=80e9, capacity_label="H100")  # 80x the bar
    assert not small.layout.shapes and any("off the scale" in a.text for a in small.layout.annotations)
    assert small.layout.yaxis.range[1] < 2
    with pytest.raises(ValueError, match="unit must be one of"):
        memory_bars({"a": {"params": 1e9}}, unit="gigs")


def test_memory_bars_same_colour_for_a_category_everywhere():
    one = memory_bars({"x": {"activations": 5, "params": 1}})
    two = memory_bars({"y": {"grads": 3, "activations": 7}})
    assert traces_by_group(one)["activations"].marker.color == traces_by_group(two)["activations"].marker.color


# ---- predicted_vs_measured ---------------------------------------------------------------------
def test_predicted_vs_measured_shows_both_series_with_difference():
    fig = predicted_vs_measured(
        {"params": 4000, "activations": 2000, "total": 6000}, {"params": 4000, "activations": 2200}, unit="KB"
    )
    pred, meas = fig.data
    assert (pred.name, meas.name) == ("predicted", "measured")
    assert list(pred.x) == list(meas.x) == ["parameters", "activations"]
    assert list(pred.y) == [4.0, 2.0]
    assert list(meas.y) == pytest.approx([4.0, 2.2])
    assert list(meas.text) == ["exact", "+10.0%"]
    assert fig.layout.barmode == "group"


def test_predicted_vs_measured_collectives_and_missing_entries():
    fig = predicted_vs_measured({"all_reduce": 1e6, "broadcast": 5e5}, {"all_reduce": 0.9e6}, unit="MB")
    pred, meas = fig.data
    assert list(pred.x) == ["all_reduce", "broadcast"]
    assert meas.y[1] is None
    assert list(meas.text) == ["-10.0%", "n/a"]


# ---- loss_curves -------------------------------------------------------------------------------
def test_loss_curves_one_line_per_run_and_floor():
    fig = loss_curves({"1 rank": [3.0, 2.0, 1.5], "4 ranks": [3.0, 2.0, 1.5]}, floor=1.2)
    assert [t.name for t in fig.data] == ["1 rank", "4 ranks"]
    assert list(fig.data[1].x) == [0, 1, 2] and list(fig.data[1].y) == [3.0, 2.0, 1.5]
    assert fig.data[0].line.dash != fig.data[1].line.dash  # identical runs stay distinguishable
    (floor,) = fig.layout.shapes
    assert floor.y0 == 1.2
    assert not loss_curves({"a": [1.0]}).layout.shapes


# ---- timeline ----------------------------------------------------------------------------------
def test_timeline_places_spans_in_ms_per_rank():
    spans = [
        {"rank": 0, "kind": "compute", "name": "forward", "start": 10.000, "end": 10.004},
        {"rank": 1, "kind": "compute", "name": "forward", "start": 10.001, "end": 10.003},
        {
            "rank": 0,
            "kind": "comm",
            "name": "all_reduce",
            "start": 10.004,
            "end": 10.010,
            "bytes": 4096,
            "sent_bytes": 4096.0,
            "group": "world",
        },
        {"rank": 1, "kind": "comm", "name": "broadcast", "start": 10.005, "end": None},  # never waited: skipped
    ]
    fig = timeline(spans)
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"forward", "all_reduce"}
    fwd, ar = by_name["forward"], by_name["all_reduce"]
    assert fwd.orientation == "h"
    assert list(fwd.y) == ["rank 0", "rank 1"]
    assert list(fwd.base) == pytest.approx([0.0, 1.0])
    assert list(fwd.x) == pytest.approx([4.0, 2.0])
    assert list(ar.base) == pytest.approx([4.0]) and list(ar.x) == pytest.approx([6.0])
    assert ar.customdata[0][0] == 4096
    assert fwd.marker.color != ar.marker.color
    assert list(fig.layout.yaxis.categoryarray) == ["rank 0", "rank 1"]
    assert "ms" in fig.layout.xaxis.title.text
    assert fig.layout.barmode == "overlay"


def test_timeline_accepts_span_objects_and_empty_input():
    class FakeSpan:
        def as_dict(self):
            return {"rank": 2, "kind": "compute", "name": "step", "start": 1.0, "end": 1.5}

    fig = timeline([FakeSpan()])
    assert list(fig.data[0].y) == ["rank 2"] and list(fig.data[0].x) == pytest.approx([500.0])
    assert len(timeline([]).data) == 0


# ---- dashboard ---------------------------------------------------------------------------------
def expected_training(model="llama-3.1-70b", **kw):
    settings = dict(seq_len=4096, micro_batch=1, dp=8, zero=0, recompute="none", precision="mixed") | kw
    return training_memory(ModelConfig.preset(model), **settings).as_dict()


def test_memory_budgets_matches_the_calculators():
    cfg = ModelConfig.preset("llama-3.1-8b")
    b = memory_budgets(cfg, seq_len=2048, micro_batch=2, zero=2, dp=4)
    assert b["training (per rank)"] == training_memory(cfg, seq_len=2048, micro_batch=2, zero=2, dp=4).as_dict()
    assert b["inference (per rank)"] == inference_memory(cfg, batch=2, seq_len=2048, dtype="bf16").as_dict()


def test_dashboard_defaults_and_in_place_updates():
    box = memory_dashboard()
    fig, c = box.figure, box.controls
    assert isinstance(fig, go.FigureWidget)
    assert set(c) >= {"model", "seq_len", "micro_batch", "precision", "recompute", "zero", "dp", "hardware", "unit"}
    params = traces_by_group(fig)["params"]
    assert list(params.x) == ["training (per rank)", "inference (per rank)"]
    assert params.y[0] == pytest.approx(expected_training()["params"] / 1e9)
    assert fig.layout.shapes[0].y0 == pytest.approx(Hardware.preset("h100-sxm").usable_bytes / 1e9)  # the fit rule
    assert "does not fit" in box.message.value

    c["zero"].value = 3
    assert fig is box.figure  # updated in place, not rebuilt
    t = traces_by_group(fig)
    want = expected_training(zero=3)
    for cat in ("params", "grads", "optimizer", "activations"):
        assert t[cat].y[0] == pytest.approx(want[cat] / 1e9)

    c["dp"].value = 64
    assert traces_by_group(fig)["optimizer"].y[0] == pytest.approx(expected_training(zero=3, dp=64)["optimizer"] / 1e9)

    c["unit"].value = "GiB"
    assert traces_by_group(fig)["optimizer"].y[0] == pytest.approx(
        expected_training(zero=3, dp=64)["optimizer"] / 2**30
    )
    assert "GiB" in fig.layout.yaxis.title.text


def test_dashboard_fp32_grad_accum_checkbox():
    box = memory_dashboard(model="llama-3.1-8b", seq_len=1024, dp=8, zero=2)
    psi = 8_030_261_248
    assert traces_by_group(box.figure)["grads"].y[0] == pytest.approx(2 * psi / 8 / 1e9)  # bf16 grads, ZeRO-2 over 8
    box.controls["fp32_grad_accum"].value = True
    assert traces_by_group(box.figure)["grads"].y[0] == pytest.approx((2 + 4) * psi / 8 / 1e9)  # + the fp32 buffer
    assert "20Ψ" in box.message.value
    box.controls["precision"].value = "fp32"  # fp32 grads need no second fp32 copy: disabled, and it says so
    assert box.controls["fp32_grad_accum"].disabled and "mixed only" in box.controls["fp32_grad_accum"].description
    assert traces_by_group(box.figure)["grads"].y[0] == pytest.approx(4 * psi / 8 / 1e9) and "16Ψ" in box.message.value
    box.controls["precision"].value = "mixed"
    assert not box.controls["fp32_grad_accum"].disabled and "20Ψ" in box.message.value


def test_dashboard_disables_sequence_parallelism_without_tp():
    box = memory_dashboard(model="llama-3.1-8b", seq_len=4096, dp=8)
    sp, figure = box.controls["sequence_parallel"], box.figure
    assert sp.disabled and "tp > 1" in sp.description
    sp.value = True
    before = traces_by_group(figure)["activations"].y[0]
    box.controls["tp"].value = 4
    assert not sp.disabled  # now it counts: the norms' activations split over tp
    with_sp = traces_by_group(figure)["activations"].y[0]
    sp.value = False
    assert traces_by_group(figure)["activations"].y[0] > with_sp < before


def test_dashboard_small_model_fits():
    box = memory_dashboard(seq_len=128, dp=1, hardware="a100-80gb")
    assert box.figure.layout.shapes  # 70B: the capacity line is drawn
    box.controls["model"].value = "gpt-tiny"
    assert "fits one a100-80gb" in box.message.value and "does not fit" not in box.message.value
    assert not box.figure.layout.shapes  # 80 GB is off the scale of a tiny model's bars
    assert any("off the scale" in a.text for a in box.figure.layout.annotations)


def test_dashboard_shows_refused_settings_instead_of_raising():
    box = memory_dashboard()
    before = list(traces_by_group(box.figure)["params"].y)
    box.controls["micro_batch"].min = 0
    box.controls["micro_batch"].value = 0  # the calculator refuses a zero size
    assert "color:#c62828" in box.message.value and "Cannot compute" in box.message.value
    assert "micro_batch must be a positive integer" in box.message.value
    assert list(traces_by_group(box.figure)["params"].y) == before
    assert box.figure.layout.title.text.startswith("llama-3.1-70b") and STALE in box.figure.layout.title.text
    box.controls["micro_batch"].value = 1
    box.controls["model"].value = "llama-3.1-8b"  # and it recovers
    assert "Cannot compute" not in box.message.value and STALE not in box.figure.layout.title.text
    assert traces_by_group(box.figure)["params"].y[0] == pytest.approx(
        expected_training("llama-3.1-8b")["params"] / 1e9
    )


def test_dashboard_labels_speak_one_unit():
    """At GiB the capacity line's label, the totals and the axis say GiB only (the device's reported
    memory too: 81,559 MiB is 79.6 GiB, 85.5 GB), and back at GB, GB only."""
    box = memory_dashboard(model="llama-3.1-8b")
    for unit, other in (("GiB", " GB"), ("GB", "GiB")):
        box.controls["unit"].value = unit
        texts = [a.text for a in box.figure.layout.annotations] + [box.figure.layout.yaxis.title.text]
        assert all(other not in t for t in texts), texts
        assert any(t.startswith(f"h100-sxm: 90 % of {81559 * 2**20 / UNITS[unit]:.1f} {unit}") for t in texts)


def test_unit_scale():
    assert unit_scale("GB") == 1e9 and unit_scale("GiB") == 2**30


def test_dashboard_follows_the_other_parallel_degrees():
    box = memory_dashboard(model="llama-3.1-70b", seq_len=4096, dp=8, zero=0)
    box.controls["tp"].value = 8
    cfg = ModelConfig.preset("llama-3.1-70b")
    want = training_memory(cfg, seq_len=4096, micro_batch=1, dp=8, tp=8)
    assert traces_by_group(box.figure)["params"].y[0] == pytest.approx(want.params / 1e9)
    assert "tp=8" in box.figure.layout.title.text
    box.controls["cp"].value = 2  # tp and cp together: each rank's local shapes (theory.stages)
    both = training_memory(cfg, seq_len=4096, micro_batch=1, dp=8, tp=8, cp=2)
    assert traces_by_group(box.figure)["activations"].y[0] == pytest.approx(both.activations / 1e9)
    assert both.activations < want.activations  # s/cp tokens per rank
    assert "Cannot compute" not in box.message.value


def test_activation_formulas_figure_carries_the_rows():
    from playbook.theory.inventory.activations import korthikanti_vs_exact
    from playbook.viz.activations import SERIES, activation_formulas_figure

    rows = korthikanti_vs_exact(ModelConfig.preset("llama-3.1-8b"), [1024, 4096])
    fig = activation_formulas_figure(rows, unit="GiB", title="t")
    assert [t.name for t in fig.data] == list(SERIES.values())
    for trace, key in zip(fig.data, SERIES):
        assert list(trace.x) == [1024, 4096]
        assert list(trace.y) == [r[key] / 2**30 for r in rows]


def test_the_capacity_label_moves_off_a_bar_total_near_the_line():
    def side(*totals):
        fig = memory_bars({f"t{i}": {"params": t * 1e9} for i, t in enumerate(totals)}, capacity=80e9)
        (label,) = [a for a in fig.layout.annotations if "capacity" in a.text]
        return label.xanchor, label.yanchor

    assert side(443, 228, 120, 40) == ("right", "bottom")  # above the line's right end
    assert side(443, 228, 120, 66) == ("left", "bottom")  # the last total sits at the line: left end
    assert side(78, 20, 79) == ("right", "top")  # both ends near: below the line


@pytest.mark.ranks  # a fresh Python
def test_importing_viz_leaves_nbformat_unimported_and_show_still_checks_its_version():
    """Every kernel imports playbook.viz; nbformat (via jsonschema and rfc3987_syntax) costs it ~2 s.
    plotly's show() still reads the real nbformat's version (importlib.metadata, an independent source)."""
    import subprocess
    import sys

    code = (
        "import sys, importlib.metadata as m, playbook.viz, plotly.io._renderers as r\n"
        "assert 'nbformat' not in sys.modules and 'jsonschema' not in sys.modules, 'nbformat imported'\n"
        "assert r.nbformat.__version__ == m.version('nbformat'), r.nbformat.__version__\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-600:]


def test_dashboards_judge_a_fit_by_the_one_rule():
    """90 % of what the device reports (``Hardware.usable_bytes``), as the planner and ``playbook
    memory`` judge it: a total between that and the datasheet's 80e9 does not fit an H100."""
    from playbook.viz.zero import fitting_devices

    h100 = Hardware.preset("h100-sxm")
    assert h100.usable_bytes < 78e9 < h100.memory_bytes
    rows = {name: (cap, ok) for name, cap, ok in fitting_devices(78e9)}
    assert rows["h100-sxm"] == (h100.usable_bytes, False) and rows["h200"][1]
    box = memory_dashboard(model="gpt-tiny", seq_len=128, dp=1, hardware="h100-sxm")
    assert "fits one h100-sxm (90 % of the 85.5 GB it reports" in box.message.value
