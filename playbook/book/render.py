"""One executed chapter -> one HTML page of the book.

Before nbconvert's HTML exporter sees the notebook, its outputs are made fit for a page without a
kernel: every plotly figure becomes a ``<div>`` plus its JSON (drawn by the page script with the
book's single copy of plotly.js, instead of the copy of plotly.js the notebook renderer embeds), a
cell that shows a live dashboard gets that dashboard's static form (:mod:`playbook.book.static`),
other widget outputs (progress bars, whose final state lives only in a kernel) are dropped, and
prose that says a control "needs a live kernel" goes, since on this page it does not.

Everything else the notebook brings (Markdown, raw cells, ``text/html`` and ``text/markdown``
outputs) is sanitized on the page (:mod:`playbook.book.sanitize`); only the HTML made here passes
as written.
"""

from __future__ import annotations

import ast
import copy
import html
import re
from pathlib import Path

import nbformat
import plotly.io as pio
from nbconvert import HTMLExporter

from playbook.book.sanitize import clean
from playbook.book.static import STATIC

PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
TEMPLATES = Path(__file__).parent / "templates"
PLOTLY_LIBRARY = "window.PlotlyConfig"  # the notebook renderer's one-off copy of plotly.js
LIVE_CALL = re.compile(r"\b\w+_(dashboard|explorer)\(")  # a cell that shows a live dashboard
LIVE_ONLY = re.compile(r"live kernel|static export", re.I)  # prose about where widgets do not run


def title_of(nb) -> str:
    """The chapter's title: the text of its first Markdown heading (else "Untitled")."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.lstrip().startswith("#"):
                    return line.lstrip("# ").strip()
    return "Untitled"


def dashboard_call(source: str) -> tuple[str, dict] | None:
    """``(function name, literal keyword arguments)`` when the cell's last statement calls a
    dashboard with a static form; arguments that are not literals are left to their defaults."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return None
    last = body[-1] if body else None
    if not (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)):
        return None
    call = last.value
    name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
    if name not in STATIC:
        return None
    kwargs = {}
    for kw in call.keywords:
        try:
            kwargs[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            pass
    return name, kwargs


def figure_html(spec: dict, ident: str) -> str:
    """A figure as a ``<div>`` and its JSON; ``</`` is escaped so the JSON cannot close its script."""
    text = pio.to_json(spec, validate=False).replace("</", "<\\/")
    height = (spec.get("layout") or {}).get("height")
    # a figure's height comes from the notebook: only a positive finite number reaches the style
    ok = isinstance(height, (int, float)) and not isinstance(height, bool) and 0 < height < 1e5
    ident = html.escape(ident, quote=True)
    return (
        f'<div class="playbook-plot" id="{ident}" style="height:{float(height) if ok else 450:g}px"></div>\n'
        f'<script type="application/json" id="{ident}-json">{text}</script>'
    )


def prepare(nb) -> tuple[object, int]:
    """A copy of the executed ``nb`` ready for the exporter, and how many figures its page shows."""
    ready, count, _ = _prepare(nb)
    return ready, count


def _prepare(nb) -> tuple[object, int, set[str]]:
    """:func:`prepare`, and the HTML it wrote itself (the only HTML the page shows unsanitized)."""
    ours: set[str] = set()
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    count = 0
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "markdown" and LIVE_ONLY.search(cell.source):
            paragraphs = [p for p in cell.source.split("\n\n") if not LIVE_ONLY.search(p)]
            if not any(p.strip() for p in paragraphs):
                continue
            cell.source = "\n\n".join(paragraphs)
        if cell.cell_type == "code":
            found = dashboard_call(cell.source)
            outputs = []
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                if WIDGET in data:
                    if found is None:  # a progress bar (dropped), or a dashboard without a static form
                        if LIVE_CALL.search(cell.source.strip().splitlines()[-1] if cell.source.strip() else ""):
                            outputs.append(_note(out))
                            ours.add(outputs[-1]["data"]["text/html"])
                        continue
                    name, kwargs = found
                    spec = STATIC[name](**kwargs).to_plotly_json()
                    found = None  # one static figure per dashboard cell
                elif PLOTLY in data:
                    spec = data[PLOTLY]
                elif PLOTLY_LIBRARY in "".join(data.get("text/html", "")):
                    continue  # the page loads the book's single plotly.min.js instead
                else:
                    outputs.append(out)
                    continue
                count += 1
                out = copy.deepcopy(out)
                out["output_type"] = "display_data" if out["output_type"] != "execute_result" else out["output_type"]
                out["data"] = {"text/html": figure_html(spec, f"fig-{count}")}
                ours.add(out["data"]["text/html"])
                out.setdefault("metadata", {})
                outputs.append(out)
            cell.outputs = outputs
        cells.append(cell)
    nb.cells = cells
    return nb, count, ours


def _note(out) -> dict:
    """A one-line note in place of a live dashboard that has no static form."""
    note = copy.deepcopy(out)
    note["output_type"] = "display_data"
    note.pop("execution_count", None)
    note["data"] = {
        "text/html": "<p><i>A live dashboard: open this chapter in JupyterLab (<code>./setup.sh lab</code>) "
        "to use it.</i></p>"
    }
    return note


def nav(prev: tuple[str, str] | None, nxt: tuple[str, str] | None, bottom: bool = False) -> str:
    """Previous / contents / next links; each of ``prev`` and ``nxt`` is (href, title) or None."""

    def link(item, arrow_left: bool) -> str:
        if item is None:
            return "<span></span>"
        href, title = item
        text = f"← {html.escape(title)}" if arrow_left else f"{html.escape(title)} →"
        return f'<a href="{html.escape(href, quote=True)}" rel="{"prev" if arrow_left else "next"}">{text}</a>'

    cls = "book bottom" if bottom else "book"
    return f'<nav class="{cls}">{link(prev, True)}<a href="index.html">Contents</a>{link(nxt, False)}</nav>'


def render_page(nb, *, prev=None, nxt=None, plotly_src="plotly.min.js", book_js="book.js") -> tuple[str, int]:
    """HTML for one executed chapter and the number of figures on it."""
    ready, count, ours = _prepare(nb)
    # nbconvert's sanitizing template paths, with its clean_html filter replaced by ours: the book's
    # own figures and notes pass as written, everything else from the notebook is cleaned
    exporter = HTMLExporter(
        template_name="book",
        extra_template_basedirs=[str(TEMPLATES)],
        sanitize_html=True,
        filters={"clean_html": lambda text: text if text in ours else clean(text)},
    )
    resources = {
        "book": {
            "plotly_src": plotly_src,
            "book_js": book_js,
            "nav": nav(prev, nxt),
            "nav_bottom": nav(prev, nxt, bottom=True),
        },
        "metadata": {"name": title_of(nb)},
    }
    body, _ = exporter.from_notebook_node(ready, resources=resources)
    return body, count


def read(path: Path):
    return nbformat.read(path, as_version=4)


__all__ = ["dashboard_call", "figure_html", "nav", "prepare", "read", "render_page", "title_of"]
