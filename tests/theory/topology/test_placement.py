"""Axes placed on levels, topology files checked, and the planner on two topologies of equal size."""

import json

import pytest

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.plan import plan
from playbook.theory.plan.placed import cost_on, crossings, plan_on, placement_of, ranking
from playbook.theory.serving.on_topology import serve_layouts_on
from playbook.theory.plan.search import Layout
from playbook.theory.topology import ORDERS, from_hardware, load_topology, placement

LAY = Layout(dp=64, tp=2, pp=1, cp=2, ep=1, zero=3, micro_batch=1, microbatches=8, recompute="none")


def test_megatron_order_places_tp_and_cp_on_nvlink_and_dp_across_the_leaf():
    where = placement_of(load_topology("dgx-h100-rail"), LAY, "tp-cp-dp-pp")
    assert where["tp"]["levels"] == {"nvlink": 2} and where["cp"]["levels"] == {"nvlink": 2}
    # dp·cp = 128 ranks at stride 2: 2 of cp x 2 of dp in a node of 8, then 32 nodes on the rail leaf
    assert where["dp"]["levels"] == {"nvlink": 4, "rail-leaf": 32} and where["dp"]["outermost"] == "rail-leaf"
    # on the 2:1 fabric the same 256 ranks span 8 leaves: dp's groups cross the spine
    eth = crossings(load_topology("h100-ethernet-2to1"), LAY, "tp-cp-dp-pp")
    assert eth["spine"] == ["dp"] and eth["nvlink"] == ["tp", "cp", "dp"]


def test_orders_move_the_axes():
    assert len(ORDERS) == 6 and len(set(ORDERS)) == 6
    rail = load_topology("dgx-h100-rail")
    deg = dict(dp=8, tp=4, pp=4, cp=2, ep=1)
    assert placement(rail, "tp-cp-dp-pp", deg)["pp"]["outermost"] == "rail-leaf"
    assert placement(rail, "tp-pp-cp-dp", deg)["pp"]["levels"] == {"nvlink": 2, "rail-leaf": 2}
    assert placement(rail, "dp-tp-cp-pp", deg)["tp"]["stride"] == 8  # tp past the node: its groups cross nodes
    with pytest.raises(ValueError, match="mesh order must be one of"):
        placement(rail, "pp-dp", deg)


def test_equal_gpu_counts_prefer_different_layouts():
    cfg = ModelConfig.preset("llama-3.1-70b")
    kw = dict(gpus=256, seq_len=8192, global_batch=512, top=3)
    rail, eth = (ranking(cfg, load_topology(n), **kw) for n in ("dgx-h100-rail", "h100-ethernet-2to1"))
    assert load_topology("dgx-h100-rail").gpus >= 256 and load_topology("h100-ethernet-2to1").gpus >= 256
    assert rail[0]["layout"] != eth[0]["layout"]
    # each winner is slower on the other fabric, and the difference is where dp sits
    for mine, other, name in ((rail, eth, "h100-ethernet-2to1"), (eth, rail, "dgx-h100-rail")):
        there = cost_on(
            cfg,
            load_topology(name),
            mine[0]["candidate"].layout,
            seq_len=8192,
            mesh_order=mine[0]["mesh_order"],
            rank=False,
        )
        assert there["step"]["total"] > other[0]["step_s"]
    assert rail[0]["placement"]["dp"] == "rail-leaf" and eth[0]["placement"]["dp"] == "spine"


def test_placed_flat_profile_is_the_profile_itself():
    cfg, hw = ModelConfig.preset("llama-3.1-8b"), Hardware.preset("h100-sxm")
    a = plan(cfg, hw, gpus=16, seq_len=4096, global_batch=64)
    b = plan_on(cfg, from_hardware(hw), hw=hw, gpus=16, seq_len=4096, global_batch=64)
    assert [str(c.layout) for c in a.candidates] == [str(c.layout) for c in b.candidates]


def test_workstation_plans_an_8b_model():
    cfg, ws = ModelConfig.preset("llama-3.1-8b"), load_topology("pcie-workstation")
    rows = ranking(cfg, ws, gpus=8, seq_len=4096, global_batch=32, top=3)
    assert rows and all(r["candidate"].memory <= 0.9 * Hardware.preset("l40s").capacity_bytes for r in rows)
    # tp over PCIe: tp2 inside one switch, tp8 across the sockets
    assert placement(ws, "tp-cp-dp-pp", dict(tp=2, dp=4))["tp"]["outermost"] == "pcie-switch"
    assert placement(ws, "tp-cp-dp-pp", dict(tp=8, dp=1))["tp"]["outermost"] == "upi"
    serve = {r["tp"]: r for r in serve_layouts_on(cfg, ws, gpus=8, context=8192)}
    assert serve[8]["tp_level"] == "upi" and serve[2]["tp_level"] == "pcie-switch" and serve[1]["tp_level"] == "one GPU"


def _write(tmp_path, raw) -> str:
    p = tmp_path / "t.json"
    p.write_text(json.dumps(raw))
    return str(p)


def test_bad_topology_files_are_one_line(tmp_path):
    good = json.loads(open("data/topology/dgx-h100-rail.json").read())
    bad = json.loads(json.dumps(good))
    bad["levels"][2]["oversubscription"] = 0.5
    with pytest.raises(ValueError, match=r"levels\[2\]: oversubscription must be a number at least 1"):
        load_topology(_write(tmp_path, bad))
    bad = json.loads(json.dumps(good))
    del bad["storage"]
    with pytest.raises(ValueError, match="lacks storage"):
        load_topology(_write(tmp_path, bad))
    bad = json.loads(json.dumps(good))
    bad["levels"][0]["kind"] = "wire"
    with pytest.raises(ValueError, match="kind must be one of link"):
        load_topology(_write(tmp_path, bad))
    with pytest.raises(ValueError, match="unknown topology 'nope'.*dgx-h100-rail"):
        load_topology("nope")
    with pytest.raises(ValueError, match="more than topology 'pcie-workstation' holds"):
        plan_on(
            ModelConfig.preset("llama-3.1-8b"),
            load_topology("pcie-workstation"),
            gpus=16,
            seq_len=4096,
            global_batch=32,
        )
