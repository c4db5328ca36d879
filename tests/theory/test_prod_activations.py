"""The production activation model (``theory.inventory.prod_activations``) against Korthikanti et al. 2022
(arXiv:2205.05198): with their GPT-3 block switched on (LayerNorm, GeLU with f = 4h, eager attention,
dropout) it must give their Table 2 rows, written out here from the paper, not from the code."""

import pytest

from playbook.config import ModelConfig
from playbook.theory.inventory.prod_activations import (
    check_activations,
    production_block_breakdown,
    production_block_bytes,
)
from playbook.theory.plan.memory import in_flight

# GPT-3 175B (Brown et al. 2020, Table 2.1; Korthikanti et al. 2022 Table 3): h 12288, a 96, s 2048
GPT3 = ModelConfig(vocab_size=51200, hidden=12288, n_layers=96, n_heads=96, ffn_hidden=4 * 12288, max_seq_len=2048)
S, B, H, A = 2048, 1, 12288, 96
PAPER = dict(attention="eager", mlp="gelu", norm="layernorm", dropout=True)


def sbh(x):
    return S * B * H * x


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_table2_rows(t):
    scores = 5 * A * S * S * B / t
    kw = dict(seq_len=S, micro_batch=B, tp=t, **PAPER)
    assert production_block_bytes(GPT3, **kw, sequence_parallel=False) == pytest.approx(sbh(10 + 24 / t) + scores)
    assert production_block_bytes(GPT3, **kw, sequence_parallel=True) == pytest.approx(sbh(34 / t) + scores)
    sel = dict(kw, recompute="selective")
    assert production_block_bytes(GPT3, **sel, sequence_parallel=False) == pytest.approx(sbh(10 + 24 / t))
    assert production_block_bytes(GPT3, **sel, sequence_parallel=True) == pytest.approx(sbh(34 / t))


def test_no_parallelism_is_34sbh_plus_5as2b():
    got = production_block_bytes(GPT3, seq_len=S, micro_batch=B, **PAPER)
    assert got == 34 * S * B * H + 5 * A * S * S * B
    assert production_block_bytes(GPT3, seq_len=S, micro_batch=B, recompute="full", **PAPER) == 2 * S * B * H


def test_production_block_is_fused_and_sharded():
    """Llama-style block, flash, no dropout, TP8+SP: every tensor outside the TP regions is the s/t
    shard, SwiGLU keeps 3f (fc1's gate|up and its output), no [s, s] term, so selective only drops the
    flash log-sum-exp."""
    cfg = ModelConfig.preset("llama-3.1-405b")
    s, t, h, f, a, g, d = 8192, 8, cfg.hidden, cfg.ffn_hidden, cfg.n_heads, cfg.kv_heads, cfg.dim_head
    parts = production_block_breakdown(cfg, seq_len=s, micro_batch=1, tp=t)
    expect = 4 * s * h * 2 / t + 2 * 4 * s / t + s * (2 * a + 2 * g) * d * 2 / t + 4 * s * a / t + 3 * s * f * 2 / t
    assert sum(parts.values()) == pytest.approx(expect)
    sel = production_block_bytes(cfg, seq_len=s, micro_batch=1, tp=t, recompute="selective")
    assert sum(parts.values()) - sel == pytest.approx(4 * s * a / t)


def test_interleaved_holds_more_in_flight():
    # Korthikanti et al. 2022 §4.2.3: the first stage of an interleaved pipeline holds 1 + (p-1)/(p·v) more
    assert in_flight("1f1b", 16, 64) == 16
    assert in_flight("interleaved", 16, 64, v=2) == pytest.approx(16 * (1 + 15 / 32))
    assert in_flight("1f1b", 16, 8) == 8  # fewer micro-batches than stages
    assert in_flight("interleaved", 16, 16, v=2) == 16  # m = p: all m forwards run before a backward, no more


def test_bad_activation_model_names_the_choices():
    with pytest.raises(ValueError, match="production, ours"):
        check_activations("megatron")
