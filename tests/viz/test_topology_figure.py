"""Chapter 8's topology figure draws each axis's group where placement puts it."""

from playbook.theory.topology import load_topology
from playbook.viz.topology import group_ranks, placement_rows, topology_figure


def test_groups_and_their_bars():
    deg = dict(dp=64, tp=2, cp=2)
    assert group_ranks("dp", "tp-cp-dp-pp", deg | dict(pp=1, ep=1))[:4] == [0, 2, 4, 6]  # cp and dp at stride 2
    eth = load_topology("h100-ethernet-2to1")
    fig = topology_figure(eth, deg, "tp-cp-dp-pp", gpus=256, title="t")
    bars = {t.legendgroup: t.y[0] for t in fig.data if t.mode == "lines+markers"}
    assert round(bars["dp"] - 0.3) == 3 and round(bars["tp"] + 0.3) == 1  # dp's bar on the spine, tp's on NVLink
    units = [s for s in fig.layout.shapes if s.y0 == 0.6]
    assert len(units) == 32  # 256 GPUs in NVLink domains of 8
    rows = {r["axis"]: r for r in placement_rows(eth, deg, "tp-cp-dp-pp")}
    assert rows["dp"]["outermost level"] == "spine" and rows["dp"]["ranks"] == 128
