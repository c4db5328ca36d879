"""Chapter 7's dashboard (issue 48): a serving layout's KV room, prefix hits and latency per token for
every tp × dp split, each control changing what is drawn, settings it cannot draw marked (stale)."""

from __future__ import annotations

import pytest

from playbook import Hardware, ModelConfig
from playbook.hardware import MEM_UTIL
from playbook.theory.serving import serving
from playbook.viz.serving_dashboard import serving_dashboard, serving_plan
from playbook.viz.widgets import STALE


@pytest.fixture
def box():
    return serving_dashboard(model="llama-3.1-70b", hardware="h100-sxm", gpus=8, context=8192, tp=4, router="prefix")


def drawn(box) -> str:
    return repr([(t.name, list(t.x), list(t.y), t.marker.line.width) for t in box.figure.data])


def panel(box, name: str) -> dict:
    t = next(t for t in box.figure.data if t.name == name)
    return dict(zip(t.x, t.y))


def test_the_kv_room_is_what_the_engine_may_fill_less_weights_and_one_forward():
    """The three segments of a GPU's bar add up to MEM_UTIL of the device, and the KV segment is the
    budget ``kv_capacity`` gives that tp (vLLM's rule), for each layout of 8 GPUs."""
    box = serving_dashboard(gpus=8, tp=4)
    hw, cfg = Hardware.preset("h100-sxm"), ModelConfig.preset("llama-3.1-70b")
    weights, acts, kv = panel(box, "weights"), panel(box, "activations"), panel(box, "KV cache")
    assert set(kv) == {"tp2×dp4", "tp4×dp2", "tp8×dp1"}  # tp1 does not hold 70B's weights on an 80 GB GPU
    for layout in kv:
        tp = int(layout[2])
        cap = serving.kv_capacity(cfg, hw, context=8192, tp=tp)
        assert kv[layout] == pytest.approx(cap["kv_budget"] / 1e9)
        assert acts[layout] == pytest.approx(cap["activations"] / 1e9)
        assert weights[layout] + acts[layout] + kv[layout] == pytest.approx(MEM_UTIL * hw.capacity_bytes / 1e9)


def test_a_prefix_router_finds_at_least_what_round_robin_does_and_one_replica_is_either():
    rr = serving_plan("llama-3.1-70b", "h100-sxm", 8, 8192, "round-robin")[1]
    px = serving_plan("llama-3.1-70b", "h100-sxm", 8, 8192, "prefix")[1]
    assert all(px[tp]["hit_rate"] >= rr[tp]["hit_rate"] for tp in px)
    assert px[2]["hit_rate"] > rr[2]["hit_rate"]  # four replicas: round robin splits each conversation
    assert px[8]["hit_rate"] == pytest.approx(rr[8]["hit_rate"])  # dp = 1: one cache sees every request


@pytest.mark.parametrize(
    "control, value",
    [
        ("model", "llama-3.1-8b"),
        ("hardware", "h200"),
        ("gpus", 16),
        ("context", 4096),
        ("tp", 8),
        ("router", "round-robin"),
    ],
)
def test_every_control_changes_what_is_drawn_and_the_line_under_it(box, control, value):
    before, line = drawn(box) + repr(box.figure.layout.title.text), box.message.value
    box.controls[control].value = value
    assert "Cannot" not in box.message.value, box.message.value
    assert drawn(box) + repr(box.figure.layout.title.text) != before and box.message.value != line


def test_the_chosen_tp_is_outlined():
    box = serving_dashboard(tp=8)
    kv = next(t for t in box.figure.data if t.name == "KV cache")
    assert [x for x, width in zip(kv.x, kv.marker.line.width) if width] == ["tp8×dp1"]


def test_a_tp_that_does_not_fit_is_one_red_line_and_the_last_figure_stays_marked_stale(box):
    before = drawn(box)
    box.controls["tp"].value = 1  # 70B's bf16 weights alone exceed one H100
    assert "Cannot serve:" in box.message.value and "tp=2" in box.message.value
    assert drawn(box) == before and STALE in box.figure.layout.title.text
    box.controls["tp"].value = 4
    assert drawn(box) == before and STALE not in box.figure.layout.title.text


def test_its_memory_categories_have_the_book_s_colours_and_names(box):
    from playbook.viz.figures import CATEGORY_COLORS, CATEGORY_LABELS

    room = {t.name: t.marker.color for t in box.figure.data if t.legendgroup in CATEGORY_COLORS}
    assert room == {CATEGORY_LABELS[c]: CATEGORY_COLORS[c] for c in ("weights", "activations", "kv_cache")}
