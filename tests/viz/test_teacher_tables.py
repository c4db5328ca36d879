"""The chapters' teaching tables: bytes per parameter, ZeRO in Ψ units (values worked out by hand)."""

import pytest

from playbook.theory.hybrid.psi import bytes_per_parameter, zero_psi_rows


def test_bytes_per_parameter_by_hand():
    rows = {r["setup"].split(" (")[0]: r for r in bytes_per_parameter()}
    assert rows["mixed precision"]["total"] == 16  # 2 + 2 + (4 + 4 + 4)
    assert rows["fp32"]["total"] == 16  # 4 + 4 + (4 + 4)
    # fp32 gradient accumulation: Megatron's main_grad replaces the bf16 gradient (Megatron-Core's
    # distributed-optimizer table, "float16 param, fp32 grads": 18); keeping both costs 20 (Ultra-Scale)
    assert rows["mixed + fp32 main_grad"]["gradients"] == 4
    assert rows["mixed + fp32 main_grad"]["total"] == 18
    assert rows["mixed + fp32 grad accumulation"]["gradients"] == 6
    assert rows["mixed + fp32 grad accumulation"]["total"] == 20
    adam8 = rows["mixed + 8-bit Adam"]
    assert adam8["optimizer"] == pytest.approx(4 + 1 + 1 + 8 / 2048)  # master + m + v + two scales per block
    assert adam8["total"] == pytest.approx(10 + 8 / 2048)
    for r in rows.values():
        assert r["total"] == pytest.approx(r["weights"] + r["gradients"] + r["optimizer"])


def test_bytes_per_parameter_refuses_bad_block():
    with pytest.raises(ValueError, match="block must be a positive integer"):
        bytes_per_parameter(block=0)


def test_zero_in_psi_units_at_8_ranks():
    rows = zero_psi_rows(8)
    memory = [r["bytes/Ψ at N=8"] for r in rows]
    assert memory == pytest.approx([16, 2 + 2 + 12 / 8, 2 + (2 + 12) / 8, 16 / 8])
    sent = [r["bf16 bytes sent/Ψ at N=8"] for r in rows]
    # DP and ZeRO-1/2: 2Ψ elements × 2 bytes × 7/8; ZeRO-3: 3Ψ elements × 2 bytes × 7/8
    assert sent == pytest.approx([3.5, 3.5, 3.5, 5.25])
    assert [r["elements moved"] for r in rows] == ["2Ψ", "2Ψ", "2Ψ", "3Ψ"]


def test_zero_in_psi_units_refuses_bad_n():
    with pytest.raises(ValueError, match="positive number of data-parallel ranks"):
        zero_psi_rows(0)


def test_pipeline_sends_one_activation_tp_sends_four_per_layer():
    from playbook.config import ModelConfig
    from playbook.theory.cost.trades import p2p_vs_tp_bytes

    cfg = ModelConfig.preset("llama-3.1-70b")  # hidden 8192, 80 layers
    pp, tp = p2p_vs_tp_bytes(cfg, seq_len=4096, micro_batch=1, pp=8, tp=8, dtype_bytes=2)
    assert pp["bytes per micro-batch"] == 2 * 4096 * 8192
    assert tp["bytes per micro-batch"] == pytest.approx(80 * 4 * 2 * 4096 * 8192 * 7 / 8)
    assert tp["messages"] == 160 and pp["messages"] == 1
    with pytest.raises(ValueError, match="pp >= 2"):
        p2p_vs_tp_bytes(cfg, seq_len=4096, micro_batch=1, pp=1, tp=8)
