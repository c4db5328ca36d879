"""Issue 48, near-misses in the planner's numbers: realistic one-line bugs no other test sees.

- 5: full recomputation reruns each MoE layer's forward, so its dispatch and combine all-to-alls run
  again: 6 per layer and micro-batch, not 4 (DeepSpeed-MoE's two forward + two backward);
- 6: an expert's GEMM gets the tokens of the whole ep group routed to it (each of the ep ranks
  dispatches its k·T slots over E experts), not one rank's;
- 7: a routed expert's optimizer state is sharded over its replicas (dp·cp/ep ranks), not dp·cp.
"""

from __future__ import annotations

import pytest

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.cost.comm import collective_seconds
from playbook.theory.cost.gemm_efficiency import layer_gemms
from playbook.theory.plan.cost import step_cost

H100 = Hardware.preset("h100-sxm")
MIXTRAL = ModelConfig.preset("mixtral-8x7b")  # 32 MoE layers, 8 experts, top-2, hidden 4096
DEEPSEEK = ModelConfig.preset("deepseek-v3")  # 256 routed experts, top-8


@pytest.mark.parametrize("recompute, per_layer", [("none", 4), ("selective", 4), ("full", 6)])
def test_full_recomputation_runs_each_moe_layers_two_all_to_alls_again(recompute, per_layer):
    """dp8 = ep8 in one node, b = 1, m = 4, s = 4,096: one all-to-all moves a micro-batch's
    [s, b, h] bf16 activation × k = 4096·4096·2·2 bytes; ep's time is m · 32 layers · per_layer of them
    (overlap "dp": ep's time is exposed whole)."""
    lay = dict(dp=8, tp=1, pp=1, cp=1, ep=8, zero=1, micro_batch=1, microbatches=4, seq_len=4096, gpus_per_node=8)
    got = step_cost(MIXTRAL, H100, recompute=recompute, **lay).axes["ep"]
    one = collective_seconds(
        "all_to_all", 4096 * 1 * 4096 * 2 * 2, 8, H100.intra_node_bandwidth, H100.intra_node_latency
    )
    assert got == pytest.approx((4 * 32 * per_layer * one,) * 2, rel=1e-12)


@pytest.mark.parametrize(
    "cfg, tokens, ep, rows", [(DEEPSEEK, 4096, 8, 1024), (DEEPSEEK, 4096, 16, 2048), (MIXTRAL, 4096, 8, 8192)]
)
def test_an_experts_gemm_has_the_ep_groups_tokens_routed_to_it(cfg, tokens, ep, rows):
    """Rows per expert GEMM = T·ep·k/E: DeepSeek-V3, 4,096 tokens a rank, ep8: 4096·8·8/256 = 1,024
    (ep16: 2,048); Mixtral ep8: 4096·8·2/8 = 8,192. One rank's tokens alone would give T·k/E."""
    gemms = layer_gemms(cfg, tokens, 1, ep)
    fe, h = cfg.expert_ffn_hidden, cfg.hidden
    experts = [g for g in gemms if (g[1], g[2]) in ((2 * fe, h), (h, fe)) and g[0] != tokens]
    assert len(experts) == 2 and {g[0] for g in experts} == {rows}


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_a_pipeline_ranks_expert_state_is_sharded_over_the_experts_replicas_only(zero):
    """Mixtral in dp16×ep8×pp4: rank 1 holds layers 8-15, each with E/ep = 1 routed expert of
    3·4096·14336 weights: 8·176,160,768 = 1,409,286,144. An expert is held by dp·cp/ep = 2 data ranks,
    so ZeRO shards its 12 bytes of AdamW state (fp32 master, two moments) over 2, and the dense
    weights' over all 16 (their count from ``_stage_params``, which is not under test here)."""
    from playbook.theory.hybrid.stages import _stage_params
    from playbook.theory.plan.memory import rank_chunks, rank_state

    degrees = (("dp", 16), ("tp", 1), ("pp", 4), ("cp", 1), ("ep", 8))
    chunks = rank_chunks(MIXTRAL, 4, 1, "1f1b", 1, "even")
    assert chunks == ((8, 8, False, False),)
    dense, experts = _stage_params(MIXTRAL, range(8, 16), tp=1, ep=8, first=False, last=False)
    assert experts == 8 * 3 * 4096 * 14336 == 1_409_286_144
    optimizer = rank_state(MIXTRAL, degrees, zero, "main_grad", chunks)[2]
    assert optimizer == pytest.approx(12 * dense / 16 + 12 * 1_409_286_144 / 2, rel=1e-12)
