"""The planner's figures and what-if dashboard: the bars add up to each candidate's step time part by
part, rejections are grouped with a reason, and every dashboard control changes what is drawn (or
says in one red line why it cannot)."""

from __future__ import annotations

import pytest

from playbook.viz.plan import breakdown, candidate_rows, rejected_rows, replay_rows, step_breakdown
from playbook.viz.plan_dashboard import cached_plan, plan_dashboard
from playbook.viz.widgets import STALE

PLAN = ("llama-3.1-70b", "h100-sxm", 64, 8192, 512)


@pytest.fixture(scope="module")
def planned():
    return cached_plan(*PLAN)


def test_the_bars_are_the_planners_parts_in_rank_order(planned):
    fig = step_breakdown(planned, top=5)
    top = planned.candidates[:5]
    whole = [t for t in fig.data if t.xaxis in (None, "x")]  # the left panel: the whole step
    beyond = [t for t in fig.data if t.xaxis == "x2"]  # the right: the same parts but compute
    assert [t.name for t in beyond] == [t.name for t in whole][1:]
    assert all(list(b.x) == list(w.x) for b, w in zip(beyond, whole[1:]))
    names = [t.name for t in whole]
    assert names[0] == "compute" and names[-1] == "bubble"
    assert all(n.startswith("exposed ") for n in names[1:-1])
    assert list(fig.data[0].y) == [f"#{i + 1} {c.layout}" for i, c in enumerate(top)]
    for i, c in enumerate(top):
        parts = {t.name: t.x[i] for t in whole}
        assert parts["compute"] == c.cost.compute and parts["bubble"] == c.cost.bubble
        for axis, (comm, exposed) in c.cost.axes.items():
            assert parts[f"exposed {axis}"] == exposed  # the exposed part, not the whole communication
            trace = next(t for t in whole if t.name == f"exposed {axis}")
            assert trace.customdata[i] == comm  # the whole of it on hover
        assert sum(parts.values()) == pytest.approx(c.cost.total, rel=1e-12)
    totals = [sum(t.x[i] for t in whole) for i in range(5)]
    assert totals == sorted(totals)  # fastest on top
    labels = [a.text.split(" s,")[0].strip() for a in fig.layout.annotations if " s, MFU" in a.text]
    assert labels == [f"{c.cost.total:.3g}" for c in top]


def test_breakdown_lists_only_the_axes_a_layout_has(planned):
    no_pipeline = next(c for c in planned.candidates if c.layout.pp == 1)
    assert "exposed pp" not in breakdown(no_pipeline) and breakdown(no_pipeline)["bubble"] == 0
    no_tp = next(c for c in planned.candidates if c.layout.tp == 1)
    assert "exposed tp" not in breakdown(no_tp) and breakdown(no_tp)["compute"] > 0


def test_tables_rank_candidates_and_group_every_rejection_with_a_reason(planned):
    rows = candidate_rows(planned, top=4)
    assert [r["layout"] for r in rows] == [f"#{i + 1} {c.layout}" for i, c in enumerate(planned.candidates[:4])]
    steps = [r["step (s)"] for r in rows]
    assert steps == sorted(steps)
    rejected = rejected_rows(planned)
    assert sum(r["layouts"] for r in rejected) == sum(n for n, _ in planned.rejected.values()) + planned.dominated
    counts = [r["layouts"] for r in rejected if r["kind"] != "dominated"]
    assert counts == sorted(counts, reverse=True)
    for r in rejected:
        assert r["reason"] != r["kind"] and len(r["reason"].split()) >= 5  # a sentence, not the raw key


def data(box) -> str:
    fig_t, fig_b = box.figures["table"], box.figures["breakdown"]
    return repr([list(c) for c in fig_t.data[0].cells.values]) + repr([(t.name, list(t.x)) for t in fig_b.data])


@pytest.fixture
def box():
    return plan_dashboard(model="llama-3.1-8b", gpus=64, seq_len=8192, global_batch=512, top=4)


@pytest.mark.parametrize(
    "control, value",
    [
        ("model", "llama-3.1-70b"),
        ("hardware", "h200"),
        ("gpus", 128),
        ("seq_len", 4096),
        ("global_batch", 256),
        ("top", 2),
    ],
)
def test_every_control_changes_what_is_drawn(box, control, value):
    before, summary = data(box), box.message.value
    box.controls[control].value = value
    assert data(box) != before
    assert "Cannot plan" not in box.message.value
    if control == "top":
        assert len(box.figures["table"].data[0].cells.values[0]) == 2 and len(box.figures["breakdown"].data[0].y) == 2
    else:
        assert box.message.value != summary  # the summary names the new setting


def test_a_setting_the_planner_refuses_is_one_red_line_and_the_last_plan_stays(box):
    box.controls["gpus"].value = 8
    before = data(box)
    box.controls["model"].value = "llama-3.1-405b"  # 405B on 8 GPUs: nothing fits
    assert "Cannot plan:" in box.message.value and "nothing fits" in box.message.value
    assert data(box) == before
    assert all(STALE in (f.layout.title.text or "") for f in box.figures.values()) and STALE in box.rejected.value
    box.controls["model"].value = "llama-3.1-8b"
    assert data(box) == before and not any(STALE in (f.layout.title.text or "") for f in box.figures.values())


def test_teaching_presets_are_not_offered(box):
    assert not any(m.startswith("gpt-") for m in box.controls["model"].options)


def test_replay_rows_pivot_one_row_per_rank_with_predicted_and_measured():
    rows = [
        {"rank": 1, "what": "bytes sent", "key": "tp", "predicted": 1024, "measured": 1024},
        {"rank": 0, "what": "bytes sent", "key": "tp", "predicted": 2048, "measured": 2000},
        {"rank": 0, "what": "memory", "key": "params", "predicted": None, "measured": 5},
        {"rank": 1, "what": "bytes sent", "key": "ep", "predicted": 8, "measured": 8, "before_run": False},
    ]
    assert replay_rows(rows, "bytes sent") == [
        {"rank": 0, "tp": "2,048 / 2,000"},
        {"rank": 1, "tp": "1,024 / 1,024", "ep": "8 / 8 †"},
    ]
    assert replay_rows(rows, "memory") == [{"rank": 0, "params": "— / 5"}]


def test_the_table_is_as_tall_as_its_rows_after_every_move(box):
    """Issue 48: at 1280 px chapter 8b's table showed 4 of its 6 rows, the widget at the page's default
    height. The live table keeps the height ``table`` counts for its rows, first drawing and after."""
    tall = box.figures["table"].layout.height
    assert tall is not None and tall > 100
    box.controls["top"].value = 8
    assert box.figures["table"].layout.height > tall
    box.controls["top"].value = 4
    assert box.figures["table"].layout.height == tall
