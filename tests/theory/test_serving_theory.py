"""The serving calculator against numbers worked out by hand from the published configs."""

import math

import pytest

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.serving import serving as s
from playbook.theory.serving import layouts as serving_layouts

LLAMA70 = ModelConfig.preset("llama-3.1-70b")  # 80 layers, 8 KV heads of 128, 70,553,706,496 parameters
H100 = Hardware.preset("h100-sxm")  # 80 GB, 989.4 TFLOP/s, 3.35 TB/s, NVLink 450 GB/s


def test_kv_per_token_mha_gqa_mla():
    assert s.kv_bytes_per_token(LLAMA70) == 2 * 80 * 8 * 128 * 2 == 327_680
    assert s.kv_bytes_per_token(LLAMA70, tp=4) == 327_680 / 4
    assert s.kv_bytes_per_token(LLAMA70, tp=16 // 2, pp=2) == 327_680 / 8 / 2
    by = s.kv_per_token_by_attention(LLAMA70)
    assert by == {"MHA": 2 * 80 * 64 * 128 * 2, "GQA": 327_680}  # 64 query heads: 8x the GQA cache
    ds = ModelConfig.preset("deepseek-v3")  # 61 layers, latent 512 + rope key 64
    assert s.kv_bytes_per_token(ds) == 61 * 576 * 2 == 70_272
    assert s.kv_bytes_per_token(ds, tp=8) == 70_272  # the latent is not split by heads
    assert s.kv_per_token_by_attention(ds) == {"MHA": 61 * 128 * (128 + 64 + 128) * 2, "MLA": 70_272}


def test_weights_per_gpu_under_tp_pp_ep():
    assert s.weights_per_gpu(LLAMA70, tp=4) == 70_553_706_496 * 2 / 4
    assert s.weights_per_gpu(LLAMA70, tp=2, pp=2) == 70_553_706_496 * 2 / 4
    mix = ModelConfig.preset("mixtral-8x7b")
    expert = 3 * 4096 * 14336  # one routed expert's SwiGLU
    dense = mix.num_params() - 32 * 8 * expert
    assert s.weights_per_gpu(mix, ep=8) == pytest.approx((dense + 32 * 1 * expert) * 2)


def test_kv_capacity_70b_on_h100_by_hand():
    """0.9 of the 81,559 MiB an H100 reports, less the weights, less the activation peak of one
    8,192-token forward (residual stream twice; SwiGLU's gate + up, product and output at tp 4)."""
    cap = s.kv_capacity(LLAMA70, H100, context=8192, tp=4)
    act = 8192 * (2 * 8192 + 3 * 28_672 // 4 + 8192) * 2  # 754,974,720 bytes
    budget = 0.9 * 81_559 * 2**20 - 70_553_706_496 * 2 / 4 - act
    assert cap["activations"] == act and cap["kv_budget"] == pytest.approx(budget)
    block = 16 * 81_920  # 1,310,720 bytes per block of 16 tokens
    assert cap["blocks"] == 31_232 == math.floor(budget / block)
    assert cap["tokens"] == 31_232 * 16 and cap["blocks_per_seq"] == 512 and cap["max_seqs"] == 61
    assert s.kv_capacity(LLAMA70, H100, context=8192, tp=4, block_size=1)["tokens"] == math.floor(budget / 81_920)
    chunked = s.kv_capacity(LLAMA70, H100, context=8192, tp=4, max_batched_tokens=2048)  # a smaller largest step
    assert chunked["activations"] == act / 4 and chunked["kv_budget"] == pytest.approx(budget + act * 3 / 4)


def test_activation_peak_by_attention_and_mlp():
    from playbook.theory.serving.profile import activation_peak

    # Llama 3.1 70B at tp 8: the MLP (3 · 28,672 / 8 + 8,192 out) is wider than attention's
    # (64/8 + 2·1) · 128 q/k/v + 8 · 128 out + 8,192: the peak is the MLP's
    assert activation_peak(LLAMA70, tokens=100, tp=8) == 100 * (2 * 8192 + 3 * 3584 + 8192) * 2
    # tp 16 > 8 KV heads: each rank still computes one whole KV head; the MLP stays the wider
    attention16 = (64 // 16 + 2 * 1) * 128 + 64 // 16 * 128 + 8192
    assert attention16 < 3 * 28_672 // 16 + 8192
    assert activation_peak(LLAMA70, tokens=1, tp=16) == (2 * 8192 + 3 * 28_672 // 16 + 8192) * 2
    # DeepSeek-V3 (MLA, MoE): 8 routed + 1 shared expert of 2,048 = 18,432 = its dense MLP
    ds = ModelConfig.preset("deepseek-v3")
    # at tp 8 MLA's query, latent + rope key, expanded keys/values and output outweigh the MLP
    mla = 128 * (128 + 64) / 8 + 512 + 64 + 128 * (128 + 128) / 8 + 128 * 128 / 8 + 7168
    assert mla > 3 * 18_432 / 8 + 7168
    assert activation_peak(ds, tokens=10, tp=8, dtype="fp8") == 10 * (2 * 7168 + mla) * 1
    assert activation_peak(LLAMA70, tokens=1, tp=1) == 2 * 8192 * 2 + (3 * 28_672 + 8192) * 2
    with pytest.raises(ValueError, match="tokens"):
        activation_peak(LLAMA70, tokens=0)


def test_weights_that_do_not_fit_name_a_tp_that_does():
    with pytest.raises(ValueError, match=r"tp=1 .* try tp >= 2"):
        s.kv_capacity(LLAMA70, H100, context=8192, tp=1)
    with pytest.raises(ValueError, match="mem_util"):
        s.kv_capacity(LLAMA70, H100, context=8192, tp=4, mem_util=1.5)


def test_decode_is_memory_bound_and_reads_weights_plus_kv():
    d = s.decode(LLAMA70, H100, context=8192, batch=1, tp=4, mbu=1.0, mfu=1.0, latency=0.0)
    read = 70_553_706_496 * 2 / 4 + 8192 * 81_920
    assert d.bytes == read and d.memory == pytest.approx(read / 3.35e12) and d.bound == "memory"
    flops = (2 * (70_553_706_496 - 128_256 * 8192) + 2 * 80 * 64 * 8192 * 256) / 4
    assert d.flops == pytest.approx(flops)
    msg = 8192 * 2  # one token's hidden state in bf16
    assert d.comm == pytest.approx(2 * 80 * (2 * msg * 3 / 4) / 450e9)
    with_latency = s.decode(LLAMA70, H100, context=8192, batch=1, tp=4, mbu=1.0, mfu=1.0, latency=5e-6)
    assert with_latency.comm - d.comm == pytest.approx(2 * 80 * 6 * 5e-6)  # 2(t-1) ring steps per all-reduce
    assert with_latency.seconds == pytest.approx(d.memory + with_latency.comm)


def test_prefill_is_compute_bound_and_tp_divides_it():
    p1 = s.prefill(LLAMA70, H100, prompt=4096, tp=1, mfu=1.0, latency=0.0)
    p4 = s.prefill(LLAMA70, H100, prompt=4096, tp=4, mfu=1.0, latency=0.0)
    assert p1.bound == "compute" and p1.compute == pytest.approx(p1.flops / 989.4e12)
    assert p4.compute == pytest.approx(p1.compute / 4)
    assert p1.comm == 0 and p4.comm == pytest.approx(2 * 80 * 2 * 4096 * 8192 * 2 * 3 / 4 / 450e9)


def test_critical_batch_is_where_decode_turns_compute_bound():
    b = s.critical_batch(LLAMA70, H100, mfu=1.0, mbu=1.0)
    assert b == pytest.approx(989.4e12 / 3.35e12)  # bf16: 2 bytes per weight, 2 FLOPs per weight
    low = s.decode(LLAMA70, H100, context=1, batch=int(b * 0.5), mfu=1.0, mbu=1.0)
    high = s.decode(LLAMA70, H100, context=1, batch=int(b * 2), mfu=1.0, mbu=1.0)
    assert (low.bound, high.bound) == ("memory", "compute")


def test_article_2_tp4_dp2_vs_tp2_dp4():
    rows = {r["layout"]: r for r in serving_layouts.compare_layouts(LLAMA70, H100, gpus=8, context=8192)}
    assert set(rows) == {"tp2×dp4", "tp4×dp2", "tp8×dp1"}  # tp1 does not hold 141 GB of weights
    tp4, tp2 = rows["tp4×dp2"], rows["tp2×dp4"]
    assert tp2["seqs_per_replica"] == 3 and tp2["seqs"] == 12  # 70.6 GB of weights + 1.1 GB leave 5.3 GB
    assert tp4["seqs"] == 2 * 61
    assert tp2["tp_comm_per_token"] < tp4["tp_comm_per_token"]  # less TP: less communication per token...
    assert tp4["tpot_batch1"] < tp2["tpot_batch1"]  # ...but each GPU reads half the weights
    assert tp4["tokens_per_s"] > 5 * tp2["tokens_per_s"]
    assert tp4["tokens_per_s"] == pytest.approx(2 * 61 / tp4["tpot"])
    best, why = serving_layouts.recommend(list(rows.values()))
    assert best["layout"] == "tp8×dp1" and "tokens/s" in why


def test_pipeline_stages_add_latency_not_throughput_per_micro_batch():
    one = serving_layouts.serving_layout(LLAMA70, H100, tp=4, dp=1, context=4096, batch=8)
    two = serving_layouts.serving_layout(LLAMA70, H100, tp=2, dp=1, pp=2, context=4096, batch=8)
    assert two["weights_per_gpu"] == one["weights_per_gpu"]
    d = s.decode(LLAMA70, H100, context=4096, batch=4, tp=2, pp=2)
    assert d.seconds == pytest.approx(2 * max(d.compute, d.memory) + d.comm)
    assert two["tpot"] == d.seconds and two["tokens_per_s"] == pytest.approx(8 / d.seconds)


def test_paged_bytes_round_each_sequence_up_to_whole_blocks():
    assert s.paged_kv_bytes([1, 16, 17], kv_per_token=10.0, block_size=16) == (1 + 1 + 2) * 16 * 10.0


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_kv_capacity_per_gpu_counts_only_its_stages_layers(pp):
    """Issue 48, near-miss 9: a pipeline stage caches K and V for its own L/pp layers only. Llama 3.1
    8B: 2 (K, V) · 32 layers · 8 KV heads · 128 · 2 bytes = 131,072 bytes a token on one GPU, / pp;
    a block of 16 tokens of it; the blocks are what the budget (weights and activations, not under
    test here) leaves, in whole blocks."""
    cfg, hw = ModelConfig.preset("llama-3.1-8b"), Hardware.preset("h100-sxm")
    cap = s.kv_capacity(cfg, hw, context=8192, tp=1, pp=pp)
    per_token = 2 * 32 * 8 * 128 * 2 / pp
    assert cap["kv_bytes_per_token"] == per_token and cap["block_bytes"] == 16 * per_token
    assert cap["blocks"] == int(cap["kv_budget"] // (16 * per_token))
    assert cap["max_seqs"] == cap["blocks"] // (8192 // 16)
