"""The planner: step-time pieces by hand on gpt-tiny, rejection reasons, bad input, a known winner."""

from __future__ import annotations

import pytest

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.plan.cost import step_cost, step_costs
from playbook.theory.plan.planner import plan

TINY = ModelConfig.preset("gpt-tiny")  # vocab 64, hidden 64, 2 layers, 4 heads (2 KV, dim 16), ffn 176, untied
HW = Hardware(
    name="toy",
    memory_bytes=1e12,
    peak_bf16_flops=1e12,
    memory_bandwidth=1e12,
    intra_node_bandwidth=1e9,
    inter_node_bandwidth=1e8,
    devices_per_node=8,
    intra_node_latency=1e-6,
    inter_node_latency=1e-5,
    achievable_flops_fraction=0.5,
)

# By hand: one layer = 2 norms (128) + q,o 64·64 each + k,v 64·32 each (12,288) + SwiGLU 3·64·176 (33,792)
# = 46,208; matmul params = 2 layers + final norm 64 + head 64·64 = 96,576; all params add the
# 64·64 embedding: 100,672. Training FLOPs per token at T=32: 6·96,576 + 12·2·4·16·32 = 628,608.
FLOPS_PER_TOKEN = 6 * 96_576 + 12 * 2 * 4 * 16 * 32
ALL_PARAMS = 100_672


def cost(**kw):
    base = dict(dp=1, tp=1, pp=1, cp=1, ep=1, zero=0, micro_batch=2, microbatches=1, recompute="none")
    return step_cost(TINY, HW, **{**base, **kw}, seq_len=32, gpus_per_node=8)


def test_single_gpu_is_compute_only():
    c = cost()
    assert c.compute == pytest.approx(64 * FLOPS_PER_TOKEN / (1e12 * 0.5))  # 2 sequences of 32 tokens
    assert c.axes == {} and c.bubble == 0 and c.total == c.compute


def test_full_recompute_adds_a_forward():
    assert cost(recompute="full").compute == pytest.approx(cost().compute * 4 / 3)


def test_dp_all_reduce_below_one_bucket_is_all_exposed():
    # 201,344 bytes of bf16 gradients, one bucket: the ring all-reduce over 2 ranks sends 2·G·1/2 = G
    # bytes on the intra-node link and takes 2·(2 − 1) latency steps; nothing can hide the last bucket
    comm, exposed = cost(dp=2).axes["dp"]
    assert comm == pytest.approx(2 * ALL_PARAMS / 1e9 + 2 * 1e-6)
    assert exposed == pytest.approx(comm)


def test_tp_collectives_exposed_eight_per_layer():
    # activation [32, 2, 64] bf16 = 8,192 bytes; all-gather over 2 sends half of it, 1 latency step;
    # 4 forward + 4 backward per layer, 2 layers, 1 micro-batch
    comm, exposed = cost(tp=2).axes["tp"]
    assert comm == pytest.approx(2 * 8 * (4096 / 1e9 + 1e-6)) and exposed == comm


def test_links_follow_the_rank_order():
    # dp groups are tp·cp apart: dp2 × tp8 spans 16 ranks, two nodes of 8, so its ring uses the NIC
    inside = step_cost(
        TINY,
        HW,
        dp=2,
        tp=2,
        pp=1,
        cp=1,
        ep=1,
        zero=0,
        micro_batch=1,
        microbatches=1,
        recompute="none",
        seq_len=32,
        gpus_per_node=8,
    ).axes["dp"][0]
    across = step_cost(
        TINY,
        HW,
        dp=2,
        tp=2,
        pp=1,
        cp=1,
        ep=1,
        zero=0,
        micro_batch=1,
        microbatches=1,
        recompute="none",
        seq_len=32,
        gpus_per_node=2,
    ).axes["dp"][0]
    norms = 2 * 2 * 64 + 64  # two per layer and the final one: whole on every tp rank (hybrid_zero.flat_units)
    g = 2 * ((ALL_PARAMS - norms) / 2 + norms)  # bf16: half the matrices per tp rank, every norm
    assert inside == pytest.approx(g / 1e9 + 2e-6) and across == pytest.approx(g / 1e8 + 2e-5)


def test_bubble_is_p_minus_1_over_m_of_the_pipelined_time():
    """(p − 1)/m of the busiest rank's pipelined time, plus its extra compute the other rank waits
    through (TINY's last stage holds the head: ``theory.plan.stage_balance``)."""
    from playbook.theory.plan.stage_balance import stage_imbalance

    c = cost(pp=2, microbatches=4, micro_batch=1)
    k = stage_imbalance(TINY, 32, 2)
    assert k > 1
    assert c.bubble == pytest.approx(c.compute * (k - 1) + (c.compute * k + c.axes["pp"][1]) * 1 / 4)


def test_step_costs_per_zero_stage_equal_step_cost():
    # the planner's shortcut (one cost per micro-batch and recomputation, the dp axis per stage) must
    # give what step_cost gives for each stage on its own, here with every axis present
    layout = dict(dp=2, tp=2, pp=2, cp=2, ep=1, micro_batch=1, microbatches=4, recompute="selective")
    many = step_costs(TINY, HW, zeros=(0, 1, 2, 3), **layout, seq_len=32, gpus_per_node=8)
    for zero in range(4):
        assert many[zero] == step_cost(TINY, HW, zero=zero, **layout, seq_len=32, gpus_per_node=8)
    assert len({many[z].axes["dp"] for z in range(4)}) > 1  # and the stages do differ


def test_rejections_say_why():
    p = plan(TINY, HW, gpus=8, gpus_per_node=2, seq_len=32, global_batch=6)
    assert p.rejected["tp crosses nodes"][1].startswith("tp=4 > 2 GPUs per node")
    assert "no experts" in p.rejected["ep without experts"][1]
    assert "global batch 6 does not split over dp=8" in p.rejected["global batch split"][1]
    p = plan(TINY, HW, gpus=8, gpus_per_node=8, seq_len=32, global_batch=8)
    assert "kv_heads=2" in p.rejected["tp vs the model"][1]  # tp=4 divides 4 heads but not 2 KV heads
    assert "pp=4 is more stages than the model's 2 layers" in p.rejected["pp vs the model"][1]


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match=r"^nothing fits: the least memory a layout of 8 GPUs needs is .* GB per GPU"):
        plan(ModelConfig.preset("llama-3.1-405b"), Hardware.preset("h100-sxm"), gpus=8, seq_len=4096, global_batch=8)
    with pytest.raises(ValueError, match="not a whole number of nodes"):
        plan(TINY, HW, gpus=12, gpus_per_node=8, seq_len=32, global_batch=8)
    with pytest.raises(ValueError, match="does not split over any dp"):  # seq 1: no cp; 2 layers: pp <= 2
        plan(TINY, HW, gpus=8, gpus_per_node=1, seq_len=1, global_batch=3)
    with pytest.raises(ValueError, match="unknown model preset"):
        ModelConfig.preset("llama-9")


def test_pure_data_parallel_wins_inside_one_node():
    # First principles: every layout of 8 GPUs does the same compute per GPU; on slow compute and fast
    # links (compute dominates) pp's bubble costs a share of it, while tp, cp, ZeRO 1-3 and extra
    # pipeline stages each add exposed communication that plain DP does not have, and recomputation
    # adds FLOPs. DP's one all-reduce is the smallest extra there is. So: dp8, no recomputation, and a
    # step of compute + ZeRO-1's ring reduce-scatter of the fp32 gradients (the production stack
    # reduces Megatron's fp32 main_grad, theory.plan_dp) and all-gather of the bf16 weights: fewer
    # bytes than an fp32 all-reduce in as many ring steps, so ZeRO-1 beats plain DP.
    fast = Hardware(
        name="fast-links",
        memory_bytes=1e12,
        peak_bf16_flops=1e9,
        memory_bandwidth=1e12,
        intra_node_bandwidth=1e12,
        inter_node_bandwidth=1e11,
        devices_per_node=8,
        intra_node_latency=1e-7,
        inter_node_latency=1e-6,
        achievable_flops_fraction=0.5,
    )
    p = plan(TINY, fast, gpus=8, seq_len=32, global_batch=16, overlap="none")  # tp's collectives all exposed
    best = p.candidates[0].layout
    assert (best.dp, best.tp, best.pp, best.cp, best.recompute) == (8, 1, 1, 1, "none")
    assert best.zero == 1 or (best.zero == 2 and best.microbatches == 1)  # ZeRO-2 at m = 1 sends ZeRO-1's bytes
    compute = 16 * 32 * FLOPS_PER_TOKEN / 8 / (1e9 * 0.5)
    all_reduce = (4 + 2) * ALL_PARAMS * 7 / 8 / 1e12 + 2 * 7 * 1e-7  # fp32 reduce-scatter, bf16 all-gather
    assert p.candidates[0].cost.total == pytest.approx(compute + all_reduce, rel=1e-12)
    assert any(c.layout.tp == 2 for c in p.candidates) and any(c.layout.pp == 2 for c in p.candidates)


def test_candidates_fit_and_are_ranked():
    p = plan(ModelConfig.preset("llama-3.1-70b"), Hardware.preset("h100-sxm"), gpus=64, seq_len=4096, global_batch=256)
    steps = [c.cost.total for c in p.candidates]
    assert steps == sorted(steps)
    assert all(c.memory <= 0.9 * 81_559 * 2**20 for c in p.candidates)  # nvidia-smi's total on an H100
    assert all(c.layout.tp <= 8 for c in p.candidates)
    c = p.candidates[0]  # MFU and tokens/s from the step time, by definition
    assert c.tokens_per_s == pytest.approx(256 * 4096 / c.cost.total)
    assert 0 < c.mfu < Hardware.preset("h100-sxm").achievable_flops_fraction


def test_cli_plan_json_and_bad_input(capsys):
    import json

    from playbook.cli import main

    argv = ["plan", "--model", "gpt-tiny", "--gpus", "2", "--hardware", "cpu-laptop", "--seq-len", "32"]
    assert main([*argv, "--global-batch", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["candidates"][0]["step_s"] <= out["candidates"][-1]["step_s"]
    assert out["launch"]["replay"].startswith("playbook run hybrid --model gpt-tiny --dp ")
    assert "#SBATCH --nodes=1" in out["launch"]["sbatch"]
    assert main(["plan", "--model", "llama-3.1-405b", "--gpus", "8", "--seq-len", "4096", "--global-batch", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("playbook: error: nothing fits")
    # --model and --hf-config: exactly one of them
    assert main(["plan"]) == 2
    assert capsys.readouterr().err.strip().startswith("playbook: error: name the model: --model NAME (one of ")


def test_the_search_orders_by_the_same_total_it_reports():
    """plan_cost.scheduled_total, by which the search orders every variant, is with_schedule(...).total to
    the last bit, for every schedule and v of a pipeline with every axis costed."""
    from playbook.theory.plan.cost import scheduled_total, with_schedule
    from playbook.theory.plan.stage_balance import stage_imbalance
    from playbook.theory.plan.schedule import schedule_options

    h100, cfg = Hardware.preset("h100-sxm"), ModelConfig.preset("llama-3.1-70b")
    bases = step_costs(
        cfg,
        h100,
        zeros=(0, 1, 2),
        dp=4,
        tp=2,
        pp=8,
        cp=2,
        ep=1,
        micro_batch=1,
        microbatches=16,
        recompute="selective",
        seq_len=8192,
        gpus_per_node=8,
    )
    assert {"dp", "tp", "pp", "cp"} <= set(bases[1].axes)
    options = schedule_options(8, 16, cfg.n_layers)
    assert len({s for s, _ in options}) == 5 and len(options) > 8
    for base in bases.values():
        for schedule, v in options:
            at = dict(
                pp=8, microbatches=16, schedule=schedule, v=v, imbalance=stage_imbalance(cfg, 8192, 8, schedule, v)
            )
            assert scheduled_total(base, **at) == with_schedule(base, **at).total
