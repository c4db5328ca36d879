"""The pipeline's slowest rank (``theory.plan.stage_balance``): the output head on the last stage makes
a small-vocabulary-heavy model's pipeline wait, and ``theory.plan.cost`` counts that wait as idle time."""

from __future__ import annotations

import pytest

from playbook.config import ModelConfig
from playbook.theory.cost.flops import flops_per_token
from playbook.theory.plan.cost import StepCost, with_schedule
from playbook.theory.plan.stage_balance import head_flops_per_token, rank_flops_per_token, stage_imbalance

GPT_1_7B = ModelConfig(  # Megatron-LM's smallest Table 1 GPT (as plan_validation builds it)
    name="gpt-1.7b",
    vocab_size=51_200,
    hidden=2304,
    n_layers=24,
    n_heads=24,
    ffn_hidden=8 * 768,
    max_seq_len=2048,
    tie_embeddings=True,
)


def test_the_head_makes_the_last_stage_the_slowest():
    """24 layers on 4 stages: 6 each; the last adds the head, 6·h·V = 708 MFLOP per token, against
    a layer's 6·12·h² + 12·h·s = 439 MFLOP: (6·439 + 708)/((24·439 + 708)/4) = 1.189."""
    h, s = GPT_1_7B.hidden, 2048
    layer = 6 * 12 * h * h + 12 * h * s  # weights (q, k, v, o: 4h²; SwiGLU 3·h·8h/3 = 8h²) and attention
    head = 6 * h * GPT_1_7B.vocab_size
    assert head_flops_per_token(GPT_1_7B) == head
    assert flops_per_token(GPT_1_7B, s) == pytest.approx(24 * layer + head, rel=2e-3)  # + norms
    per_rank = rank_flops_per_token(GPT_1_7B, s, 4)
    assert per_rank[0] == per_rank[1] == per_rank[2] < per_rank[3]
    assert stage_imbalance(GPT_1_7B, s, 4) == pytest.approx(4 * (6 * layer + head) / (24 * layer + head), rel=1e-3)
    assert stage_imbalance(GPT_1_7B, s, 1) == 1.0


def test_the_v_puts_the_head_on_rank_0_and_llamas_light_ends_balance_it():
    v_shape = rank_flops_per_token(GPT_1_7B, 2048, 4, "zb-v", 2)
    assert max(v_shape) == v_shape[0] and len(set(v_shape[1:])) == 1
    llama = ModelConfig.preset("llama-3.1-405b")
    light = rank_flops_per_token(llama, 8192, 16, "interleaved", 8, "light")
    assert light[-1] < light[1] and light[0] < light[1]  # the ends hold a layer fewer (and the head)
    assert 1.0 < stage_imbalance(llama, 8192, 16, "interleaved", 8, "light") < 1.02


def test_the_wait_on_the_busiest_rank_is_pipeline_idle_time():
    """with_schedule: at imbalance 1.2 a step idles 0.2 × compute beyond the bubble (of the busiest
    rank's time, 1.2 × compute + its exposed communication)."""
    base = StepCost(compute=10.0, bubble=0.0, axes={"pp": (1.0, 1.0), "dp": (3.0, 2.0)}, model_flops=1.0)
    even = with_schedule(base, pp=4, microbatches=8, schedule="1f1b", v=1, imbalance=1.0)
    slow = with_schedule(base, pp=4, microbatches=8, schedule="1f1b", v=1, imbalance=1.2)
    assert even.bubble == pytest.approx((10 + 1) * 3 / 8)
    assert slow.bubble == pytest.approx(0.2 * 10 + (12 + 1) * 3 / 8)
    assert slow.total - slow.bubble == even.total - even.bubble  # compute and exposed unchanged
