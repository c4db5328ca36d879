"""FLOPs, step time and the bucket plan: values worked out by hand, and the plan against DDP's own."""

import sys

import pytest
import torch
import torch.distributed as dist

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.model.gpt import GPT
from playbook.theory.dp.buckets import (
    MIB,
    Bucket,
    bucket_cap_bytes,
    bucket_plan,
    check_plan,
    parameter_shapes,
    predict_dp_step,
)
from playbook.theory.cost.flops import (
    StepTime,
    achieved_mfu,
    attention_flops_per_token,
    compute_seconds,
    flops_per_token,
    link_bandwidth,
    matmul_params,
    predict_step_time,
    step_flops,
)

TINY = ModelConfig.preset("gpt-tiny")  # vocab 64, hidden 64, 2 layers, 4 heads (2 kv), ffn 176
# Hand count of gpt-tiny: per layer 2 norms (2·64) + q, o (64·64 each) + k, v (64·32 each) + 3·64·176
TINY_LAYER = 2 * 64 + 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176
TINY_PARAMS = 64 * 64 + 2 * TINY_LAYER + 64 + 64 * 64  # embedding, blocks, final norm, head
HW = Hardware(
    "round",
    memory_bytes=1e9,
    peak_bf16_flops=1e12,
    memory_bandwidth=1e11,
    intra_node_bandwidth=1e9,
    inter_node_bandwidth=1e8,
    devices_per_node=4,
)


# ---- FLOPs ---------------------------------------------------------------------------------------
def test_flops_per_token_by_hand():
    assert TINY.num_params() == TINY_PARAMS == 100_672
    n = TINY_PARAMS - 64 * 64  # the input embedding is a lookup: no FLOPs
    assert matmul_params(TINY) == n
    attention = 12 * 2 * 4 * 16 * 64  # 12 · L · H · Q · T with head_dim 64/4 = 16, T = 64
    assert flops_per_token(TINY, 64) == 6 * n + attention
    assert flops_per_token(TINY, 64, training=False) == 2 * n + attention / 3
    assert step_flops(TINY, tokens=1024, seq_len=64) == 1024 * (6 * n + attention)


def test_tied_embeddings_are_counted_once_as_the_head():
    tied = TINY.replace(tie_embeddings=True)
    assert matmul_params(tied) == tied.num_params() == TINY_PARAMS - 64 * 64


def test_llama_8b_flops_per_token():
    cfg = ModelConfig.preset("llama-3.1-8b")  # 32 layers, 32 heads of 128, vocab 128256, hidden 4096
    n = cfg.num_params() - 128256 * 4096
    assert flops_per_token(cfg, 4096) == 6 * n + 12 * 32 * 32 * 128 * 4096


def test_mla_attention_flops_use_the_query_key_and_value_head_sizes():
    # DeepSeek-V3 (config.json): 61 layers, 128 heads; q·kᵀ over qk_nope 128 + qk_rope 64 = 192,
    # probs·v over v_head_dim 128 (DeepSeek-V2 §2.1), not hidden/heads = 7168/128 = 56.
    cfg = ModelConfig.preset("deepseek-v3")
    T = 4096
    qk_matmul = 2 * 61 * 128 * T * 192  # forward FLOPs per token: H·T·192 multiply-adds per layer
    pv_matmul = 2 * 61 * 128 * T * 128
    assert attention_flops_per_token(cfg, T, training=False) == qk_matmul + pv_matmul
    assert attention_flops_per_token(cfg, T) == 3 * (qk_matmul + pv_matmul)  # backward is twice forward
    # the old count, 12·L·H·(h/H)·T, was about 2.9× too small: (192 + 128) / (2 · 56)
    assert attention_flops_per_token(cfg, T) / (12 * 61 * 128 * 56 * T) == pytest.approx(320 / 112)
    # GQA presets are unchanged: both matmuls at head_dim 128 for Llama 3.1 8B
    llama = ModelConfig.preset("llama-3.1-8b")
    assert attention_flops_per_token(llama, T, training=False) == 4 * 32 * 32 * 128 * T


def test_compute_time_and_mfu():
    assert compute_seconds(2e12, 1e12, mfu=0.5) == pytest.approx(4.0)
    # 1000 tokens/s of gpt-tiny at T=64 on a 1 TFLOP/s device
    assert achieved_mfu(TINY, tokens_per_second=1000, seq_len=64, peak_flops=1e12) == pytest.approx(
        677_760 * 1000 / 1e12
    )
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"mfu must be in \(0, 1\]"):
            compute_seconds(1, 1, mfu=bad)


def test_link_bandwidth_switches_at_the_node_boundary():
    assert link_bandwidth(HW, 4) == 1e9 and link_bandwidth(HW, 5) == 1e8


def test_predicted_step_time_by_hand():
    tokens = 1000
    compute = tokens * flops_per_token(TINY, 64) / 1e12
    # one all-reduce of 1 MB over 4 ranks at 1 GB/s: 2·1e6·3/4 / 1e9 = 1.5 ms, plus 6 ring steps × 5 µs
    comm = 1.5e-3 + 6 * 5e-6
    t = predict_step_time(TINY, HW, tokens=tokens, seq_len=64, collectives=[("all_reduce", 1e6, 4)])
    assert t == StepTime(compute=pytest.approx(compute), comm=pytest.approx(comm), hidden=0.0)
    assert t.total == pytest.approx(compute + comm)
    hidden = predict_step_time(TINY, HW, tokens=tokens, seq_len=64, collectives=[("all_reduce", 1e6, 4)], overlap=True)
    assert hidden.hidden == pytest.approx(min(comm, 2 / 3 * compute))
    assert hidden.total == pytest.approx(compute + comm - hidden.hidden)


def test_theory_imports_no_torch():
    import subprocess

    code = "import sys, playbook.theory.cost.flops, playbook.theory.dp.buckets; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


# ---- the bucket plan -------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["gpt-tiny", "gpt-small"])
def test_parameter_shapes_are_the_models_in_registration_order(preset):
    cfg = ModelConfig.preset(preset)
    assert parameter_shapes(cfg) == [(n, tuple(p.shape)) for n, p in GPT(cfg).named_parameters()]


def test_gradients_become_ready_in_reverse_registration_order():
    model = GPT(TINY)
    ready = []
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, name=name: ready.append(name))
    tokens = torch.randint(64, (2, 16))
    model(tokens, tokens)[1].backward()
    assert ready == [n for n, _ in parameter_shapes(TINY)][::-1]


def test_plan_rule_by_hand():
    params = [("a", 10), ("b", 30), ("c", 5), ("d", 50), ("e", 4)]  # registration order, 1 byte each
    plan = bucket_plan(params, 40, element_bytes=1)
    # reverse order e, d, c, b, a: e+d = 54 >= 40 closes; c+b = 35, +a = 45 closes
    assert [b.names for b in plan] == [("e", "d"), ("c", "b", "a")]
    assert [b.bytes for b in plan] == [54, 45]
    assert [b.names for b in bucket_plan(params, 1000, element_bytes=1)] == [("e", "d", "c", "b", "a")]
    assert [len(b.names) for b in bucket_plan(params, 1, element_bytes=1)] == [1] * 5  # every tensor alone


@pytest.mark.parametrize("cap_mb", [0.01, 0.05, 0.1, 0.2, 1.0])
def test_plan_equals_ddps_own_assignment(cap_mb):
    """torch's C++ ``_compute_bucket_assignment_by_size`` on the tensors in the order gradients arrive
    (what DDP does when it rebuilds buckets after the first step)."""
    model = GPT(TINY)
    named = list(model.named_parameters())[::-1]  # the order gradients become ready
    cap = bucket_cap_bytes(cap_mb)
    indices, _ = dist._compute_bucket_assignment_by_size([p for _, p in named], [cap])
    theirs = [tuple(named[i][0] for i in bucket) for bucket in indices]
    assert [b.names for b in bucket_plan(parameter_shapes(TINY), cap)] == theirs


def test_ddp_default_first_bucket_is_smaller():
    """DDP's defaults (25 MiB, first bucket 1 MiB) on gpt-small's 3 MB of gradients, as torch assigns them."""
    cfg = ModelConfig.preset("gpt-small")
    named = list(GPT(cfg).named_parameters())[::-1]
    limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * MIB]
    assert dist._DEFAULT_FIRST_BUCKET_BYTES == 1 * MIB
    indices, _ = dist._compute_bucket_assignment_by_size([p for _, p in named], limits)
    ours = bucket_plan(parameter_shapes(cfg), 25 * MIB, first_cap_bytes=1 * MIB)
    assert [b.names for b in ours] == [tuple(named[i][0] for i in bucket) for bucket in indices]
    assert len(ours) == 2 and ours[0].bytes >= MIB > ours[0].bytes - 4 * ours[0].numels[-1]


@pytest.mark.parametrize("cap_mb", [0.001, 0.02, 0.1, 0.3, 25])
def test_every_parameter_in_exactly_one_bucket(cap_mb):
    shapes = parameter_shapes(TINY)
    cap = bucket_cap_bytes(cap_mb)
    plan = bucket_plan(shapes, cap)
    check_plan(plan, shapes)
    assert sum(b.bytes for b in plan) == 4 * TINY_PARAMS
    assert [b.index for b in plan] == list(range(len(plan)))
    for b in plan[:-1]:  # every bucket but the last is full, and only its last tensor crossed the cap
        assert b.bytes >= cap and (b.numel - b.numels[-1]) * 4 < cap


def test_check_plan_fails_when_a_parameter_is_skipped_or_counted_twice():
    shapes = parameter_shapes(TINY)
    plan = bucket_plan(shapes, bucket_cap_bytes(0.1))
    first, *rest = plan
    skipped = [Bucket(0, first.names[1:], first.numels[1:]), *rest]
    twice = [Bucket(0, first.names + first.names[:1], first.numels + first.numels[:1]), *rest]
    resized = [Bucket(0, first.names, (first.numels[0] + 1,) + first.numels[1:]), *rest]
    with pytest.raises(ValueError, match=r"skipped \['lm_head.weight'\]"):
        check_plan(skipped, shapes)
    with pytest.raises(ValueError, match=r"counted twice \['lm_head.weight'\]"):
        check_plan(twice, shapes)
    with pytest.raises(ValueError, match=r"wrong size \['lm_head.weight'\]"):
        check_plan(resized, shapes)
    with pytest.raises(ValueError, match=r"unknown \['ghost'\]"):
        check_plan([*plan, Bucket(9, ("ghost",), (1,))], shapes)


@pytest.mark.parametrize("bad", [0, -1, 0.0, "1", None])
def test_bucket_size_must_be_positive(bad):
    with pytest.raises(ValueError, match="bucket size must be > 0 MiB.*try 0.1"):
        bucket_cap_bytes(bad)


def test_cap_in_mib_as_ddp():
    assert bucket_cap_bytes(25) == 25 * MIB and bucket_cap_bytes(0.1) == int(0.1 * 2**20)


def test_moe_presets_are_refused_with_the_dense_ones_named():
    with pytest.raises(ValueError, match="only dense GQA models.*gpt-tiny"):
        parameter_shapes(ModelConfig.preset("mixtral-8x7b"))


# ---- the predicted step ----------------------------------------------------------------------------
def test_predicted_schedule_by_hand():
    cap, n, tokens = bucket_cap_bytes(0.1), 4, 256
    plan = bucket_plan(parameter_shapes(TINY), cap)
    forward = tokens * flops_per_token(TINY, 64, training=False) / 1e12
    backward = 2 * forward
    late = predict_dp_step(TINY, HW, world_size=n, bucket_bytes=cap, tokens=tokens, seq_len=64, overlap=False)
    early = predict_dp_step(TINY, HW, world_size=n, bucket_bytes=cap, tokens=tokens, seq_len=64, overlap=True)
    durations = [2 * b.bytes * 3 / 4 / 1e9 + 6 * 5e-6 for b in plan]
    optimizer = 28 * TINY_PARAMS / 1e11
    # without overlap: all buckets back to back after backward
    assert late.total == pytest.approx(forward + backward + sum(durations) + optimizer)
    assert late.exposed_comm == pytest.approx(sum(durations))
    # with overlap: bucket b may start when its share of backward is done
    comm = [s for s in early.spans if s["kind"] == "comm"]
    ready = forward + backward * plan[0].numel / TINY_PARAMS
    assert comm[0]["start"] == pytest.approx(ready)
    for prev, s, d in zip(comm, comm[1:], durations[1:]):
        assert s["start"] >= prev["end"] - 1e-15 and s["end"] - s["start"] == pytest.approx(d)
    # the last bucket holds the embedding, ready only when backward ends: it is always exposed
    assert comm[-1]["start"] >= forward + backward - 1e-15
    assert early.exposed_comm >= durations[-1] - 1e-12
    assert early.total <= late.total and early.comm == pytest.approx(late.comm)
    assert [s["bytes"] for s in comm] == [b.bytes for b in plan]


def test_one_rank_sends_nothing():
    p = predict_dp_step(TINY, HW, world_size=1, bucket_bytes=MIB, tokens=64, seq_len=64)
    assert p.comm == 0 and p.exposed_comm == pytest.approx(0, abs=1e-15)
