"""Issue 29: the book's and the dashboards' schedule lists offer the V schedules (ZB-V, DualPipe-V):
bubble against m, and the static form of the pipeline explorer."""

from __future__ import annotations

from playbook.theory.pp.simulator import simulate
from playbook.theory.pp.schedules import make_schedule
from playbook.viz.pp import bubble_vs_m


def test_bubble_vs_m_shows_the_v_schedules_as_simulated_markers():
    fig = bubble_vs_m(4, [1, 2, 4, 8, 16], v=2)
    traces = {t.name: t for t in fig.data}
    assert {"zb-v (simulated)", "dualpipe-v (simulated)"} <= set(traces)
    assert not any(n.startswith(("zb-v", "dualpipe-v")) and "closed form" in n for n in traces)  # none exists
    assert list(traces["zb-v (simulated)"].x) == [1, 2, 4, 8, 16]
    assert list(traces["dualpipe-v (simulated)"].x) == [8, 16]  # m >= 2p only
    want = simulate(make_schedule("dualpipe-v", 4, 16, 2)).bubble_over_ideal
    assert traces["dualpipe-v (simulated)"].y[-1] == want


def test_the_static_pipeline_explorer_offers_the_v_schedules_and_says_what_it_refuses():
    from playbook.book.grid import META_KEY, SEP
    from playbook.book.static import static_pipeline

    fig = static_pipeline(p=4, m=8, schedule="1f1b")
    controls = {c["name"]: c["labels"] for c in fig.layout.meta[META_KEY]["controls"]}
    assert {"zb-v", "dualpipe-v"} <= set(controls["schedule"])
    frames = {f.name: f for f in fig.frames}
    v_frame = frames[SEP.join(["zb-v", "4", "8"])]
    assert "zb-v: p=4, m=8, v=2" in v_frame.layout.title.text
    refused = frames[SEP.join(["dualpipe-v", "4", "4"])]
    assert "m >= 2p" in refused.layout.title.text, refused.layout.title.text
