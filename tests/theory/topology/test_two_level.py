"""The two-level results are unchanged: today's planner (``theory.plan.plan`` on a hardware profile)
and the same profile converted to the simplest topology (``theory.topology.from_hardware``, planned
by ``theory.plan.placed.plan_on``) both give the plans recorded from main's planner before any
topology code existed (``two_level_plans.json``, commit 9df3a1d: top five layouts, step times, and
each axis's communication)."""

import json
from pathlib import Path

import pytest

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.plan import plan
from playbook.theory.plan.placed import plan_on
from playbook.theory.topology import from_hardware

GOLDEN = json.loads((Path(__file__).parent / "two_level_plans.json").read_text())["cases"]


def _top(p) -> list[dict]:
    return [
        dict(layout=str(c.layout), step_s=c.cost.total, axes={a: list(v) for a, v in c.cost.axes.items()})
        for c in p.candidates[:5]
    ]


def _same(got: list[dict], want: list[dict]) -> None:
    assert [g["layout"] for g in got] == [w["layout"] for w in want]
    for g, w in zip(got, want):
        assert g["step_s"] == pytest.approx(w["step_s"], rel=1e-12)
        assert g["axes"].keys() == w["axes"].keys()
        for a in w["axes"]:
            assert g["axes"][a] == pytest.approx(w["axes"][a], rel=1e-12)


@pytest.mark.parametrize("case", GOLDEN, ids=lambda c: f"{c['model']}-{c['hardware']}-{c['gpus']}-{c['mesh_order']}")
def test_profile_plans_are_unchanged(case):
    cfg, hw = ModelConfig.preset(case["model"]), Hardware.preset(case["hardware"])
    kw = dict(
        gpus=case["gpus"], seq_len=case["seq_len"], global_batch=case["global_batch"], mesh_order=case["mesh_order"]
    )
    today = plan(cfg, hw, **kw)
    assert len(today.candidates) == case["n_candidates"]
    _same(_top(today), case["top"])


@pytest.mark.parametrize("case", GOLDEN, ids=lambda c: f"{c['model']}-{c['hardware']}-{c['gpus']}-{c['mesh_order']}")
def test_profile_as_a_topology_plans_the_same(case):
    cfg, hw = ModelConfig.preset(case["model"]), Hardware.preset(case["hardware"])
    kw = dict(
        gpus=case["gpus"], seq_len=case["seq_len"], global_batch=case["global_batch"], mesh_order=case["mesh_order"]
    )
    placed = plan_on(cfg, from_hardware(hw), hw=hw, **kw)
    assert len(placed.candidates) == case["n_candidates"]
    _same(_top(placed), case["top"])
