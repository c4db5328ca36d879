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
