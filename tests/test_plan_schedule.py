"""Schedules in the planner's cost model (``theory.plan_schedule``): each bubble from its paper,
the V shapes' closed form against chapter 4's simulator, and the planner searching them."""

import pytest

from playbook.config import Hardware, ModelConfig
from playbook.theory.plan_cost import step_cost, with_schedule
from playbook.theory.plan_schedule import bubble_fraction, check_schedules, schedule_options
from playbook.theory.schedules import make_schedule, simulate


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
        derived = with_schedule(base, pp=4, microbatches=16, schedule=name, v=v)
        assert derived.total == pytest.approx(direct.total) and derived.bubble < base.bubble


def test_a_cluster_of_384_gpus_plans_with_non_power_of_two_degrees():
    from playbook.theory.planner import divisors, plan

    assert divisors(384, 16) == [1, 2, 3, 4, 6, 8, 12, 16]
    cfg, hw = ModelConfig.preset("llama-3.1-8b"), Hardware.preset("h100-sxm")
    p = plan(cfg, hw, gpus=384, seq_len=4096, global_batch=768, schedules=("1f1b",))
    assert p.candidates
    odd = [c for c in p.candidates if c.layout.pp % 3 == 0 or c.layout.cp % 3 == 0]  # 12 stages, cp 3
    assert odd and all(c.layout.dp * c.layout.tp * c.layout.pp * c.layout.cp == 384 for c in p.candidates)


def test_overlap_presets_hide_what_they_name():
    from playbook.theory.plan_cost import OVERLAP_PRESETS

    cfg, hw = ModelConfig.preset("llama-3.1-8b"), Hardware.preset("h100-sxm")
    kw = dict(dp=2, tp=4, pp=2, cp=1, ep=1, zero=1, micro_batch=1, microbatches=8, recompute="none")
    kw |= dict(seq_len=4096, gpus_per_node=8)
    none, tp = step_cost(cfg, hw, **kw, overlap="none"), step_cost(cfg, hw, **kw, overlap="megatron-tp")
    assert none.axes["tp"][1] == none.axes["tp"][0]  # all exposed
    assert tp.axes["tp"][1] == pytest.approx(tp.axes["tp"][0] / 4)  # the collective matmul's first of t chunks
    assert tp.axes["pp"] == none.axes["pp"] and set(OVERLAP_PRESETS) == {"none", "megatron-tp", "deepseek-ep"}
    ds = step_cost(cfg, hw, **kw, overlap="deepseek-ep")
    assert ds.axes["pp"][1] == 0.0 < ds.axes["pp"][0]
    with pytest.raises(ValueError, match="none, megatron-tp, deepseek-ep"):
        step_cost(cfg, hw, **kw, overlap="all")
