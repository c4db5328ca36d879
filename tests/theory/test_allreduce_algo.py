"""The all-reduce algorithm by message size: one-shot for decode-sized messages (flat in tp),
bandwidth-optimal ones for large messages; numbers by hand at NVLink's 450 GB/s."""

import pytest

from playbook.theory.cost.allreduce_algo import algorithms, allreduce_seconds

NVLINK = 450e9


def test_small_messages_take_one_shot_and_cost_about_one_latency_at_any_tp():
    m = 2 * 8192  # one decode token of Llama-3.1-70B's hidden, bf16: 16 KB
    for tp in (2, 4, 8):
        t, name = allreduce_seconds(m, tp, NVLINK)
        assert name == "one-shot" and t == pytest.approx(10e-6 + (tp - 1) * m / NVLINK)
        assert t < 11e-6  # ~10 us flat, where the ring model says 2(t-1)·5 us
    assert algorithms(m, 8, NVLINK)["ring"] == pytest.approx(70e-6 + 14 / 8 * m / NVLINK)


def test_large_messages_take_a_bandwidth_optimal_algorithm():
    m = 512 * 8192 * 2  # a 512-token prefill chunk: 8 MB
    t, name = allreduce_seconds(m, 8, NVLINK)
    assert name in ("two-shot", "ring") and t == pytest.approx(2 * 10e-6 + 2 * 7 / 8 * m / NVLINK)
    assert algorithms(m, 8, NVLINK)["one-shot"] > 2 * t  # reading 7 whole buffers does not pay
    assert allreduce_seconds(m, 1, NVLINK) == (0.0, "one-shot")


def test_serving_prices_its_tp_all_reduces_by_size_when_asked():
    """theory.serving with latency=BY_SIZE: 2 all-reduces per layer, each the least algorithm for the
    step's message (batch × hidden × 2 bytes); a bad latency is one clear line."""
    from playbook import Hardware, ModelConfig
    from playbook.theory.serving import serving

    cfg, hw = ModelConfig.preset("llama-3.1-70b"), Hardware.preset("h100-sxm")
    for batch in (1, 256):
        d = serving.decode(cfg, hw, context=2048, batch=batch, tp=4, latency=serving.BY_SIZE)
        each, _ = allreduce_seconds(batch * cfg.hidden * 2, 4, hw.intra_node_bandwidth)
        assert d.comm == pytest.approx(2 * cfg.n_layers * each)
    ring = serving.decode(cfg, hw, context=2048, batch=1, tp=4)
    assert ring.comm == pytest.approx(2 * cfg.n_layers * (30e-6 + 2 * 3 / 4 * cfg.hidden * 2 / hw.intra_node_bandwidth))
    with pytest.raises(ValueError, match="seconds per ring step"):
        serving.decode(cfg, hw, context=2048, tp=4, latency="fast")
