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


HOSTILE_MD = (
    "# Chapter\n\n<script>alert('md')</script>\n\n<img src=x onerror=\"alert('img')\">\n\n"
    "[click](javascript:alert('link'))\n\n<iframe src=\"https://example.com\"></iframe>\n\n"
    "<details><summary>Answer</summary>\n\nkept **bold**\n</details>"
)
HOSTILE_HTML = (
    "<b>ok</b><br><span style='color:#2e7d32; position:fixed'>verdict</span>"
    "<script>alert('out')</script><div onclick=\"alert('div')\">x</div><style>body{display:none}</style>"
)


def _hostile_page():
    import nbformat

    from playbook.book.render import PLOTLY, render_page

    nb = nbformat.v4.new_notebook()
    fig = {"data": [{"type": "bar", "y": [1, 2]}], "layout": {"height": 300}}
    cell = nbformat.v4.new_code_cell("show()")
    cell.outputs = [
        nbformat.from_dict({"output_type": "display_data", "metadata": {}, "data": {"text/html": HOSTILE_HTML}}),
        nbformat.from_dict(
            {
                "output_type": "display_data",
                "metadata": {},
                "data": {"text/markdown": "<script>alert('mdout')</script>"},
            }
        ),
        nbformat.from_dict(
            {"output_type": "display_data", "metadata": {}, "data": {"application/javascript": "alert('js')"}}
        ),
        nbformat.from_dict({"output_type": "display_data", "metadata": {}, "data": {PLOTLY: fig}}),
    ]
    nb.cells = [nbformat.v4.new_markdown_cell(HOSTILE_MD), cell]
    return render_page(nb)


def test_a_hostile_notebook_runs_nothing_on_its_page_and_the_figures_still_draw():
    """Raw HTML from a notebook's Markdown and text/html outputs is sanitized (issue 31, item 15):
    no script, handler, frame or javascript: link of its own survives; what a chapter needs
    (details/summary, bold, a coloured span) does, and the book's own figure passes as written."""
    import re

    page, count = _hostile_page()
    body = page[page.index("<body") :]
    scripts = re.findall(r"<script\b[^>]*>", body)
    assert len(scripts) == 1 and 'type="application/json"' in scripts[0], scripts  # the figure's JSON only
    assert 'id="fig-1-json"' in scripts[0] and '"y":[1,2]' in body
    for marker in ("alert('md')", "alert('out')", "alert('mdout')", "alert('js')"):
        assert f"<script>{marker}" not in body and marker + "</script>" not in body.replace("&lt;/script&gt;", "")
    assert "alert('js')" not in body  # a javascript output is not written at all
    assert not re.search(r"<[^>]+\son\w+\s*=", body), "an event handler survived"
    assert "<iframe" not in body and "<style>body" not in body and 'href="javascript:' not in body
    assert "<details><summary>Answer</summary>" in body and "<strong>bold</strong>" in body
    assert '<span style="color:#2e7d32;">verdict</span>' in body and "<b>ok</b><br/>" in body
    assert count == 1 and '<div class="playbook-plot" id="fig-1" style="height:300px"></div>' in body


def test_every_chapter_passes_the_sanitizer_unchanged():
    """The allow-list fits the chapters: each one's Markdown renders to the same page sanitized or not,
    and the context-parallel summary (an HTML output) keeps all its markup."""
    import glob
    import re
    from pathlib import Path

    import nbformat
    from nbconvert import HTMLExporter

    from playbook.book.sanitize import clean
    from playbook.config import ModelConfig
    from playbook.hardware import Hardware
    from playbook.viz.cp_dashboard import cp_summary

    root = Path(__file__).resolve().parents[2]
    raw = HTMLExporter(template_name="lab")
    safe = HTMLExporter(template_name="lab", sanitize_html=True, filters={"clean_html": clean})
    for path in sorted(glob.glob(str(root / "notebooks" / "*.ipynb"))):
        nb = nbformat.read(path, as_version=4)
        nb.cells = [c for c in nb.cells if c.cell_type == "markdown"]
        assert safe.from_notebook_node(nb)[0] == raw.from_notebook_node(nb)[0], Path(path).name
    summary = cp_summary(
        ModelConfig.preset("llama-3.1-8b"),
        Hardware.preset("h100-sxm"),
        seq_len=131072,
        n=4,
        variant="ring",
        causal=True,
        zigzag=True,
    )
    tags = re.compile(r"<(/?\w+)")
    assert tags.findall(clean(summary)) == tags.findall(summary) and 'style="color:#' in clean(summary)


def test_the_index_numbers_chapters_as_their_files_do_and_appendices_not_at_all():
    from playbook.book.site import Page, chapter_label, index_html

    assert chapter_label("08b_planning.ipynb", "8b. Planning") == "8b"
    assert chapter_label("00_memory_budgets.ipynb", "Memory budgets") == "0"
    assert chapter_label("09_debugging.ipynb", "Appendix — A debugging lab") == ""
    pages = [
        Page(n, n.replace(".ipynb", ".html"), t, 0, [])
        for n, t in (
            ("08_hybrid_mesh.ipynb", "The hybrid mesh"),
            ("08b_planning.ipynb", "Planning"),
            ("09_debugging.ipynb", "Appendix — A debugging lab"),
        )
    ]
    html = index_html(pages)
    assert "<ol" not in html  # an ordered list would number 8b and the appendix 9 and 10
    assert '<span class="n">8b</span> <a href="08b_planning.html">' in html
    assert '<li><a href="09_debugging.html">Appendix' in html


def test_a_folder_with_a_broken_notebook_is_one_line_before_anything_runs(tmp_path, capsys):
    from playbook.book.site import main

    (tmp_path / "00_ok.ipynb").write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    for name, text in (
        ("01_x.ipynb", "not json"),
        ("01_x.ipynb", '{"metadata": {}}'),
        ("01_x.ipynb", '{"cells": [{"cell_type": "nope"}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'),
    ):
        (tmp_path / name).write_text(text)
        assert main(["--notebooks", str(tmp_path), "--execute", "--executed", str(tmp_path / "ex")]) == 2
        said = capsys.readouterr().out.strip().splitlines()
        assert len(said) == 1 and "01_x.ipynb is not a notebook" in said[0], said
        assert not (tmp_path / "ex").exists()  # nothing ran
