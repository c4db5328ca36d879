"""MoE serving layouts predicted (``theory.serving.moe_layouts``): weights and KV per GPU, all-to-all
bytes, and which layout wins where, against sums and ratios written out here."""

import pytest

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.serving.moe_layouts import (
    alltoall_bytes_per_step,
    check_moe_layout,
    compare_moe_layouts,
    decode_step,
    kv_per_token_per_gpu,
    recommend_moe,
    weight_params_per_gpu,
)
from playbook.theory.serving.parallel import ep_uniform_bytes_per_token

MOE, V3, MIXTRAL = (ModelConfig.preset(n) for n in ("gpt-tiny-moe", "deepseek-v3", "mixtral-8x7b"))


@pytest.mark.parametrize("cfg", [MOE, V3, MIXTRAL])
def test_one_gpu_holds_every_parameter_and_n_gpus_split_the_experts(cfg):
    assert sum(weight_params_per_gpu(cfg, gpus=1, attention_tp=1).values()) == cfg.num_params()
    n = 4 if cfg is not MIXTRAL else 8
    dp, tp = (weight_params_per_gpu(cfg, gpus=n, attention_tp=t) for t in (1, n))
    routed = cfg.n_moe_layers * cfg.n_experts * 3 * cfg.hidden * cfg.expert_ffn_hidden
    assert dp["experts"] * n == routed == tp["experts"] * n
    assert dp["attention"] == pytest.approx(tp["attention"] * n)  # heads split only under TP attention


def test_tp_attention_replicates_kv_past_the_kv_heads_and_mla_on_every_rank():
    whole = 2 * MOE.n_layers * MOE.kv_heads * MOE.dim_head * 2  # bf16
    assert kv_per_token_per_gpu(MOE, attention_tp=2)["replicated"] == 0  # 2 KV heads over 2 ranks
    four = kv_per_token_per_gpu(MOE, attention_tp=4)
    assert four["held"] == whole / 2 and four["replicated"] == whole / 4  # one head per rank, ideal a half
    mla = kv_per_token_per_gpu(V3, attention_tp=8)
    assert mla["held"] == V3.n_layers * (V3.kv_lora_rank + V3.qk_rope_head_dim) * 2  # the latent, whole
    assert mla["replicated"] == pytest.approx(mla["held"] * 7 / 8)
    assert kv_per_token_per_gpu(MIXTRAL, attention_tp=8)["replicated"] == 0  # 8 KV heads, one each


def test_even_routing_alltoall_is_the_expert_chapters_per_token_bytes():
    for n in (2, 4):
        assert alltoall_bytes_per_step(MOE, tokens_per_rank=1, gpus=n, act_bytes=4) == ep_uniform_bytes_per_token(
            MOE, ep=n
        )
    assert alltoall_bytes_per_step(MOE, tokens_per_rank=3, gpus=2, act_bytes=4) == 3 * 1024  # 2·2·2·64·4/2 per token


def test_layouts_communicate_differently():
    h100 = Hardware.preset("h100-sxm")
    tp = decode_step(MIXTRAL, h100, gpus=8, attention_tp=8, batch=64, context=4096)
    dp = decode_step(MIXTRAL, h100, gpus=8, attention_tp=1, batch=64, context=4096)
    assert tp["alltoall_bytes"] == 0 and tp["tp_bytes"] > 0  # all-reduces only
    assert dp["tp_bytes"] == 0 and dp["alltoall_bytes"] == pytest.approx(32 * 2 * 2 * 8 * 4096 * 2 * 7 / 8)


def test_deepseek_v3_wants_dp_attention_and_mixtral_does_not_lose_room_to_tp():
    """MLA's latent is whole on every TP rank, so DP attention holds about t times the sequences;
    Mixtral's 8 KV heads split over 8 ranks, so TP attention holds at least DP's (less weight per GPU)."""
    rows = compare_moe_layouts(V3, Hardware.preset("h200"), gpus=8, context=8192, dtype="fp8")
    by = {r["attention_tp"]: r for r in rows}
    assert by[1]["seqs"] > 4 * by[8]["seqs"] and by[1]["replicated_kv_per_gpu"] == 0
    best, why = recommend_moe(rows)
    assert best["layout"] == "DP attention" and "copies" in why
    mix = {
        r["attention_tp"]: r for r in compare_moe_layouts(MIXTRAL, Hardware.preset("h100-sxm"), gpus=8, context=8192)
    }
    assert mix[8]["seqs"] >= mix[1]["seqs"] and mix[8]["replicated_kv_per_gpu"] == 0


@pytest.mark.parametrize(
    "cfg, gpus, t, words",
    [
        (ModelConfig.preset("gpt-tiny"), 2, 1, "dense model"),
        (MOE, 3, 1, "does not divide the 4 experts"),
        (MOE, 4, 3, "must divide"),
    ],
)
def test_bad_layouts_are_refused_in_one_line(cfg, gpus, t, words):
    with pytest.raises(ValueError, match=words) as e:
        check_moe_layout(cfg, gpus=gpus, attention_tp=t)
    assert "\n" not in str(e.value)
