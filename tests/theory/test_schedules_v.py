"""The V-shaped schedules as data: placement, orders against PyTorch's own, memory and bubble."""

import pytest

from playbook.parallel.pp.native import native_orders
from playbook.theory.pp.simulator import Costs, in_flight, simulate
from playbook.theory.pp.schedules import check_pipeline, closed_form, make_schedule, validate
from playbook.theory.pp.v import v_orders, v_pairs

V_GRID = [
    (name, p, m)
    for name in ("zb-v", "dualpipe-v")
    for p in (1, 2, 3, 4, 8)
    for m in (1, 2, 3, 4, 5, 7, 8, 12, 16, 32)
    if not (name == "dualpipe-v" and m < 2 * p)
]


def test_v_placement_rank0_holds_the_first_and_the_last_stage():
    s = make_schedule("zb-v", 4, 8, 2)
    assert [[s.stage(r, c) for c in (0, 1)] for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert all(s.place(s.stage(r, c)) == (r, c) for r in range(4) for c in (0, 1))
    # the turn of the V stays on rank p − 1: its chunk 0 sends to itself, and gets the gradient from itself
    peers = {(a.kind, a.chunk): a.peer for a in s.actions[3] if a.kind.startswith(("send", "recv"))}
    assert peers[("send_F", 0)] == peers[("recv_F", 1)] == peers[("recv_B", 0)] == peers[("send_B", 1)] == 3
    assert {a.peer for a in s.actions[0] if a.kind.startswith(("send", "recv"))} == {1}


@pytest.mark.parametrize("name, p, m", V_GRID)
def test_every_v_schedule_is_valid_and_plays(name, p, m):
    s = make_schedule(name, p, m, 2)  # simulate() inside raises on a deadlock or a lost message
    validate(s)
    assert s.split_backward and s.placement == "v"
    for r in range(p):  # m messages into each stage but the first, m out of each but the last
        assert sum(a.kind == "recv_F" for a in s.actions[r]) == m * (2 - (r == 0))
        assert sum(a.kind == "recv_B" for a in s.actions[r]) == m * (2 - (r == 0))


@pytest.mark.parametrize("name", ["zb-v", "dualpipe-v"])
@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 8, 12, 16])
def test_our_v_orders_are_pytorchs(name, p, m):
    """torch 2.13's ScheduleZBVZeroBubble / ScheduleDualPipeV, read per rank (its I is our B, its full
    backward our B then W, an overlapped F&B its two parts): the same compute order on every rank."""
    if name == "dualpipe-v" and m < 2 * p:
        with pytest.raises(ValueError, match="m >= 2p"):
            make_schedule(name, p, m, 2)
        return
    assert v_orders(name, p, m) == native_orders(name, p, m)


def test_zb_v_by_hand_p2_m4():
    # Qi et al. 2023 §6, by hand: rank 0 warms up with 2(p − r) − 1 = 3 forwards of chunk 0, then F B W
    # on chunk 1; rank 1 with 1, then (F chunk 1, F chunk 0) once. Cool-down of rank 1: r = 1 pair of
    # B with W held back (B2, B3.1), p − r = 1 pair B3 W2 (chunk 0's oldest), then chunk 1's W, chunk 0's
    s = make_schedule("zb-v", 2, 4, 2)
    assert s.table() == [
        "rank 0: F0 F1 F2 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 F3 B0 W0 F2.1 B2.1 W2.1 B1 W1 F3.1 B3.1 W3.1 B2 W2 B3 W3",
        "rank 1: F0 F0.1 F1 F1.1 B0.1 W0.1 F2 B0 W0 F2.1 B1.1 W1.1 F3 B1 W1 F3.1 B2.1 W2.1 B2 B3.1 B3 W2 W3.1 W3",
    ]


@pytest.mark.parametrize("p, m", [(2, 4), (2, 8), (4, 8), (4, 16), (8, 16), (8, 32)])
def test_v_memory_zb_v_holds_p_stages_dualpipe_v_one_chunk_more(p, m):
    """Counted in chunk sets (a chunk is half a stage): ZB-V holds 2p on every rank, p whole stages,
    1F1B's rank 0 (Qi et al. §6); DualPipe-V 2p + 1, the "PP + 1" of DualPipe's README for PP = 2p stages."""
    assert in_flight(make_schedule("zb-v", p, m, 2))[1] == [2 * p] * p
    assert in_flight(make_schedule("dualpipe-v", p, m, 2))[1] == [2 * p + 1] * p
    assert max(in_flight(make_schedule("1f1b", p, m))[1]) == p  # in stages: the same p


@pytest.mark.parametrize("p, m", [(2, 8), (4, 8), (4, 16), (8, 32)])
def test_v_bubble_with_equal_costs_zb_v_half_of_zb_h1_and_dualpipe_v_as_much(p, m):
    """With a chunk costing half a stage (f = b = w = 1/2 against ZB-H1's 1), every rank of ZB-V idles
    (p − 1)/2, half of ZB-H1's (p − 1)(T_F + T_B − T_W) = p − 1; DualPipe-V, its overlapped pairs one
    unit each, idles p − 1, as ZB-H1 does (Qi et al. 2023 §6; DeepSeek's DualPipe README)."""
    zb_h1 = simulate(make_schedule("zb-h1", p, m), Costs(1, 1, 1))
    assert zb_h1.idle() == pytest.approx([p - 1] * p)
    for name, idle in (("zb-v", (p - 1) / 2), ("dualpipe-v", p - 1)):
        tl = simulate(make_schedule(name, p, m, 2), Costs(0.5, 0.5, 0.5))
        assert tl.idle() == pytest.approx([idle] * p), name
        assert tl.makespan == pytest.approx(3 * m + idle)


@pytest.mark.parametrize("p, m", [(2, 4), (2, 8), (3, 6), (4, 8), (4, 16)])
def test_our_overlapped_pairs_are_torchs_overlap_f_b(p, m):
    from playbook.parallel.pp.native import native_pairs

    assert v_pairs("dualpipe-v", p, m) == native_pairs("dualpipe-v", p, m)
    assert v_pairs("zb-v", p, m) == [[]] * p


@pytest.mark.parametrize(
    "args, message",
    [
        (("zb-v", 4, 8, 1), "use v=2"),
        (("dualpipe-v", 4, 8, 3), "use v=2"),
        (("dualpipe-v", 4, 6, 2), "m >= 2p = 8"),
    ],
)
def test_v_bad_input_is_refused_clearly(args, message):
    with pytest.raises(ValueError) as err:
        make_schedule(*args)
    assert message in str(err.value)
    with pytest.raises(ValueError, match="use p·v <= 4"):
        check_pipeline(4, 8, 2, name="zb-v", n_layers=2)
    with pytest.raises(ValueError, match="no closed form"):
        closed_form("zb-v", 4, 8, 2)
