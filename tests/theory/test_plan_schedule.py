"""Schedules in the planner's cost model (``theory.plan.schedule``): each bubble from its paper,
the V shapes' closed form against chapter 4's simulator, and the planner searching them."""

import pytest

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.plan.cost import step_cost, with_schedule
from playbook.theory.plan.stage_balance import stage_imbalance
from playbook.theory.plan.schedule import (
    bubble_fraction,
    check_schedules,
    chunk_layers,
    layers_held,
    schedule_options,
)
from playbook.theory.plan.memory import in_flight
from playbook.theory.pp.simulator import simulate
from playbook.theory.pp.schedules import make_schedule


def test_bubbles_from_the_papers():
    p, m = 16, 64
    assert bubble_fraction("1f1b", p, m) == pytest.approx((p - 1) / m)  # Narayanan et al. 2021 §2.2
    assert bubble_fraction("interleaved", p, m, 4) == pytest.approx((p - 1) / (4 * m))  # §2.2.2
    assert bubble_fraction("zb-h1", p, m) == pytest.approx((p - 1) / (3 * m))  # Qi et al. 2023 §3, F = B = W


@pytest.mark.parametrize("name", ["zb-v", "dualpipe-v"])
@pytest.mark.parametrize("p,m", [(4, 8), (4, 12), (6, 18)])
def test_v_shapes_match_the_simulator(name, p, m):
    assert bubble_fraction(name, p, m, 2) == pytest.approx(simulate(make_schedule(name, p, m, 2)).bubble_over_ideal)


def test_options_respect_each_schedules_rules():
    opts = schedule_options(4, 6, n_layers=8)  # m = 6 is no multiple of p = 4: no interleaving
    assert ("interleaved", 2) not in opts and ("zb-h1", 1) in opts and ("zb-v", 2) not in opts  # m < 2p
    opts = schedule_options(4, 8, n_layers=8)
    assert ("interleaved", 2) in opts and ("interleaved", 3) not in opts  # p·v <= layers
    assert schedule_options(1, 8, n_layers=8) == [("1f1b", 1)]
    with pytest.raises(ValueError, match="1f1b, interleaved"):
        check_schedules(("gpipe",))


def test_with_schedule_equals_a_direct_count():
    cfg, hw = ModelConfig.preset("llama-3.1-8b"), Hardware.preset("h100-sxm")
    kw = dict(dp=2, tp=2, pp=4, cp=1, ep=1, zero=1, micro_batch=1, microbatches=16, recompute="none")
    kw |= dict(seq_len=4096, gpus_per_node=8)
    base = step_cost(cfg, hw, **kw)
    for name, v in (("interleaved", 2), ("zb-h1", 1), ("zb-v", 2)):
        direct = step_cost(cfg, hw, **kw, schedule=name, v=v)
        imbalance = stage_imbalance(cfg, 4096, 4, name, v)
        derived = with_schedule(base, pp=4, microbatches=16, schedule=name, v=v, imbalance=imbalance)
        assert derived.total == pytest.approx(direct.total) and derived.bubble < base.bubble


def test_a_cluster_of_384_gpus_plans_with_non_power_of_two_degrees():
    from playbook.theory.plan.search import divisors
    from playbook.theory.plan.planner import plan

    assert divisors(384, 16) == [1, 2, 3, 4, 6, 8, 12, 16]
    cfg, hw = ModelConfig.preset("llama-3.1-8b"), Hardware.preset("h100-sxm")
    p = plan(cfg, hw, gpus=384, seq_len=4096, global_batch=768, schedules=("1f1b",))
    assert p.candidates
    odd = [c for c in p.candidates if c.layout.pp % 3 == 0 or c.layout.cp % 3 == 0]  # 12 stages, cp 3
    assert odd and all(c.layout.dp * c.layout.tp * c.layout.pp * c.layout.cp == 384 for c in p.candidates)


def test_overlap_presets_hide_what_they_name():
    from playbook.theory.plan.cost import OVERLAP_PRESETS

    cfg, hw = ModelConfig.preset("llama-3.1-8b"), Hardware.preset("h100-sxm")
    kw = dict(dp=2, tp=4, pp=2, cp=1, ep=1, zero=1, micro_batch=1, microbatches=8, recompute="none")
    kw |= dict(seq_len=4096, gpus_per_node=8)
    none, tp = step_cost(cfg, hw, **kw, overlap="none"), step_cost(cfg, hw, **kw, overlap="megatron-tp")
    assert none.axes["tp"][1] == none.axes["tp"][0] and none.axes["dp"][1] == none.axes["dp"][0]  # all exposed
    assert tp.axes["dp"][1] < tp.axes["dp"][0] == none.axes["dp"][0]  # the buckets behind the backward
    assert step_cost(cfg, hw, **kw, overlap="dp").axes["dp"] == tp.axes["dp"]
    assert tp.axes["tp"][1] == pytest.approx(tp.axes["tp"][0] / 4)  # the collective matmul's first of t chunks
    assert tp.axes["pp"] == none.axes["pp"] and set(OVERLAP_PRESETS) == {"none", "dp", "megatron-tp", "deepseek-ep"}
    ds = step_cost(cfg, hw, **kw, overlap="deepseek-ep")
    assert ds.axes["pp"][1] == 0.0 < ds.axes["pp"][0]
    with pytest.raises(ValueError, match="none, dp, megatron-tp, deepseek-ep"):
        step_cost(cfg, hw, **kw, overlap="all")


def test_llama3_light_ends_chunks():
    """Dubey et al. 2024 §3.3.2: one layer fewer on the first and last stages, the first chunk only
    the embedding: 126 layers + 2 = 128 virtual stages of one layer over pp16, so v = 8."""
    sizes = chunk_layers(126, 16, 8, "light")
    assert len(sizes) == 128 and sum(sizes) == 126 and sizes[0] == sizes[-1] == 0 and set(sizes[1:-1]) == {1}
    assert chunk_layers(126, 16) == (8,) * 14 + (7, 7)  # even: the first stages take the remainder
    assert chunk_layers(126, 16, 1, "light") == (7,) + (8,) * 14 + (7,)
    with pytest.raises(ValueError, match="ends must be one of even, light"):
        chunk_layers(126, 16, 1, "heavy")
    with pytest.raises(ValueError, match="use fewer p·v"):
        chunk_layers(8, 4, 4)
    with pytest.raises(ValueError, match="uneven stages are counted for 1f1b and interleaved; got 'zb-v'"):
        layers_held("zb-v", 4, 8, 2, chunk_layers(8, 4, 2))
    with pytest.raises(ValueError, match="m must be a multiple of p"):
        layers_held("interleaved", 4, 6, 2, chunk_layers(8, 4, 2))


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (8, 16, 4), (16, 32, 8)])
def test_layers_held_plays_megatrons_warm_up(p, m, v):
    """Even stages: rank 0 holds the closed form, p·(1 + (p−1)/(p·v)) stages of L/p layers
    (Korthikanti et al. 2022 §4.2.3), 1F1B p − r stages on rank r. Light ends with one-layer chunks:
    rank r keeps 2(p−r−1) + (v−1)p + 1 chunk-micro-batches alive (Megatron's warm-up and one more
    forward), so rank 0, whose first chunk is empty (its 2p − 1 micro-batches hold no layer), holds
    (v−1)p and rank 1 holds (v+1)p − 3: the second rank, not the first, is the most loaded."""
    L = 2 * p * v
    assert layers_held("interleaved", p, m, v, chunk_layers(L, p, v))[0] == pytest.approx(L * (1 + (p - 1) / (p * v)))
    assert layers_held("1f1b", p, m, 1, chunk_layers(L, p)) == tuple((p - r) * L // p for r in range(p))
    held = layers_held("interleaved", p, m, v, chunk_layers(p * v - 2, p, v, "light"))
    assert held[0] == (v - 1) * p and held[1] == (v + 1) * p - 3 == max(held)
    for mb in (p, 2 * p, 3 * p):  # the played order agrees with prod_activations' closed form, capped at m
        assert layers_held("interleaved", p, mb, v, chunk_layers(L, p, v))[0] == pytest.approx(
            in_flight("interleaved", p, mb, v) * L / p
        )
    hot = tuple(int(stage == p) for stage in range(p * v))  # one layer, on virtual stage p: chunk 1 of rank 0
    held = layers_held("interleaved", p, m, v, hot)
    assert held[0] >= p and held[1:] == (0,) * (p - 1)  # its first p micro-batches run before any backward
