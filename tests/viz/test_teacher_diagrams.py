"""Teaching diagrams and the step-by-step ring all-reduce behind them."""

import pytest

from playbook.theory.cost.ring import ring_allreduce_cost, ring_allreduce_steps
from playbook.viz.diagrams import ring_allreduce_figure


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_ring_allreduce_sums_every_chunk_everywhere(n):
    steps = ring_allreduce_steps(n)
    assert len(steps) == 1 + 2 * (n - 1)
    everyone = frozenset(range(n))
    # after the reduce-scatter phase rank r owns the complete chunk (r + 1) mod n, and only that one
    after_rs = steps[n - 1]["held"]
    for r in range(n):
        complete = [c for c in range(n) if after_rs[r][c] == everyone]
        assert complete == [(r + 1) % n]
    assert all(chunk == everyone for row in steps[-1]["held"] for chunk in row)
    # each step every rank sends exactly one chunk (S/n bytes) to its right neighbour
    for st in steps[1:]:
        assert sorted(src for src, _, _ in st["sends"]) == list(range(n))
        assert all(dst == (src + 1) % n for src, dst, _ in st["sends"])


def test_ring_allreduce_cost_by_hand():
    cost = ring_allreduce_cost(1_000_000, 4, bandwidth=1e9, latency=1e-5)
    assert cost["steps"] == 6
    assert cost["sent_bytes"] == pytest.approx(1_500_000)  # 2 · 3/4 · S
    assert cost["seconds"] == pytest.approx(6e-5 + 1.5e-3)


def test_ring_refuses_one_rank():
    with pytest.raises(ValueError, match="n >= 2"):
        ring_allreduce_steps(1)


def test_ring_figure_shows_every_chunk_and_ends_complete():
    n = 4
    fig = ring_allreduce_figure(ring_allreduce_steps(n))
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(rects) == (2 * n - 1) * n * n
    last = [s for s in rects if s.name.startswith(f"step {2 * (n - 1)} ")]
    assert len(last) == n * n and all(s.name.endswith(f"{n}/{n}") for s in last)
    assert len({s.fillcolor for s in last}) == 1
    first = [s for s in rects if s.name.startswith("step 0 ")]
    assert all(s.name.endswith(f"1/{n}") for s in first)
    outlined = [s for s in rects if s.line.width == 3]
    assert len(outlined) == 2 * (n - 1) * n  # one received chunk per rank per step
    labels = [a.text for a in fig.layout.annotations]
    assert "<b>RS 1</b>" in labels and f"<b>AG {2 * (n - 1)}</b>" in labels


def test_tp_layout_places_f_and_g_around_each_split_region():
    from playbook.viz.diagrams import tp_block_layout

    for sp, (enter, leave) in ((False, ("f", "g")), (True, ("g", "ḡ"))):
        ops = tp_block_layout(sequence_parallel=sp)
        labels = [o["label"] for o in ops if o["kind"] == "comm"]
        assert labels == [enter, leave, enter, leave]  # two regions per layer: attention, MLP
        for i, o in enumerate(ops):  # every split region sits between an enter and a leave
            if o["kind"] == "compute" and o["region"] == "split by heads / channels":
                assert ops[i - 1]["label"] == enter and ops[i + 1]["label"] == leave
    tp = tp_block_layout(sequence_parallel=False)
    assert (tp[1]["forward"], tp[1]["backward"]) == ("identity", "all-reduce")  # Megatron's f
    sp = tp_block_layout(sequence_parallel=True)
    assert (sp[3]["forward"], sp[3]["backward"]) == ("reduce-scatter (s)", "all-gather (s)")
    assert {o["region"] for o in sp if o["label"] == "RMSNorm"} == {"split by sequence"}


def test_tp_block_diagram_draws_both_rows():
    from playbook.viz.diagrams import tp_block_diagram

    fig = tp_block_diagram()
    circles = [s for s in fig.layout.shapes if s.type == "circle"]
    assert len(circles) == 8  # 4 operators per layer, TP and SP rows
    names = [s.name for s in circles]
    assert sum("ḡ" in n for n in names) == 2
    norms = [s for s in fig.layout.shapes if s.name and s.name.endswith("RMSNorm")]
    assert {s.fillcolor for s in norms} == {"#d9d9d9", "#a1d99b"}


def test_ulysses_moves_all_but_one_nth_of_each_rank():
    from playbook.viz.diagrams import ulysses_figure, ulysses_owners

    n, heads = 4, 8
    own = ulysses_owners(n, heads)
    for r in range(n):
        before = {(i, j) for i in range(n) for j in range(heads) if own["before"][i][j] == r}
        after = {(i, j) for i in range(n) for j in range(heads) if own["after"][i][j] == r}
        assert before == {(r, j) for j in range(heads)}  # chunk r, every head
        assert after == {(i, j) for i in range(n) for j in (2 * r, 2 * r + 1)}  # every chunk, heads 2r, 2r+1
        assert len(before & after) == heads // n  # keeps 1/n, sends (n−1)/n
    fig = ulysses_figure(n, heads)
    assert len(fig.layout.shapes) == 2 * n * heads
    with pytest.raises(ValueError, match="divisible by n"):
        ulysses_owners(3, 8)
