"""Figures fit the narrowest notebook cell (FIT_WIDTH: a 1280 px window with the file browser open):
tables laid out line by line with every row counted into the height, titles wrapped. The browser
check (tests/browser, layoutProblems) measures the drawn result; these read the figure's data."""

import re

from playbook.viz.figures import FIT_WIDTH, TITLE_CHARS, TITLE_LINE_PX, figure_layout, wrap_title
from playbook.viz.table import CHAR_PX, LINE_PX, PAD_PX, table

import plotly.graph_objects as go

# chapter 7's capacity table: ten columns, eleven-digit byte counts and snake_case headers
KV = [
    {"tp": t, "memory": 76_968_728_986, "weights": 70_553_706_496, "activations": 1_107_296_256,
     "kv_budget": 5_307_726_234, "kv_bytes_per_token": 163_840, "blocks": 2_024, "tokens": 32_384,
     "blocks_per_seq": 512, "max_seqs": 3}
    for t in (2, 4, 8)
]  # fmt: skip


def lines(text: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", x) for x in text.split("<br>")]


def test_table_columns_fit_and_no_line_is_wider_than_its_column():
    t = table(KV).data[0]
    assert sum(t.columnwidth) <= FIT_WIDTH - 20
    for j, width in enumerate(t.columnwidth):
        for line in lines(t.header.values[j]):
            assert len(line) * CHAR_PX["header"] + PAD_PX <= width + 1e-9, (line, width)
        for cell in t.cells.values[j]:
            for line in lines(cell):
                assert len(line) * CHAR_PX["cells"] + PAD_PX <= width + 1e-9, (line, width)
    # a snake_case header breaks after its underscores, and reads back whole
    k = list(KV[0]).index("kv_bytes_per_token")
    assert len(lines(t.header.values[k])) > 1 and "".join(lines(t.header.values[k])) == "kv_bytes_per_token"


def test_table_height_counts_every_wrapped_line():
    rows = [{"schedule": "whole prefill " * 12, "x": 1.0}, {"schedule": "budget 16 tokens", "x": 2.0}]
    fig = table(rows, title="t")
    t = fig.data[0]
    row_lines = [len(lines(v)) for v in t.cells.values[0]]
    assert row_lines[0] > 1 and row_lines[1] == 1  # the long text wraps at its spaces, the short one not
    header = 14 + LINE_PX["header"] * max(len(lines(h)) for h in t.header.values)
    body = sum(26 + LINE_PX["cells"] * (n - 1) for n in row_lines)
    assert fig.layout.height == fig.layout.margin.t + header + body + 24


def test_long_titles_wrap_at_spaces_and_keep_their_words():
    title = "p99 (ms) of TPOT, inter-token gap and TTFT: measured on 2 TP ranks (gpt-small) and predicted (llama-3.1-8b, H100, ×64)"
    wrapped = wrap_title(title)
    assert wrapped.count("<br>") == 1 and wrapped.replace("<br>", " ") == title
    assert all(len(x) <= TITLE_CHARS[""] for x in lines(wrapped))
    short = "bubble vs micro-batches<br><sup>p=4</sup>"
    assert wrap_title(short) == short  # what fits is left as it was
    fig = figure_layout(go.Figure(), title=title)
    assert fig.layout.title.text == wrapped and fig.layout.title.yanchor == "top"  # hangs from the top edge
    assert fig.layout.margin.t == 60 + TITLE_LINE_PX


def test_chapter_6s_byte_bars_leave_room_above_the_tallest_for_its_label():
    """At 1280 px the tallest bars' "203,776" labels (textposition outside) were cut at the plot's top:
    the y range now reaches 15 % above the tallest bar, predicted or measured (issue 48)."""
    from playbook.viz.ep import bytes_figure

    fig = bytes_figure([175_104, 197_120], [175_104, 203_776])
    assert fig.layout.yaxis.range[0] == 0 and fig.layout.yaxis.range[1] >= 1.15 * 203_776 - 1e-6
    assert bytes_figure([0, 0]).layout.yaxis.range is None  # nothing sent: plotly's own range
