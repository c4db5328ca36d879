"""The serving chapter's figures, read back from their data."""

from playbook.viz.serving import block_table, kv_growth, layouts, roofline, stacked_memory
from playbook.viz.table import table


def test_stacked_memory_and_kv_growth_scale_bytes_to_gb():
    fig = stacked_memory([{"label": "a", "weights": 2e9, "kv_cache": 1e9}], ["weights", "kv_cache"])
    assert [t.name for t in fig.data] == ["weights", "KV cache"] and [t.y[0] for t in fig.data] == [2.0, 1.0]
    fig = kv_growth({"m": [(10, 5e9), (100, 50e9)]}, limit=80e9)
    assert (
        list(fig.data[0].y) == [5.0, 50.0] and list(fig.data[1].y) == [80.0, 80.0] and list(fig.data[1].x) == [10, 100]
    )


def test_roofline_puts_each_phase_and_tp_on_its_panel():
    measured = [
        {"phase": "prefill", "tp": 1, "x": 16, "seconds": 0.02},
        {"phase": "decode", "tp": 2, "x": 4, "seconds": 0.01},
    ]
    predicted = [
        {"phase": "prefill", "tp": 1, "x": 16, "seconds": 0.01},
        {"phase": "decode", "tp": 2, "x": 4, "seconds": 0.005},
    ]
    fig = roofline(measured, predicted)
    by = {(t.name, t.xaxis): (list(t.x), list(t.y)) for t in fig.data if len(t.x)}
    assert by[("tp=1 measured", "x")] == ([16], [20.0]) and by[("tp=2 predicted", "x2")] == ([4], [5.0])


def test_layouts_shows_latency_and_throughput():
    rows = [
        {"layout": "tp2×dp4", "tpot_batch1": 0.028, "tpot": 0.03, "tokens_per_s": 140.0, "seqs": 4},
        {"layout": "tp4×dp2", "tpot_batch1": 0.018, "tpot": 0.032, "tokens_per_s": 3380.0, "seqs": 108},
    ]
    fig = layouts(rows)
    assert list(fig.data[0].y) == [28.0, 18.0] and list(fig.data[2].y) == [140.0, 3380.0]
    assert list(fig.data[2].text) == ["4 seqs", "108 seqs"]


def test_block_table_marks_who_holds_each_block():
    steps = [{"step": 0, "tables": {5: [0, 2]}}, {"step": 1, "tables": {5: [0, 2], 9: [1]}}, {"step": 2, "tables": {}}]
    hm = block_table(steps, 3).data[0]
    assert [list(r) for r in hm.z] == [[0, 0, None], [None, 1, None], [0, 0, None]]
    assert hm.text[2][1] == "r5·1" and hm.text[1][1] == "r9·0"
    colours = [c for _, c in hm.colorscale]
    assert colours[0] == colours[1] != colours[2] == colours[3]  # request 5's band, then request 9's


def test_table_prints_whole_numbers_whole():
    cells = table([{"tp": 2, "bytes": 1_446_293_504, "ratio": 0.5}]).data[0].cells.values
    assert [list(c) for c in cells] == [["2"], ["1,446,293,504"], ["0.50"]]


def test_every_memory_figure_gives_a_category_the_same_colour_and_name():
    """Chapter 7's stacked bars, chapters 0/2/3's memory bars and chapter 8's memory per rank: one
    colour and one legend name per memory category across the book."""
    from playbook.viz.figures import CATEGORY_COLORS, CATEGORY_LABELS
    from playbook.viz.memory_figures import memory_bars

    cats = list(CATEGORY_COLORS)
    row = {c: float(i + 1) for i, c in enumerate(cats)}
    drawn = {
        "stacked_memory": stacked_memory([{"label": "a", **row}], cats),
        "memory_bars": memory_bars({"a": row}),
    }
    for name, fig in drawn.items():
        bars = {t.name: t.marker.color for t in fig.data if t.type == "bar"}
        assert bars == {CATEGORY_LABELS[c]: CATEGORY_COLORS[c] for c in cats}, name
