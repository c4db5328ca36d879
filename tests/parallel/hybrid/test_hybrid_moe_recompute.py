"""Activation recomputation with a mixture of experts, on real ranks (``parallel.hybrid.recompute``,
``theory.hybrid.recompute``): each layout against the single process that routes the same
micro-batches (``parallel.hybrid.moe.reference``: loss, every gradient, parameters after AdamW,
within ``parallel.parity``'s bounds), bytes per rank per step on every axis measured == predicted
(under "full" the MoE layer's replay: its routing counts all-gathered again, dispatch and combine
sent again) and memory per category measured == predicted to the byte on every rank."""

import pytest
from hybrid_matrix import MOE, check

from playbook.dims import ParallelDims
from playbook.theory.hybrid.plan import Plan

LAYOUTS = [
    ("ep2", ParallelDims(dp=2, ep=2), 2),
    ("tp2, router replicated", ParallelDims(tp=2), 2),
    ("dp4×ep2, experts over 2 replicas", ParallelDims(dp=4, ep=2), 4),
    ("pp2×dp2×ep2", ParallelDims(dp=2, pp=2, ep=2), 4),
]
CASES = [
    (f"{mode} in {name}", Plan(dims, recompute=mode), world)
    for name, dims, world in LAYOUTS
    for mode in ("selective", "full")
]
CASES += [
    ("full in dp2×cp2×ep2 (RoPE positions saved once)", Plan(ParallelDims(dp=2, cp=2, ep=2), recompute="full"), 4)
]


@pytest.mark.parametrize("name, plan, world", CASES, ids=[c[0] for c in CASES])
def test_moe_recomputation_matches_the_single_process(request, name, plan, world):
    check(request.getfixturevalue(f"ranks{world}"), MOE, plan)


def test_the_replay_reruns_routing_but_records_it_once():
    """Full recomputation reruns each MoE layer's routing in backward (its all-to-alls with it), but
    stops at the layer's last saved tensor, before its forward hooks: the routing and the aux loss
    are recorded once per forward (``parallel.hybrid.recompute``), so nothing is counted twice."""
    import torch

    from playbook.model.gpt import build_moe
    from playbook.model.moe import moe_layers
    from playbook.parallel.hybrid.moe import count_aux, record_routing
    from playbook.parallel.hybrid.recompute import apply_recompute

    model = apply_recompute(build_moe(MOE.config(), MOE.seed), "full")
    seen, taken, routed = record_routing(model), count_aux(model, 1, into_graph=False), []
    for layer in moe_layers(model):
        layer.register_forward_pre_hook(lambda layer, _args: routed.append(layer))
    tokens, targets = MOE.task().batch(0, MOE.global_batch, MOE.seq_len)
    _, loss = model(tokens, targets)
    loss.backward()
    layers = MOE.config().n_moe_layers
    assert (len(routed), len(seen), len(taken)) == (2 * layers, layers, layers)
    assert all(p.grad is not None for p in model.parameters())
    assert torch.isfinite(loss)


SPLIT = Plan(ParallelDims(dp=2, pp=2, ep=2), schedule="zb-h1", microbatches=4, recompute="full")


def test_moe_full_recomputation_under_zb_h1_matches_the_single_process(ranks4):
    """A split backward recomputes each MoE block once at B (its all-to-alls with it) and W takes the
    router's and experts' inputs from that: parity, bytes on every axis and every memory category,
    the activations W keeps included (``theory.hybrid.moe.moe_block_w_bytes``; more split layouts:
    tests/parallel/hybrid/test_hybrid_moe_split.py)."""
    check(ranks4, MOE, SPLIT)
