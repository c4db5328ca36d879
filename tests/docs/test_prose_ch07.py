"""The numbers chapter 7 states about KV room, recomputed by hand from the published shapes and the
device's reported memory, independently of ``theory.serving``'s code: when the fit rule, the
activation term or a preset changes, the sentence's test fails instead of the sentence going stale."""

from __future__ import annotations

import math

from playbook import Hardware, ModelConfig
from playbook.theory.serving import layouts as serving_layouts
from playbook.theory.serving import serving

H100 = Hardware.preset("h100-sxm")
LLAMA70 = ModelConfig.preset("llama-3.1-70b")

# Llama 3.1 70B: 80 layers, hidden 8,192, MLP 28,672, 64 query heads and 8 KV heads of 128
PARAMS, L, HIDDEN, FFN, HEADS, KV_HEADS, HEAD = 70_553_706_496, 80, 8192, 28_672, 64, 8, 128
MEMORY = 0.9 * 81_559 * 2**20  # 0.9 of what an "80 GB" H100 reports, the book's one fit rule


def by_hand(tp: int, context: int, step: int | None = None) -> dict:
    """KV room of one GPU of a tp replica: 0.9 × reported memory − bf16 weights − the activation peak
    of one forward over ``step`` tokens (the residual stream twice, then SwiGLU's gate + up, product
    and output at the MLP, which is wider than attention for this model), in blocks of 16 tokens."""
    step = context if step is None else step
    weights = 2 * PARAMS / tp
    act = step * (2 * HIDDEN + 3 * FFN // tp + HIDDEN) * 2
    attention = (
        step * (2 * HIDDEN + (HEADS // tp + 2 * max(KV_HEADS // tp, 1)) * HEAD + HEADS // tp * HEAD + HIDDEN) * 2
    )
    assert attention < act  # the MLP holds the peak
    per_token = 2 * L * max(KV_HEADS // tp, 1) * HEAD * 2
    budget = MEMORY - weights - act
    blocks = math.floor(budget / (16 * per_token))
    return {"weights": weights, "act": act, "budget": budget, "blocks": blocks, "seqs": blocks // -(-context // 16)}


def test_ch07_capacity_per_tp_counts_the_profiled_activations():
    """§1, cells 8-9: "70.6 GB of the 77.0 GB ..., 1.1 GB of activations, 5.3 GB ...: 3 sequences
    ... At tp = 4, 61; at tp = 8, 175"."""
    hand = {tp: by_hand(tp, 8192) for tp in (2, 4, 8)}
    cap = {tp: serving.kv_capacity(LLAMA70, H100, context=8192, tp=tp) for tp in (2, 4, 8)}
    for tp in (2, 4, 8):
        assert cap[tp]["activations"] == hand[tp]["act"] and cap[tp]["blocks"] == hand[tp]["blocks"]
        assert cap[tp]["max_seqs"] == hand[tp]["seqs"]
    assert round(MEMORY / 1e9, 1) == 77.0 and round(hand[2]["weights"] / 1e9, 1) == 70.6
    assert round(hand[2]["act"] / 1e9, 1) == 1.1 and round(hand[2]["budget"] / 1e9, 1) == 5.3
    assert [hand[tp]["seqs"] for tp in (2, 4, 8)] == [3, 61, 175]
    assert round(H100.capacity_bytes / 1e9, 1) == 85.5  # "85.5 GB on an "80 GB" H100"


def test_ch07_kv_room_at_2048_tokens():
    """§2 and question 2: "247 sequences of KV room at this context", and batch 256 does not fit."""
    seqs = by_hand(4, 2048)["seqs"]
    assert seqs == 247 < 256 and serving.kv_capacity(LLAMA70, H100, context=2048, tp=4)["max_seqs"] == seqs


def test_ch07_the_ranking_on_8_h100s():
    """§3, cell 20: tp8 × dp1 first, then tp4 × dp2, then tp2 × dp4, by tokens/s and by latency per
    token alike; 3 sequences per tp2 replica; tp4 × dp2 "8.9 times" tp2 × dp4. The ratio by hand: at
    full batch decode is memory-bound, so tokens/s = replicas × batch / (bytes read / bandwidth + the
    ring's all-reduces), with each layout's batch from ``by_hand``."""
    rows = {r["layout"]: r for r in serving_layouts.compare_layouts(LLAMA70, H100, gpus=8, context=8192)}
    order = ["tp8×dp1", "tp4×dp2", "tp2×dp4"]
    assert sorted(rows, key=lambda k: -rows[k]["tokens_per_s"]) == order
    assert sorted(rows, key=lambda k: rows[k]["tpot_batch1"]) == order
    assert serving_layouts.recommend(list(rows.values()))[0]["layout"] == "tp8×dp1"

    def tokens_per_s(tp):
        batch = by_hand(tp, 8192)["seqs"]
        read = 2 * PARAMS / tp + batch * 8192 * 2 * L * (KV_HEADS // tp) * HEAD * 2
        rings = 2 * L * (2 * (tp - 1) * 5e-6 + 2 * (tp - 1) / tp * batch * HIDDEN * 2 / 450e9)
        return (8 // tp) * batch / (read / (3.35e12 * 0.8) + rings)

    assert by_hand(2, 8192)["seqs"] == rows["tp2×dp4"]["seqs_per_replica"] == 3
    assert round(tokens_per_s(4) / tokens_per_s(2), 1) == 8.9
    assert round(rows["tp4×dp2"]["tokens_per_s"] / rows["tp2×dp4"]["tokens_per_s"], 1) == 8.9
    by_size = {
        r["layout"]: r
        for r in serving_layouts.compare_layouts(LLAMA70, H100, gpus=8, context=8192, latency=serving.BY_SIZE)
    }  # "priced by size the all-reduces cost less, and the ranking stays"
    assert all(by_size[k]["tp_comm_per_token"] < rows[k]["tp_comm_per_token"] for k in ("tp4×dp2", "tp8×dp1"))
    assert sorted(by_size, key=lambda k: -by_size[k]["tokens_per_s"]) == order


def test_ch07_prefix_caching_first_misses_not_evictions():
    """§4b, cell 33: 2,024 blocks of 16 tokens (32,384) at tp2; no layout evicts; round robin finds
    the fewest tokens at tp2, the prefix router wins the whole gap back; with a quarter of tp2's
    blocks round robin evicts and hits less."""
    from playbook.theory.serving import conversations, prefix_layouts

    trace = conversations(
        n=16, groups=4, turns=3, system=1024, user=(128, 384), answer=(128, 384), new=(64, 128),
        vocab=LLAMA70.vocab_size, seed=0,
    )  # fmt: skip
    rr, pa = (
        prefix_layouts(LLAMA70, H100, trace, gpus=8, tps=(2, 4, 8), context=8192, router=router)
        for router in ("round-robin", "prefix")
    )
    assert rr[0]["blocks_per_replica"] == by_hand(2, 8192)["blocks"] == 2024 and 2024 * 16 == 32_384
    assert all(r["evictions"] == 0 for r in rr + pa)
    assert rr[0]["hit_rate"] < rr[1]["hit_rate"] < rr[2]["hit_rate"]
    assert pa[0]["hit_rate"] == rr[2]["hit_rate"]  # each prompt computed once, as on one replica
    (small,) = prefix_layouts(LLAMA70, H100, trace, gpus=8, tps=(2,), context=8192, router="round-robin", kv_scale=0.25)
    assert small["evictions"] > 0 and small["hit_rate"] < rr[0]["hit_rate"]


def test_ch07_block_granularity_of_a_prefix_match():
    """§4b: two prompts sharing 1,030 tokens reuse 1,024 in blocks of 16 (vLLM) and 1,030 in pages of
    one token (SGLang), on the engine's own cache."""
    from playbook.serve.prefix import PrefixKVCache

    shared = list(range(1030))
    first, second = shared + [5000, 5001], shared + [6000, 6001]
    found = {}
    for block in (16, 1):
        cache = PrefixKVCache(n_layers=1, kv_heads=1, head_dim=1, n_blocks=2 * len(first), block_size=block)
        cache.add(0, first)
        cache.reserve(0, len(first))
        cache.advance(0, len(first), first)
        found[block] = cache.add(1, second)
    assert found == {16: 1030 // 16 * 16, 1: 1030} == {16: 1024, 1: 1030}


def test_ch07_a_512_token_chunk_is_past_the_ridge():
    """§4c, cell 38: a 512-token budget is past the ~185-row ridge, and its step is ~2.5× a
    decode-only step (32 decodes at 2,048 tokens, tp4). By hand: the decode-only step is memory-bound
    (weights + KV read); the chunked one is compute-bound, 512 rows' FLOPs (the chunk attending to its
    own 480 tokens, the decodes to 2,048) at half the peak, plus the ring all-reduces of 512 rows."""
    from playbook.serve.latency import stall_at_scale

    ridge = 989.4e12 * 0.5 / (3.35e12 * 0.8)  # FLOP per byte at 50 % / 80 %; bf16: rows per weight read
    assert round(ridge) == 185 and round(serving.critical_batch(LLAMA70, H100)) == 185
    assert round(512 / ridge, 1) == 2.8
    tp, flops, bw = 4, 989.4e12 * 0.5, 3.35e12 * 0.8
    dense = 2 * (PARAMS - 128_256 * HIDDEN)  # the forward's 2N, the embedding being a lookup

    def compute(rows, attended):  # rows' FLOPs on one of tp GPUs: 2N + 4·L·H·Q·T each
        return rows * (dense + 4 * L * HEADS * HEAD * attended) / tp / flops

    def rings(rows):  # two ring all-reduces per layer of rows × hidden bf16 values
        return 2 * L * (2 * (tp - 1) * 5e-6 + 2 * (tp - 1) / tp * rows * HIDDEN * 2 / 450e9)

    kv = 2 * L * (KV_HEADS // tp) * HEAD * 2
    decode_memory = (2 * PARAMS / tp + 32 * 2048 * kv) / bw
    decode_only = max(compute(32, 2048), decode_memory) + rings(32)
    chunked = max(compute(480, 480) + compute(32, 2048), decode_memory) + rings(480) + rings(32)
    assert compute(480, 480) + compute(32, 2048) > decode_memory  # the chunked step is compute-bound
    st = stall_at_scale(LLAMA70, H100, prompt=8192, budget=512, batch=32, context=2048, tp=4)
    assert round(chunked / decode_only, 1) == round(st["chunked_step"] / st["decode_only"], 1) == 2.5
    assert st["chunked_steps"] == math.ceil(8192 / 480) == 18


def test_ch07_dashboard_things_to_try():
    """The dashboard's "Things to try" (cell dash7-intro): "70B on 4 GPUs (at tp = 2 the weights leave
    room for a few sequences), a context of 131,072 tokens (tp = 2 no longer fits one)", by hand."""
    assert 0 < by_hand(2, 8192)["seqs"] < 10
    assert by_hand(2, 131_072)["budget"] < 131_072 * 2 * L * (KV_HEADS // 2) * HEAD * 2
    assert by_hand(4, 131_072)["seqs"] >= 1
