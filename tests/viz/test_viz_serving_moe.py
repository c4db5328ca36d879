"""The MoE serving figure: one stacked bar per layout, weights + own KV + copies, in each panel's unit."""

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.serving.moe_layouts import compare_moe_layouts
from playbook.viz.serving_moe import moe_memory, moe_rows


def test_each_bar_stacks_to_the_gpus_weights_and_kv_room():
    rows = compare_moe_layouts(
        ModelConfig.preset("deepseek-v3"), Hardware.preset("h200"), gpus=8, context=8192, dtype="fp8"
    )
    fig = moe_memory(
        {"v3": (moe_rows(rows), 1e9, "GB"), "tiny": ([{"label": "x", "kv": 2e3, "replicated_kv": 1e3}], 1e3, "KB")}
    )
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == 6 and {b.name for b in bars if b.showlegend} == {
        "weights",
        "KV cache, own share",
        "KV cache, copies of another rank's",
    }
    v3 = bars[:3]
    for i, r in enumerate(rows):  # weights + own share + copies = weights + the whole KV room
        assert abs(sum(b.y[i] for b in v3) - (r["weights_per_gpu"] + r["kv_per_gpu"]) / 1e9) < 1e-9
    tp = next(i for i, r in enumerate(rows) if r["layout"] == "TP attention")
    assert v3[2].y[tp] > v3[1].y[tp]  # MLA on 8 TP ranks: copies outweigh the own share
    assert list(bars[5].y) == [1.0] and list(bars[4].y) == [2.0]  # the second panel in KB


def test_a_long_panel_title_breaks_at_a_comma_and_bar_notes_take_two_lines():
    """At 1280 px (issue 48's layout check) the third panel's title ran past the figure's edge and two
    bars' notes overlapped: a title longer than its third of the width breaks, a note is two lines."""
    from playbook.viz.serving_moe import PANEL_TITLE_CHARS, panel_title

    long = "gpt-tiny-moe on 4 ranks, KV measured"
    assert len(long) > PANEL_TITLE_CHARS and panel_title(long) == "gpt-tiny-moe on 4 ranks,<br>KV measured"
    assert panel_title("deepseek-v3, 8 × H200, fp8") == "deepseek-v3, 8 × H200, fp8"
    one = ([{"label": "x", "kv": 1.0}], 1.0, "B")
    fig = moe_memory({"a": one, "b": one, long: one})  # three panels, as in the chapter
    assert [a.text for a in fig.layout.annotations] == ["a", "b", "gpt-tiny-moe on 4 ranks,<br>KV measured"]
    rows = compare_moe_layouts(ModelConfig.preset("mixtral-8x7b"), Hardware.preset("h100-sxm"), gpus=8, context=8192)
    assert all(r["note"].count("<br>") == 1 for r in moe_rows(rows))
