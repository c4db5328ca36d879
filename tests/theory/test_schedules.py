"""Schedules as data: valid lists, no deadlock, and the simulator against the papers' closed forms."""

import subprocess
import sys

import pytest

from playbook.theory.pp.layer_partition import balanced_partition, equal_partition
from playbook.theory.pp.simulator import Costs, Deadlock, held_bytes, in_flight, simulate
from playbook.theory.pp.types import Action, Schedule
from playbook.theory.pp.schedules import SCHEDULES, VARIANTS, closed_form, make_schedule, validate, with_communication

GRID = [
    (name, p, m, v)
    for name in SCHEDULES + VARIANTS
    for p in (1, 2, 3, 4, 8)
    for m in (1, 2, 3, 4, 8, 12, 16, 32)
    for v in ((1, 2, 3, 4) if name == "interleaved" else (1,))
    if not (name == "interleaved" and m % p)
]


def _play_by_message_matching(s: Schedule) -> None:
    """An independent player: ranks take turns; a receive may pass only when its matching send
    (same direction, micro-batch, receiving stage) was issued earlier. Raises if stuck."""
    sent, pos = set(), [0] * s.p
    while any(pos[r] < len(s.actions[r]) for r in range(s.p)):
        moved = False
        for r in range(s.p):
            while pos[r] < len(s.actions[r]):
                a = s.actions[r][pos[r]]
                stage = s.stage(r, a.chunk)
                if a.kind.startswith("recv"):
                    if (a.kind[-1], a.mb, stage) not in sent:
                        break
                    assert s.place(stage - 1 if a.kind == "recv_F" else stage + 1)[0] == a.peer
                if a.kind.startswith("send"):
                    sent.add((a.kind[-1], a.mb, stage + 1 if a.kind == "send_F" else stage - 1))
                pos[r] += 1
                moved = True
        if not moved:
            raise AssertionError(
                f"{s.name} p={s.p} m={s.m} v={s.v} is stuck at {[s.actions[r][pos[r]] for r in range(s.p) if pos[r] < len(s.actions[r])]}"
            )


@pytest.mark.parametrize("name, p, m, v", GRID)
def test_every_schedule_is_valid_and_plays_without_deadlock(name, p, m, v):
    s = make_schedule(name, p, m, v)
    validate(s)
    _play_by_message_matching(s)
    n = p * v
    for r in range(p):
        kinds = [a.kind for a in s.compute(r)]
        assert kinds.count("F") == m * v and kinds.count("B") == m * v
        assert kinds.count("W") == (m if name.startswith("zb-h1") else 0)
        # one receive per F that is not on the first stage, one per B not on the last, none else
        recv_f = sum(1 for a in s.actions[r] if a.kind == "recv_F")
        assert recv_f == m * sum(1 for c in range(v) if s.stage(r, c) > 0)
        assert sum(1 for a in s.actions[r] if a.kind == "send_B") == recv_f
        assert sum(1 for a in s.actions[r] if a.kind == "recv_B") == m * sum(
            1 for c in range(v) if s.stage(r, c) < n - 1
        )


@pytest.mark.parametrize("name, p, m, v", [g for g in GRID if g[2] >= g[1] or not g[0].startswith("zb-h1")])
def test_simulated_bubble_equals_the_closed_form_for_uniform_costs(name, p, m, v):
    tl = simulate(make_schedule(name, p, m, v), Costs(1.0, 1.0, 1.0))
    want = closed_form(name, p, m, v)
    # derived by hand for the formulas: bubble/ideal x, idle/total x/(1+x)
    zb = (p - 1) / (3 * m)
    x = {"gpipe": (p - 1) / m, "1f1b": (p - 1) / m, "interleaved": (p - 1) / (v * m), "zb-h1": zb, "zb-h1-greedy": zb}[
        name
    ]
    assert want["bubble_over_ideal"] == pytest.approx(x)
    assert tl.bubble_over_ideal == pytest.approx(x, abs=1e-12)
    assert tl.bubble_over_total == pytest.approx(x / (1 + x), abs=1e-12)
    assert tl.peak_in_flight[0] == want["peak_in_flight_rank0"]


@pytest.mark.parametrize("p, m", [(2, 8), (4, 8), (4, 16), (8, 24), (8, 32)])
@pytest.mark.parametrize("f, b, w", [(1.0, 1.0, 0.5), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0)])
def test_zb_h1_bubble_with_unequal_costs_and_gpipe_time(p, m, f, b, w):
    # Qi et al. Table 2: ZB-H1 (p-1)(F+B-W) vs 1F1B (p-1)(F+B+W) per rank, with W <= F, B
    zb = simulate(make_schedule("zb-h1", p, m), Costs(f, b, w))
    one = simulate(make_schedule("1f1b", p, m), Costs(f, b, w))
    assert one.makespan == pytest.approx(m * (f + b + w) + (p - 1) * (f + b + w))
    assert sum(zb.idle()) / p == pytest.approx((p - 1) * (f + b - w), abs=1e-9)
    assert zb.makespan == pytest.approx(m * (f + b + w) + (p - 1) * (f + b - w))
    greedy = simulate(make_schedule("zb-h1-greedy", p, m), Costs(f, b, w))
    assert greedy.makespan <= zb.makespan + 1e-9  # built with unit costs: no better, here no worse


def test_zb_h1_is_the_papers_order():
    # Qi et al. 2023 §2.1, Figure 3, p = 4, m = 8: 1F1B's F and B, each B followed by a W, rank r's W
    # delayed by r micro-batches. By hand, rank 0 (no delay) and rank 3 (delay 3, no warm-up):
    s = make_schedule("zb-h1", 4, 8)
    assert s.table()[0] == "rank 0: F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7"
    assert s.table()[3] == "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7"
    # and the F/B order of every rank is 1F1B's
    one = make_schedule("1f1b", 4, 8)
    for r in range(4):
        assert [str(a) for a in s.compute(r) if a.kind != "W"] == [str(a) for a in one.compute(r)]


@pytest.mark.parametrize("p, m", [(2, 8), (4, 8), (4, 2), (4, 3), (8, 24), (8, 16)])
def test_zb_h1_holds_what_1f1b_holds_at_its_peak_greedy_holds_more(p, m):
    """Qi et al. §2.1: ZB-H1 keeps 1F1B's peak memory. Counted in activation sets (F done, W not
    yet): min(p, m) on every rank, 1F1B's rank 0; the greedy variant 2p − 1 − r for m >= 2p."""
    until_b, held = in_flight(make_schedule("zb-h1", p, m))
    one_b, one_held = in_flight(make_schedule("1f1b", p, m))
    assert until_b == one_b == [min(p - r, m) for r in range(p)]
    assert held == [min(p, m)] * p == [max(one_held)] * p
    g_until_b, g_held = in_flight(make_schedule("zb-h1-greedy", p, m))
    assert g_until_b == one_b
    if m >= 2 * p:
        assert g_held == [2 * p - 1 - r for r in range(p)]  # [7, 6, 5, 4] at p = 4
    # in bytes, sets of f of which w stay from B to W: rank r holds (p − r)·f + r·w at most, rank 0 as 1F1B
    f, w = 10, 3
    got = held_bytes(make_schedule("zb-h1", p, m), [[f]] * p, [[w]] * p)
    if m >= p:
        assert got == [(p - r) * f + r * w for r in range(p)]
        assert got[0] == held_bytes(make_schedule("1f1b", p, m), [[f]] * p)[0] == p * f


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 3), (8, 16)])
def test_peak_in_flight_1f1b_holds_p_gpipe_m(p, m):
    assert in_flight(make_schedule("gpipe", p, m))[0] == [m] * p
    assert in_flight(make_schedule("1f1b", p, m))[0] == [min(p - r, m) for r in range(p)]
    until_b, held = in_flight(make_schedule("zb-h1", p, m))
    assert until_b == [min(p - r, m) for r in range(p)]  # the same activation bound as 1F1B
    assert held == [min(p, m)] * p  # the W-only sets bring every rank to 1F1B's peak, no further


def test_interleaved_memory_matches_korthikanti():
    p, v, m = 4, 2, 16
    peak = in_flight(make_schedule("interleaved", p, m, v))[0][0]  # chunks of 1/v of a stage
    assert peak / v == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_held_bytes_plays_the_order():
    s = make_schedule("1f1b", 2, 4)
    assert held_bytes(s, [[10], [7]]) == [20, 7]
    assert held_bytes(make_schedule("gpipe", 2, 4), [[10], [7]]) == [40, 28]


def test_timing_with_costs_per_stage_and_comm():
    # two stages, one micro-batch, by hand: rank 0 F [0, 1], its send (issued at 1) costs it 0.1;
    # rank 1's receive (posted at 0) returns 0.5 after the send: F [1.5, 3.5], B (b + w: not split)
    # [3.5, 7.5], sends at 7.5; rank 0's receive (posted at 1.1) returns at 8.0: B [8.0, 11.0]
    tl = simulate(make_schedule("gpipe", 2, 1), Costs(f=[1.0, 2.0], b=[3.0, 4.0], w=0.0, comm=0.5, send=0.1))
    got = {(x.rank, x.kind): (x.start, x.end) for x in tl.slots}
    assert got == {(0, "F"): (0.0, 1.0), (1, "F"): (1.5, 3.5), (1, "B"): (3.5, 7.5), (0, "B"): (8.0, 11.0)}
    assert tl.makespan == 11.0
    assert tl.busy() == [4.0, 6.0]
    assert tl.bubble_over_ideal == pytest.approx((7 + 5) / 10)


def test_a_bad_order_deadlocks_and_is_named():
    # rank 0 waits for the gradient of micro-batch 0 before sending micro-batch 0's activation
    orders = [[("B", 0, 0), ("F", 0, 0)], [("F", 0, 0), ("B", 0, 0)]]
    with pytest.raises(ValueError, match="expected"):
        with_communication("bad", 2, 1, 1, False, orders)
    acts = (
        (Action("recv_B", 0, 0, 1), Action("F", 0), Action("send_F", 0, 0, 1), Action("B", 0)),
        (Action("recv_F", 0, 0, 0), Action("F", 0), Action("B", 0), Action("send_B", 0, 0, 0)),
    )
    with pytest.raises(Deadlock, match="rank 0 waits in recv_B0@1, rank 1 waits in recv_F0@0"):
        simulate(Schedule("bad", 2, 1, 1, False, acts))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: make_schedule("interleaved", 4, 6, 2), "m must be a multiple of p"),
        (lambda: make_schedule("interleaved", 2, 4, 0), "v (chunks per rank) must be an integer >= 1"),
        (lambda: make_schedule("1f1b", 2, 4, 2), "needs the 'interleaved' schedule"),
        (lambda: make_schedule("pipedream", 2, 4), "unknown schedule"),
        (lambda: make_schedule("zb-h1-greedy", 2, 4, 2), "needs the 'interleaved' schedule"),
        (lambda: make_schedule("1f1b", 0, 4), "p (pipeline stages) must be an integer >= 1"),
        (lambda: equal_partition(2, 5), "use stages <= 4"),
        (lambda: balanced_partition([1, 2], 3), "use 1 <= stages <= 2"),
    ],
)
def test_bad_input_is_refused_clearly(call, message):
    with pytest.raises(ValueError, match=None) as err:
        call()
    assert message in str(err.value)


def test_partitions():
    assert equal_partition(4, 2) == [(0, 3), (3, 6)]  # embedding + 2 blocks | 2 blocks + head
    assert equal_partition(2, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    # a heavy head moves blocks to the first stage
    assert balanced_partition([1, 2, 2, 2, 2, 5], 2) == [(0, 4), (4, 6)]
    w = [3, 1, 4, 1, 5, 9, 2, 6]
    best = min(max(sum(w[:i]), sum(w[i:j]), sum(w[j:])) for i in range(1, 7) for j in range(i + 1, 8))
    got = balanced_partition(w, 3)
    assert max(sum(w[a:b]) for a, b in got) == best


def test_theory_imports_no_torch():
    code = "import sys, playbook.theory.pp.schedules; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_chapter4_gpipe_and_1f1b_coincide_for_m_up_to_p(m):
    # chapter 4, question 2: same bubble, and rank 0 holds all m micro-batches in both
    gpipe = simulate(make_schedule("gpipe", p=4, m=m), Costs(f=1, b=1, w=1))
    one_f = simulate(make_schedule("1f1b", p=4, m=m), Costs(f=1, b=1, w=1))
    assert gpipe.bubble() == one_f.bubble()
    assert max(gpipe.peak_in_flight) == max(one_f.peak_in_flight) == gpipe.peak_in_flight[0] == m


def test_a_receive_posted_after_its_message_was_sent_still_pays_the_transfer():
    """gloo's point-to-point is a rendezvous: the payload moves once both sides are ready, so a late
    receiver waits ``comm`` after it posts, not after the send (issue 48's third near-miss)."""
    from playbook.theory.pp.simulator import Costs, simulate
    from playbook.theory.pp.types import Action, Schedule

    rank0 = (Action("F", 0), Action("send_F", 0, 0, 1), Action("B", 0))
    rank1 = (Action("W", 9), Action("recv_F", 0, 0, 0), Action("F", 0))  # busy 5 before it posts the receive
    s = Schedule("late receiver", 2, 1, 1, True, (rank0, rank1))
    tl = simulate(s, Costs(f=1, b=1, w=5, comm=0.25))
    f1 = next(x for x in tl.slots if x.rank == 1 and x.kind == "F")
    assert f1.start == 5 + 0.25  # posted at 5, long after the send at 1: still the transfer
    early = Schedule("early receiver", 2, 1, 1, True, (rank0, (Action("recv_F", 0, 0, 0), Action("F", 0))))
    f1 = next(x for x in simulate(early, Costs(f=1, b=1, comm=0.25)).slots if x.rank == 1 and x.kind == "F")
    assert f1.start == 1 + 0.25  # waiting from the start: the send at 1, then the transfer
