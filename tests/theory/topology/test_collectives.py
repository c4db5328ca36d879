"""Hierarchical collectives against closed forms derived here by hand, on four shipped topologies.

A ring all-reduce of S bytes over k GPUs of one level sends 2S(k-1)/k per GPU in 2(k-1) steps; the
hierarchical one (reduce-scatter inside, all-reduce across on the shard, all-gather back) does that
at each level on the shard the levels inside left: S, S/k1, S/(k1·k2), ... An oversubscribed level
gives each GPU bandwidth / ratio."""

import math

import pytest

from playbook.theory.cost.comm import collective_seconds
from playbook.theory.topology import flat, group_levels, load_topology, seconds, storage_bandwidth
from playbook.theory.topology.collectives import effective_link, point_to_point, price, tree_all_reduce

S = 1e9


def ring_ar(size, k, bw, lat):
    return 2 * size * (k - 1) / k / bw + 2 * (k - 1) * lat


def test_rail_16_gpus_two_nodes():
    t = load_topology("dgx-h100-rail")
    # 8 on NVLink (450 GB/s, 3 us), 2 nodes on one rail leaf (50 GB/s, 10 us), on S/8
    hand = ring_ar(S, 8, 450e9, 3e-6) + ring_ar(S / 8, 2, 50e9, 1e-5)
    assert seconds(t, "all_reduce", S, 16) == pytest.approx(hand, rel=1e-12)
    assert seconds(t, "all_gather", S, 16) == pytest.approx(hand / 2, rel=1e-12)
    # a flat ring of 16 at the NIC: 2·S·15/16 / 50 GB/s + 30 steps of 10 us
    assert flat("all_reduce", group_levels(t, 16)).seconds(S) == pytest.approx(2 * S * 15 / 16 / 50e9 + 30e-5)
    assert seconds(t, "all_reduce", S, 16) < flat("all_reduce", group_levels(t, 16)).seconds(S) / 4


def test_ethernet_64_gpus_cross_the_2to1_spine():
    t = load_topology("h100-ethernet-2to1")
    # 8 per node, 4 nodes per leaf, 2 leaves: the spine at 50/2 = 25 GB/s per GPU
    hand = ring_ar(S, 8, 450e9, 3e-6) + ring_ar(S / 8, 4, 50e9, 1.2e-5) + ring_ar(S / 32, 2, 25e9, 1.5e-5)
    assert seconds(t, "all_reduce", S, 64) == pytest.approx(hand, rel=1e-12)
    rail = load_topology("dgx-h100-rail")  # the same 64 GPUs on the rail fabric stay on one leaf
    assert seconds(rail, "all_reduce", S, 64) == pytest.approx(
        ring_ar(S, 8, 450e9, 3e-6) + ring_ar(S / 8, 8, 50e9, 1e-5), rel=1e-12
    )


def test_pcie_workstation_8_gpus_three_levels():
    t = load_topology("pcie-workstation")
    # 2 per switch (25 GB/s), 2 switches per socket (25/2 GB/s: one x16 uplink for two GPUs), 2 sockets (12 GB/s)
    hand = ring_ar(S, 2, 25e9, 1e-5) + ring_ar(S / 2, 2, 12.5e9, 1.2e-5) + ring_ar(S / 4, 2, 12e9, 2e-5)
    assert seconds(t, "all_reduce", S, 8) == pytest.approx(hand, rel=1e-12)


def test_nvl72_keeps_72_gpus_on_nvlink():
    t = load_topology("gb200-nvl72")
    hand = ring_ar(S, 72, 900e9, 3e-6) + ring_ar(S / 72, 2, 50e9, 1e-5)
    assert seconds(t, "all_reduce", S, 144) == pytest.approx(hand, rel=1e-12)


def test_tree_all_reduce_pays_log_steps():
    nvlink = load_topology("dgx-h100-rail").levels[0]
    assert tree_all_reduce(8, nvlink).seconds(S) == pytest.approx(2 * 3 * 3e-6 + 2 * S / 450e9)
    small = 1e3  # latency-bound: the tree's 6 steps beat the ring's 14
    assert tree_all_reduce(8, nvlink).seconds(small) < ring_ar(small, 8, 450e9, 3e-6)


def test_all_to_all_across_an_oversubscribed_spine():
    eth, rail = load_topology("h100-ethernet-2to1"), load_topology("dgx-h100-rail")
    # 64 GPUs: 7 peers on NVLink, 24 on the leaf, 32 across the spine at 25 GB/s: the spine's share bounds it
    beta = max(7 / 64 / 450e9, 24 / 64 / 50e9, 32 / 64 / 25e9)
    alpha = 7 * 3e-6 + 24 * 1.2e-5 + 32 * 1.5e-5
    assert seconds(eth, "all_to_all", S, 64) == pytest.approx(alpha + beta * S, rel=1e-12)
    on_rail = 7 * 3e-6 + 56 * 1e-5 + S * 56 / 64 / 50e9
    assert seconds(rail, "all_to_all", S, 64) == pytest.approx(on_rail, rel=1e-12)


def test_point_to_point_by_path():
    rail = load_topology("dgx-h100-rail")
    assert point_to_point(rail, 0, 7).seconds(S) == pytest.approx(3e-6 + S / 450e9)
    assert point_to_point(rail, 0, 8).seconds(S) == pytest.approx(1e-5 + S / 50e9)  # same rail: one leaf hop
    assert point_to_point(rail, 0, 9).seconds(S) == pytest.approx(1e-5 + 3e-6 + S / 50e9)  # PXN: NVLink first
    assert point_to_point(rail, 0, 256).seconds(S) == pytest.approx(1.2e-5 + S / 50e9)
    eth = load_topology("h100-ethernet-2to1")
    assert point_to_point(eth, 0, 32).seconds(S) == pytest.approx(1.5e-5 + S / 25e9)


@pytest.mark.parametrize("name", ["dgx-h100-rail", "h100-ethernet-2to1", "pcie-workstation", "gb200-nvl72"])
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_one_alpha_beta_pair_reproduces_the_price(name, op):
    t = load_topology(name)
    n = min(t.gpus, 16 if t.node_gpus < 16 else 144)
    cost = price(t, op, n)
    bw, lat = effective_link(cost, op, n)
    for size in (0.0, 1e3, 1e6, 1e9):
        assert collective_seconds(op, size, n, bw, lat) == pytest.approx(cost.seconds(size), rel=1e-12)


def test_storage_per_topology():
    assert storage_bandwidth(load_topology("pcie-workstation")) == 6.9e9
    assert all(storage_bandwidth(load_topology(n)) > 0 for n in ("dgx-h100-rail", "h100-ethernet-2to1", "gb200-nvl72"))


def test_group_too_large_is_one_line():
    with pytest.raises(ValueError, match="holds 8 GPUs"):
        seconds(load_topology("pcie-workstation"), "all_reduce", S, 16)
    assert math.isfinite(seconds(load_topology("pcie-workstation"), "all_reduce", S, 8))


def test_the_storage_level_feeds_the_placed_profile():
    from playbook.hardware import Hardware
    from playbook.theory.plan.placed import on_topology
    from playbook.theory.topology import from_hardware

    ws = load_topology("pcie-workstation")
    assert on_topology(ws).storage_bandwidth == storage_bandwidth(ws) == 6.9e9
    h100 = Hardware.preset("h100-sxm")
    assert storage_bandwidth(from_hardware(h100)) == h100.storage_bandwidth
    assert on_topology(load_topology("dgx-h100-rail")).storage_bandwidth == 25e9 != h100.storage_bandwidth
