"""Chapter 7's capacity-against-KV-dtype figure, read back from its data."""

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.serving import quantized
from playbook.viz.serving_quant import capacity_by_kv_dtype


def test_capacity_figure_puts_blocks_left_and_sequences_per_weight_format_right():
    local = [
        {"kv_dtype": "bf16", "predicted": 256, "measured": 256},
        {"kv_dtype": "int8", "predicted": 504, "measured": 504},
    ]
    cfg, hw = ModelConfig.preset("llama-3.1-70b"), Hardware.preset("h100-sxm")
    formats = [("bf16", w, kv) for w in (None, "fp8") for kv in ("bf16", "fp8")]
    scale = quantized.at_scale(cfg, hw, context=8192, tp=8, formats=formats)
    fig = capacity_by_kv_dtype(local, scale)
    by = {t.name: (list(t.x), list(t.y), t.xaxis) for t in fig.data}
    assert by["blocks, predicted"] == (["bf16", "int8"], [256, 504], "x")
    assert by["blocks, measured"][1] == [256, 504]
    assert by["weights bf16"][:2] == (["bf16", "fp8"], [scale[0]["max_seqs"], scale[1]["max_seqs"]])
    assert by["weights fp8"][1] == [scale[2]["max_seqs"], scale[3]["max_seqs"]] and by["weights fp8"][2] == "x2"
    assert fig.layout.yaxis2.range[1] > max(r["max_seqs"] for r in scale)  # the bar labels are not cut off
