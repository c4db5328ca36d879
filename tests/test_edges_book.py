"""Issue 31: what the book writes into attributes is escaped (a figure's height, link targets)."""

from __future__ import annotations

from playbook.book.render import figure_html, nav


def test_a_figure_height_cannot_leave_its_style_attribute():
    div = figure_html({"data": [], "layout": {"height": '1px" onmouseover="alert(1)'}}, "fig-1").splitlines()[0]
    assert div == '<div class="playbook-plot" id="fig-1" style="height:450px"></div>'
    assert 'style="height:320px"' in figure_html({"data": [], "layout": {"height": 320}}, "fig-2")
    assert 'style="height:450px"' in figure_html({"data": [], "layout": {"height": float("nan")}}, "fig-3")


def test_link_targets_are_escaped():
    text = nav(('x.html" onclick="alert(1)', "<b>Next</b>"), None)
    assert 'href="x.html&quot; onclick=&quot;alert(1)"' in text and "<b>" not in text
