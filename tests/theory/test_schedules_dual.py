"""DualPipe (DeepSeek-V3 report 2024, §3.2.1) in the simulator: two directions, two copies of the
parameters, and its memory against the table of DeepSeek's DualPipe README at the same p."""

from __future__ import annotations

import pytest

from playbook.theory.pp.simulator import Costs, held_bytes, simulate
from playbook.theory.pp.schedules import make_schedule, with_communication
from playbook.theory.pp.v import v_orders
from playbook.theory.pp.dual import dualpipe_memory, make_dualpipe, readme_bubble, readme_rows


@pytest.mark.parametrize("p,m", [(2, 4), (2, 6), (4, 8), (4, 12), (4, 20), (8, 16), (8, 24)])
def test_dualpipe_plays_each_half_of_the_batch_in_its_own_direction(p, m):
    s = make_dualpipe(p, m)
    simulate(s)  # every receive has its send, no deadlock
    for r in range(p):
        ran = {(a.mb, a.chunk) for a in s.compute(r)}
        assert ran == {(i, 0) for i in range(m // 2)} | {(i, 1) for i in range(m // 2, m)}
        assert s.stage(r, 0) == r and s.stage(r, 1) == 2 * p - 1 - r  # direction 1 runs stage p − 1 − r
    # the two directions are two chains: nothing crosses from the end of one to the entry of the other
    for r in range(p):
        for a in s.actions[r]:
            if a.kind.startswith(("send", "recv")):
                here, there = s.stage(r, a.chunk), s.stage(a.peer, a.chunk)
                assert abs(here - there) == 1 and {here, there} != {p - 1, p}, (r, a)
    # mirror image: rank p − 1 − r runs rank r's order with the directions swapped
    for r in range(p):
        mirrored = [(a.kind, (a.mb + m // 2) % m, 1 - a.chunk) for a in s.compute(r)]
        assert mirrored == [(a.kind, a.mb, a.chunk) for a in s.compute(p - 1 - r)]


def test_dualpipe_memory_matches_the_readme_table_at_p4():
    """README (per device, PP stages): 1F1B 1× parameters and PP activations, DualPipe 2× and PP+1."""
    want = readme_rows(4)
    for m in (8, 12, 16, 20):
        got = dualpipe_memory(4, m)
        assert got["parameters"] == [want["dualpipe"]["parameters"]] * 4
        assert got["activations"] == [want["dualpipe"]["activations"]] * 4, (m, got)
    # the baseline rows of the same table, from our own 1F1B and ZB-H1 (rank 0 holds the most)
    for name in ("1f1b", "zb-h1"):
        one = make_schedule(name, 4, 8)
        assert max(held_bytes(one, [[1]] * 4)) == want[name]["activations"]


@pytest.mark.parametrize("p,m,words", [(3, 12, "p must be even"), (4, 6, "m >= 2p = 8"), (4, 9, "m even")])
def test_impossible_dualpipe_is_one_line(p, m, words):
    with pytest.raises(ValueError, match=words):
        make_dualpipe(p, m)


def test_chapter4s_dualpipe_sentence_idle_per_rank_at_p4():
    """Chapter 4 says: F = B = W = 1, the README's (PP/2 − 1)(F&B + B − 3W) with F&B = F + B gives
    2 idle stage-forwards per rank at p = 4, and the simulation, each overlapped pair one unit, finds 2."""
    f, b_full, w, pp = 1, 2, 1, 4
    assert (pp // 2 - 1) * ((f + b_full) + b_full - 3 * w) == 2
    tl = simulate(make_dualpipe(4, 8))
    assert sum(tl.idle()) / 4 == 2.0


def test_dualpipe_v_memory_matches_the_readme_row_for_the_same_stages():
    """README: DualPipe-V puts the same PP stages on PP/2 devices, 2 stages' parameters and PP + 1
    stages' activations per device; our DualPipe-V on 4 ranks has PP = 8 stages."""
    want = readme_rows(8)["dualpipe-v"]
    for m in (8, 16):
        s = make_schedule("dualpipe-v", 4, m, 2)
        assert max(held_bytes(s, [[1, 1]] * 4)) == want["activations"]
        assert all(len({s.stage(r, a.chunk) for a in s.compute(r)}) == want["parameters"] for r in range(4))


COSTS = [(1, 2, 1), (1, 1, 0.5), (2, 1, 1), (1, 0.5, 0.25), (1, 2, 2), (3, 2, 1)]


def test_the_readme_bubble_is_no_bound_away_from_equal_costs():
    """Away from F = B = W the paired order idles sometimes less and sometimes more than the README's
    formula (p = 4, m = 8): it is the equal-cost case, not a bound in either direction."""
    idle = {c: max(simulate(make_schedule("dualpipe-v", 4, 8, 2), Costs(*c)).idle()) for c in COSTS}
    readme = {c: readme_bubble(8, *c) for c in COSTS}
    assert any(idle[c] < readme[c] - 1e-9 for c in COSTS) and any(idle[c] > readme[c] + 1e-9 for c in COSTS)
    assert idle[(2, 1, 1)] == 12 and readme[(2, 1, 1)] == 9  # a forward-heavy stage: above it


@pytest.mark.parametrize("ranks, m", [(2, 8), (4, 8), (4, 16), (8, 32)])
def test_at_equal_costs_the_paired_order_idles_the_readmes_bubble_twice_zb_vs(ranks, m):
    unit = 0.5  # a chunk: half a stage
    timeline = simulate(make_schedule("dualpipe-v", ranks, m, 2), Costs(f=unit, b=unit, w=unit))
    fill = (ranks - 1) * unit  # the bottom of the V waits for ranks − 1 forwards
    assert timeline.idle() == [2 * fill] * ranks == [readme_bubble(2 * ranks, unit, unit, unit)] * ranks
    first = min(s.start for s in timeline.slots if s.rank == ranks - 1)
    assert first == fill
    zb_v = simulate(make_schedule("zb-v", ranks, m, 2), Costs(f=unit, b=unit, w=unit))
    assert zb_v.idle() == [fill] * ranks  # ZB-V: the fill alone
    dual = simulate(make_dualpipe(2 * ranks, 2 * m), Costs(f=1, b=1, w=1))  # the bidirectional one
    assert max(dual.idle()) == readme_bubble(2 * ranks, 1, 1, 1)


def test_a_pair_is_one_unit_both_receives_before_it_both_sends_after_it():
    s = make_schedule("dualpipe-v", 4, 8, 2)
    acts = s.actions[1]
    k = next(
        i for i, a in enumerate(acts) if a.kind == "F" and acts[i + 1].kind == "B" and a.chunk != acts[i + 1].chunk
    )
    f, b = acts[k], acts[k + 1]
    assert {(x.kind, x.mb, x.chunk) for x in acts[k - 2 : k]} == {("recv_F", f.mb, f.chunk), ("recv_B", b.mb, b.chunk)}
    after = [x.kind for x in acts[k + 2 : k + 5]]
    assert after == ["W", "send_F", "send_B"]  # the B's W, then both results leave
    unpaired = with_communication("x", 4, 8, 2, True, v_orders("dualpipe-v", 4, 8), "v")  # no pairs: half the idle
    assert (
        max(simulate(unpaired, Costs(0.5, 0.5, 0.5)).idle()) == 1.5 == max(simulate(s, Costs(0.5, 0.5, 0.5)).idle()) / 2
    )
