"""Quantized serving, predicted: a KV block's bytes with its scale term, weights with their per-channel
scales, and what both do to capacity and decode speed at scale. Expected values are counted here from
the configs, not read off the functions under test."""

import math

import pytest

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.serving import quantized, serving
from playbook.theory.serving.weights import served_weight_bytes

TINY, L70 = ModelConfig.preset("gpt-tiny"), ModelConfig.preset("llama-3.1-70b")
H100 = Hardware.preset("h100-sxm")


def test_an_8_bit_block_holds_its_data_and_one_fp32_scale_per_layer_k_v_and_kv_head():
    # gpt-tiny: 2 layers, 2 KV heads of 64 / 4 = 16; a block of 16 tokens
    data = 16 * 2 * 2 * 2 * 16  # tokens · (K, V) · layers · KV heads · head dim, one byte each
    for dtype in ("int8", "fp8"):
        assert serving.kv_block_bytes(TINY, dtype=dtype, block_size=16) == data + 2 * 2 * 2 * 4  # 2,080
    assert serving.kv_block_bytes(TINY, dtype="bf16", block_size=16) == 2 * data  # 4,096: no scales
    assert serving.kv_block_bytes(TINY, dtype="fp32", block_size=4) == 4 * 4 * 2 * 2 * 2 * 16
    # tp2: one KV head per rank, so half the data and half the scales
    assert serving.kv_block_bytes(TINY, tp=2, dtype="int8", block_size=4) == 4 * 2 * 2 * 16 + 2 * 2 * 4
    assert quantized.capacity_ratio(TINY, dtype="int8", block_size=16) == pytest.approx(4096 / 2080)
    assert 1.96 < quantized.capacity_ratio(TINY) < 2  # not the 2 a cache without scales would claim


def test_capacity_at_scale_counts_blocks_of_the_quantized_size():
    bf16 = serving.kv_capacity(L70, H100, context=8192, tp=8)
    fp8 = serving.kv_capacity(L70, H100, context=8192, tp=8, kv_dtype="fp8", quantize="fp8")
    block = 16 * 2 * 80 * 1 * 128 + 2 * 80 * 1 * 4  # one KV head of 128 per rank at tp8, 80 layers
    assert fp8["block_bytes"] == block
    assert fp8["max_seqs"] == int(fp8["kv_budget"] // block) // math.ceil(8192 / 16)
    assert fp8["weights"] < 0.55 * bf16["weights"]  # the linears in one byte; embedding and head stay bf16
    assert fp8["max_seqs"] > 2 * bf16["max_seqs"]  # twice the blocks in more room


def test_served_weights_count_each_linear_in_one_byte_and_its_output_channels_scales():
    h, f, v, layers = 64, 176, 64, 2
    linears = layers * (h * h + 2 * 32 * h + h * h + 3 * h * f)  # q, k, v (2 heads of 16), o; gate, up, down
    assert (
        served_weight_bytes(TINY)["total"] == 4 * (linears + 2 * v * h + (2 * layers + 1) * h) == 4 * TINY.num_params()
    )
    q = served_weight_bytes(TINY, tp=2, quantize="int8")
    assert q["linears"] == linears / 2
    # column layers keep out/2 scales, row layers (o, down) every output channel's scale
    assert q["scales"] == 4 * layers * ((h + 32 + 32 + 2 * f) / 2 + h + h)
    assert q["other"] == 4 * (2 * v * h / 2 + (2 * layers + 1) * h)
    with pytest.raises(ValueError, match="dense GQA"):
        served_weight_bytes(ModelConfig.preset("gpt-tiny-moe"), quantize="int8")


def test_decode_reads_the_quantized_bytes():
    base = serving.decode(L70, H100, context=8192, batch=32, tp=8)
    kv8 = serving.decode(L70, H100, context=8192, batch=32, tp=8, kv_dtype="fp8", quantize="fp8")
    weights = served_weight_bytes(L70, tp=8, quantize="fp8", dtype="bf16")["total"]
    assert kv8.bytes == pytest.approx(weights + 32 * 8192 * serving.kv_block_bytes(L70, tp=8, dtype="fp8") / 16)
    assert kv8.bytes < 0.52 * base.bytes and kv8.flops == base.flops
    rows = quantized.at_scale(L70, H100, context=8192, tp=8)
    seqs = [r["max_seqs"] for r in rows]  # bf16; fp8 KV; fp8 weights; both
    assert seqs[0] < min(seqs[1:]) and seqs[3] == max(seqs) and seqs[1] > seqs[2]  # the cache's bytes matter most
    assert rows[-1]["tokens_per_s_per_gpu"] > 2 * rows[0]["tokens_per_s_per_gpu"]
