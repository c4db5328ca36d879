"""The claims chapter 8 §2 ("Past the node", "A workstation") and chapter 8b ("On a topology") make in
prose, recomputed: the cells print the numbers, these hold the sentences around them."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from playbook import Hardware, ModelConfig
from playbook.theory.plan import best_by_tp, cost_on, ranking
from playbook.theory.topology import from_hardware, load_topology

REPO = Path(__file__).resolve().parents[2]
LLAMA70, LLAMA8 = ModelConfig.preset("llama-3.1-70b"), ModelConfig.preset("llama-3.1-8b")


def prose(chapter: str, cell: str) -> str:
    nb = json.loads((REPO / "notebooks" / chapter).read_text())
    return next("".join(c["source"]) for c in nb["cells"] if c.get("id") == cell)


@cache
def winners():
    job = dict(gpus=256, seq_len=8192, global_batch=512, top=1)
    return {n: ranking(LLAMA70, load_topology(n), **job)[0] for n in ("dgx-h100-rail", "h100-ethernet-2to1")}


def test_leaf_sizes_and_the_shard_that_crosses():
    rail, spine = load_topology("dgx-h100-rail"), load_topology("h100-ethernet-2to1")
    assert "one leaf (32 GPUs on the Ethernet fabric, 256 on a rail unit)" in prose("08_hybrid_mesh.ipynb", "topo-4")
    assert spine.capacity(1) == 32 and rail.capacity(1) == 256
    assert "on the eighth each GPU now holds" in prose("08_hybrid_mesh.ipynb", "topo-2") and rail.node_gpus == 8
    assert spine.level("spine").effective == spine.level("spine").bandwidth / 2  # "each gets half its NIC"


def test_why_the_winners_differ():
    w = winners()
    rail, spine = w["dgx-h100-rail"], w["h100-ethernet-2to1"]
    assert "keeps tp small and adds cp" in prose("08_hybrid_mesh.ipynb", "topo-7")
    r, s = rail["candidate"].layout, spine["candidate"].layout
    assert r.tp < s.tp and r.cp > 1 and s.cp == 1 and s.tp == 4  # "with tp4 on NVLink"
    mine = {
        n: cost_on(LLAMA70, load_topology(n), r, seq_len=8192, mesh_order=rail["mesh_order"], rank=False)
        for n in ("dgx-h100-rail", "h100-ethernet-2to1")
    }
    on_rail, on_spine = mine["dgx-h100-rail"]["step"]["axes"]["dp"], mine["h100-ethernet-2to1"]["step"]["axes"]["dp"]
    assert mine["dgx-h100-rail"]["placement"]["dp"]["outermost"] == "rail-leaf"  # "stay on one non-blocking leaf"
    assert on_rail["exposed"] < 0.01 * on_rail["comm"]  # "and hide behind the compute"
    assert mine["h100-ethernet-2to1"]["placement"]["dp"]["outermost"] == "spine"
    assert on_spine["exposed"] > on_rail["exposed"]  # "no longer fits under the compute"
    assert mine["h100-ethernet-2to1"]["step"]["total"] > spine["step_s"]  # "costs more than the larger tp's"
    assert abs(rail["step_s"] - spine["step_s"]) / spine["step_s"] < 0.02  # "the margins are small"


def test_tp_over_pcie_stops_paying_earlier():
    job = dict(gpus=8, seq_len=4096, global_batch=32)
    pc = best_by_tp(LLAMA8, load_topology("pcie-workstation"), **job)
    nv = best_by_tp(LLAMA8, load_topology("dgx-h100-rail"), **job)
    text = prose("08_hybrid_mesh.ipynb", "topo-12")
    assert (
        "under one switch, still pays" in text
        and pc[2]["step_s"] < pc[1]["step_s"]
        and pc[2]["tp_level"] == "pcie-switch"
    )
    assert pc[4]["tp_level"] == "socket" and pc[8]["tp_level"] == "upi"
    share = [pc[t]["tp_exposed_s"] / pc[t]["step_s"] for t in (2, 4, 8)]
    assert share == sorted(share)  # "its exposed share of the step grows each time"
    assert nv[8]["tp_exposed_s"] / nv[8]["step_s"] < 0.1  # "on NVLink even tp8 stays a sliver"
    assert "48 GB L40S" in prose("08_hybrid_mesh.ipynb", "topo-9") and Hardware.preset("l40s").memory_bytes == 48e9


def test_chapter_8b_the_fabrics_against_the_profile():
    job = dict(gpus=64, seq_len=8192, global_batch=512, activations="ours", schedules=("1f1b",), overlap="dp", top=1)
    from playbook.theory.topology import ORDERS

    on = {
        t.name: ranking(LLAMA70, t, orders=ORDERS[:2], **job)[0]["step_s"]
        for t in (
            from_hardware(Hardware.preset("h100-sxm")),
            load_topology("dgx-h100-rail"),
            load_topology("h100-ethernet-2to1"),
        )
    }
    assert "get cheaper than the profile says, and the spine's 2:1 takes some of that back" in prose(
        "08b_planning.ipynb", "topo-2"
    )
    assert on["dgx-h100-rail"] < on["h100-sxm"] and on["dgx-h100-rail"] <= on["h100-ethernet-2to1"] < on["h100-sxm"]


@pytest.mark.parametrize("cell", ["topo-0", "topo-2", "topo-4", "topo-7", "topo-9", "topo-12"])
def test_no_result_numbers_typed_into_chapter_8s_topology_prose(cell):
    """Inputs only (model sizes, GPU counts, the fabric's ratio); every result is printed by a cell."""
    import re

    allowed = {"3", "256", "2:1", "70B", "8B", "8,192", "512", "4,096", "32", "48", "8", "3.1", "2"}
    numbers = re.findall(r"(?<![A-Za-z\d.])\d[\d,.:]*[BK]?", prose("08_hybrid_mesh.ipynb", cell))  # not H100, tp4, x16
    found = {n.rstrip(",.:") for n in numbers} - allowed
    assert not found, found
