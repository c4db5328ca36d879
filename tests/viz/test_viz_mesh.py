"""The hybrid chapter's figures and tables, checked by their data (no ranks, no pixels)."""

import pytest

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.dims import AXES, ParallelDims
from playbook.theory.hybrid.memory import training_memory
from playbook.viz.mesh import (
    bytes_per_axis,
    compare_layouts,
    layout_summary,
    memory_per_rank,
    step_timeline,
    training_rows,
)
from playbook.viz.mesh_layout import axis_seconds, groups_in_order, links, rank_grid
from playbook.viz.table import table

LAYOUTS = [
    ParallelDims(dp=2, tp=2, pp=2),
    ParallelDims(dp=2, cp=2, tp=2),
    ParallelDims(dp=4, ep=2),
    ParallelDims(dp=2, tp=4, pp=2, cp=2),
    ParallelDims(tp=8, dp=4, pp=4),
    ParallelDims(),
]


def groups_from_z(z) -> list[list[int]]:
    cols = len(z[0])
    found: dict[int, list[int]] = {}
    for y, row in enumerate(z):
        for x, k in enumerate(row):
            found.setdefault(k, []).append(y * cols + x)
    return sorted(found.values(), key=lambda g: g[0])


@pytest.mark.parametrize("dims", LAYOUTS, ids=str)
def test_rank_grid_colours_cells_by_the_groups_of_every_axis(dims):
    fig = rank_grid(dims, devices_per_node=4)
    axes = [a for a in ("tp", "cp", "dp", "pp", "ep") if dims.size(a) > 1] or ["tp"]
    assert [t.name for t in fig.data] == axes
    for trace in fig.data:
        assert groups_from_z(trace.z) == dims.groups(trace.name)
        assert len(trace.z) == dims.pp * dims.dp and len(trace.z[0]) == dims.cp * dims.tp
    for r in range(dims.world):  # each cell names its rank
        y, x = divmod(r, dims.cp * dims.tp)
        assert fig.data[0].text[y][x].startswith(f"<b>{r}</b>")
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == [f"{a} groups" for a in axes]
    for i, b in enumerate(buttons):  # each button shows its own axis only
        assert b.args[0]["visible"] == [j == i for j in range(len(axes))]
    assert [t.visible for t in fig.data] == [True] + [False] * (len(axes) - 1)


def test_rank_grid_draws_node_boundaries_between_ranks_on_different_nodes():
    dims = ParallelDims(dp=2, tp=2, pp=2)  # 2 columns, 4 rows; nodes of 4 ranks = two rows each
    lines = [s for s in rank_grid(dims, devices_per_node=4).layout.shapes if s.type == "line"]
    assert [(s.x0, s.x1, s.y0, s.y1) for s in lines] == [(-0.5, 0.5, 1.5, 1.5), (0.5, 1.5, 1.5, 1.5)]
    one_node = [s for s in rank_grid(dims, devices_per_node=8).layout.shapes if s.type == "line"]
    assert one_node == []
    per_gpu = [s for s in rank_grid(dims, devices_per_node=1).layout.shapes if s.type == "line"]
    assert len(per_gpu) == 4 * 1 + 3 * 2  # every vertical and horizontal neighbour pair


def test_groups_in_another_order_and_the_links_they_use():
    dims = ParallelDims(dp=2, tp=4, pp=2)
    for axis in AXES:
        assert groups_in_order(dims, axis) == dims.groups(axis)
    assert groups_in_order(dims, "tp", ("pp", "dp", "cp", "tp")) == [
        [0, 4, 8, 12],
        [1, 5, 9, 13],
        [2, 6, 10, 14],
        [3, 7, 11, 15],
    ]
    assert links(dims, 8) == {"tp": "intra-node", "dp": "intra-node", "pp": "inter-node"}
    assert links(dims, 8, ("pp", "dp", "cp", "tp")) == {"tp": "inter-node", "dp": "intra-node", "pp": "intra-node"}
    with pytest.raises(ValueError, match="order must list"):
        groups_in_order(dims, "tp", ("tp", "dp"))


ROWS = [
    {
        "rank": 0,
        "coords": {"tp": 0, "cp": 0, "dp": 0, "pp": 0},
        "predicted": {"tp": 2000.0, "dp": 1000.0},
        "measured": {"tp": 2000.0, "dp": 1000.0},
        "memory": {"params": 10, "grads": 10, "optimizer": 24, "activations": 50},
    },
    {
        "rank": 1,
        "coords": {"tp": 1, "cp": 0, "dp": 0, "pp": 0},
        "predicted": {"tp": 2000.0, "dp": 1000.0, "pp": 300.0},
        "measured": {"tp": 2000.0, "dp": 1500.0, "pp": 300.0},
        "memory": {"params": 20, "grads": 20, "optimizer": 44, "activations": 60, "peak": 999},
    },
]


def test_bytes_per_axis_shows_predicted_beside_measured_for_every_rank_and_axis():
    fig = bytes_per_axis(ROWS, unit="KB")
    assert [a.text for a in fig.layout.annotations] == ["<b>tp</b>", "<b>dp</b>", "<b>pp</b>"]
    for axis in ("tp", "dp", "pp"):
        for kind in ("predicted", "measured"):
            (trace,) = [t for t in fig.data if t.meta == axis and t.name == kind]
            assert list(trace.x) == ["rank 0", "rank 1"]
            assert list(trace.customdata) == [row[kind].get(axis, 0.0) for row in ROWS]
            assert list(trace.y) == [row[kind].get(axis, 0.0) / 1e3 for row in ROWS]
    assert sum(t.showlegend for t in fig.data) == 2


def test_memory_per_rank_stacks_the_measured_categories_and_marks_a_prediction_when_there_is_one():
    fig = memory_per_rank(ROWS, unit="bytes")
    assert fig.layout.barmode == "stack"
    assert [t.legendgroup for t in fig.data] == ["params", "grads", "optimizer", "activations"]
    for t in fig.data:
        assert list(t.y) == [row["memory"][t.legendgroup] for row in ROWS]
    nested = [
        {
            **row,
            "memory": {"predicted": {k: v for k, v in row["memory"].items() if k != "peak"}, "measured": row["memory"]},
        }
        for row in ROWS
    ]
    fig = memory_per_rank(nested, unit="bytes")
    assert [t.legendgroup for t in fig.data][:4] == ["params", "grads", "optimizer", "activations"]
    assert list(fig.data[4].y) == [94, 144]  # the predicted totals
    partial = [
        {**row, "memory": {"predicted": {"params": 1, "activations": None}, "measured": row["memory"]}} for row in ROWS
    ]
    assert len(memory_per_rank(partial).data) == 4  # nothing predicted in full: no markers


def test_layout_summary_and_compare_layouts_take_the_busiest_and_the_fullest_rank():
    s = layout_summary(ROWS)
    assert s["busiest"] == 1 and s["bytes"] == ROWS[1]["measured"] and s["sent"] == 3800
    assert s["fullest"] == 1 and s["memory"] == {"params": 20, "grads": 20, "optimizer": 44, "activations": 60}
    fig = compare_layouts({"a": ROWS, "b": ROWS[:1]}, unit="bytes")
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["tp"].y) == [2000, 2000] and list(by_name["pp"].y) == [300, 0]
    assert list(by_name["parameters"].y) == [20, 10] and list(by_name["activations"].y) == [60, 50]


def test_table_formats_numbers_and_keeps_text():
    fig = table(
        [{"layout": "tp2×dp2", "bytes": 1234567.0, "diff": 6.1e-7, "ok": True}, {"layout": "dp4", "bytes": None}]
    )
    header, cells = fig.data[0].header.values, fig.data[0].cells.values
    assert list(header) == ["<b>layout</b>", "<b>bytes</b>", "<b>diff</b>", "<b>ok</b>"]
    assert [list(c) for c in cells] == [["tp2×dp2", "dp4"], ["1,234,567", "—"], ["6.1e-07", "—"], ["True", "—"]]


def test_step_timeline_keeps_one_step_and_names_collectives_by_axis():
    spans = []
    for rank in (0, 1):
        for step, t0 in ((0, 0.0), (1, 1.0)):
            spans += [
                {"rank": rank, "kind": "compute", "name": f"step {step}", "start": t0, "end": t0 + 0.9},
                {"rank": rank, "kind": "compute", "name": "tp:layer0.attn:forward", "start": t0 + 0.1, "end": t0 + 0.2},
                {"rank": rank, "kind": "comm", "name": "all_reduce", "axis": "tp", "start": t0 + 0.2, "end": t0 + 0.3},
                {"rank": rank, "kind": "comm", "name": "isend", "axis": "pp", "start": t0 + 0.4, "end": t0 + 0.5},
            ]
    fig = step_timeline(spans)
    assert {t.name for t in fig.data} == {"forward", "tp all_reduce", "pp isend"}
    assert all(len(t.x) == 2 for t in fig.data)  # one span per rank: the last step only
    assert fig.layout.title.text == "step 1 on every rank"


def test_axis_seconds_uses_nvlink_inside_a_node_and_the_nic_across():
    hw = Hardware.preset("h100-sxm")
    dims = ParallelDims(dp=4, tp=8, pp=4)
    rows = axis_seconds({"tp": 4.5e11, "dp": 5e10, "pp": 1e9}, dims, hw)
    assert [(r["axis"], r["link"]) for r in rows] == [("tp", "intra-node"), ("dp", "inter-node"), ("pp", "inter-node")]
    assert rows[0]["seconds"] == pytest.approx(4.5e11 / hw.intra_node_bandwidth)
    assert rows[1]["seconds"] == pytest.approx(5e10 / hw.inter_node_bandwidth)
    flipped = axis_seconds({"tp": 4.5e11}, dims, hw, order=("pp", "dp", "cp", "tp"))
    assert flipped[0]["link"] == "inter-node"
    combined = axis_seconds({"dp×cp": 1e9}, ParallelDims(dp=2, cp=2), hw)
    assert combined[0]["link"] == "intra-node"


def test_training_rows_follow_the_memory_formulas():
    cfg = ModelConfig.preset("llama-3.1-70b")
    rows = training_rows(cfg, [(4, 2)], seq_len=4096)
    want = training_memory(cfg, seq_len=4096, micro_batch=1, tp=4, dp=2, zero=1, sequence_parallel=True).as_dict()
    assert rows == [{"layout": "tp4×dp2", **want}]
