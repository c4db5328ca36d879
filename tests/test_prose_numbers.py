"""The numbers chapters 7-9 state in prose, recomputed from the package's functions: when a formula or
a preset changes, the test that holds the sentence fails, instead of the sentence going stale."""

from __future__ import annotations

import pytest

from playbook import Hardware, ModelConfig
from playbook.theory import serving
from playbook.theory.memory import training_memory

H100 = Hardware.preset("h100-sxm")
LLAMA8, LLAMA70 = ModelConfig.preset("llama-3.1-8b"), ModelConfig.preset("llama-3.1-70b")
DSV3 = ModelConfig.preset("deepseek-v3")


def _layouts(cfg, hw, latency=None):
    """{layout: row} of the 8-GPU TP × DP comparison; ``latency`` None: the default ring model,
    "flat": a measured ~10 µs per small all-reduce whatever tp."""
    rows = {}
    for tp in (1, 2, 4, 8):
        lat = {} if latency is None else {"latency": serving.flat_allreduce_latency(tp)}
        try:
            r = serving.serving_layout(cfg, hw, tp=tp, dp=8 // tp, context=8192, **lat)
        except ValueError:
            continue
        rows[r["layout"]] = r
    return rows


# ---- chapter 7 ------------------------------------------------------------------------------------
def test_ch07_a_million_tokens_of_cache():
    assert 1_000_000 // 8192 == 122
    gb = {m.name: round(1e6 * serving.kv_bytes_per_token(m) / 1e9) for m in (LLAMA8, LLAMA70, DSV3)}
    assert list(gb.values()) == [131, 328, 70]


def test_ch07_mla_saving_by_both_definitions():
    by = serving.kv_per_token_by_attention(DSV3)
    assert round(by["MHA"] / by["MLA"]) == 71  # every head's 192-wide key and 128-wide value
    # DeepSeek-V2 Table 1: MHA caches 2·n_h·d_h per layer, d_h = 128; MLA (d_c + d_h^R)
    table1 = 2 * DSV3.n_heads * DSV3.v_head_dim / (DSV3.kv_lora_rank + DSV3.qk_rope_head_dim)
    assert round(table1) == 57
    assert (by["MLA"], serving.kv_bytes_per_token(LLAMA70)) == (70_272, 327_680)
    assert round(327_680 / 70_272, 1) == 4.7
    assert round(serving.weights_per_gpu(DSV3) / 1e12, 2) == 1.34


def test_ch07_capacity_per_tp():
    cap = {tp: serving.kv_capacity(LLAMA70, H100, context=8192, tp=tp) for tp in (2, 4, 8)}
    assert round(cap[2]["weights"] / 1e9, 1) == 70.6 and round(cap[2]["kv_budget"] / 1e9, 1) == 1.4
    assert round(0.9 * H100.memory_bytes / 1e9) == 72
    assert [cap[t]["max_seqs"] for t in (2, 4, 8)] == [1, 54, 162]


def test_ch07_decode_table_and_the_kv_intensity():
    steps = {b: serving.decode(LLAMA70, H100, context=2048, batch=b, tp=4) for b in (1, 8, 32, 256)}
    assert 18 <= steps[1].seconds * 1e3 < steps[32].seconds * 1e3 <= 20.5
    assert all(s.bound == "memory" for s in steps.values())
    assert round(steps[1].comm * 1e3, 1) == 4.8 and 0.25 <= steps[1].comm / steps[1].seconds < 0.3
    assert round(serving.critical_batch(LLAMA70, H100)) == 185
    assert LLAMA70.n_heads // LLAMA70.kv_heads == 8
    cap = serving.kv_capacity(LLAMA70, H100, context=2048, tp=4)["max_seqs"]
    assert cap == 218 and 256 > cap  # the batch-256 row does not fit
    flat = serving.decode(LLAMA70, H100, context=2048, batch=1, tp=4, latency=serving.flat_allreduce_latency(4))
    assert round(flat.comm * 1e3, 1) == 1.6


def test_ch07_the_layouts_on_8_h100s():
    rows = _layouts(LLAMA70, H100)
    best, why = serving.recommend(list(rows.values()))
    assert best["layout"] == "tp8×dp1" and "lowest latency" in why
    assert round(best["tokens_per_s"]) == 4079 and best["seqs"] == 162
    assert [round(rows[k]["tpot_batch1"] * 1e3, 1) for k in ("tp8×dp1", "tp4×dp2", "tp2×dp4")] == [17.9, 18.2, 28.4]
    assert rows["tp2×dp4"]["seqs"] == 4 and rows["tp4×dp2"]["seqs"] == 108
    assert round(rows["tp4×dp2"]["tokens_per_s"] / rows["tp2×dp4"]["tokens_per_s"]) == 24
    comm = [round(rows[k]["tp_comm_per_token"] * 1e3, 1) for k in ("tp2×dp4", "tp4×dp2", "tp8×dp1")]
    assert comm == [1.6, 5.3, 12.9]


def test_ch07_question_3_flips_with_a_flat_all_reduce():
    b200 = Hardware.preset("b200")
    assert b200.memory_bytes == 180e9
    ring, flat = _layouts(LLAMA8, b200), _layouts(LLAMA8, b200, latency="flat")
    assert round(ring["tp2×dp4"]["tokens_per_s"], -2) == 43_900 and round(ring["tp4×dp2"]["tokens_per_s"], -2) == 42_400
    assert [round(ring[k]["tpot_batch1"] * 1e3, 1) for k in ("tp2×dp4", "tp4×dp2")] == [2.0, 2.6]
    assert round(flat["tp4×dp2"]["tokens_per_s"], -2) == 44_500 and round(flat["tp2×dp4"]["tokens_per_s"], -2) == 43_900
    assert [round(flat[k]["tpot_batch1"] * 1e3, 1) for k in ("tp4×dp2", "tp2×dp4")] == [1.3, 2.0]
    assert round(serving.weights_per_gpu(LLAMA8) / 1e9) == 16


@pytest.mark.parametrize("tp,want", [(2, 10e-6), (4, 10e-6), (8, 10e-6)])
def test_flat_allreduce_latency_costs_the_same_whatever_tp(tp, want):
    from playbook.theory.comm import collective_seconds

    t = collective_seconds("all_reduce", 0, tp, H100.intra_node_bandwidth, serving.flat_allreduce_latency(tp))
    assert t == pytest.approx(want)
