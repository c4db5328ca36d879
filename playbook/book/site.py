"""The book: every executed chapter as a page, an index with the chapters in file order, plotly.js
written once beside them, and a manifest (figures per page, static dashboards) for the tests.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import plotly.offline

from playbook.book.grid import COMPOSER_JS
from playbook.book.render import dashboard_call, read, render_page, title_of

HERE = Path(__file__).parent
PLOTLY_JS, BOOK_JS, MANIFEST = "plotly.min.js", "book.js", "manifest.json"


@dataclass
class Page:
    notebook: str  # the executed notebook's file name
    href: str
    title: str
    figures: int  # plotly figures on the page (static dashboards included)
    dashboards: list[str]  # names of the live dashboards shown in static form


def build(executed: list[Path], out: Path) -> list[Page]:
    """Write the site for the executed notebooks ``executed`` (chapter order = list order) to ``out``."""
    if not executed:
        raise ValueError("no executed notebooks to build the book from: run the chapters first (--execute)")
    out.mkdir(parents=True, exist_ok=True)
    (out / PLOTLY_JS).write_text(plotly.offline.get_plotlyjs(), encoding="utf-8")
    (out / BOOK_JS).write_text((HERE / "book.js").read_text().replace("__COMPOSER__", COMPOSER_JS), encoding="utf-8")
    nbs = [read(p) for p in executed]
    entries = [(p.stem + ".html", title_of(nb)) for p, nb in zip(executed, nbs)]
    pages = []
    for i, (path, nb) in enumerate(zip(executed, nbs)):
        prev = entries[i - 1] if i > 0 else None
        nxt = entries[i + 1] if i + 1 < len(entries) else None
        body, count = render_page(nb, prev=prev, nxt=nxt, plotly_src=PLOTLY_JS, book_js=BOOK_JS)
        href, title = entries[i]
        (out / href).write_text(body, encoding="utf-8")
        shown = [found[0] for c in nb.cells if c.cell_type == "code" and (found := dashboard_call(c.source))]
        pages.append(Page(path.name, href, title, count, shown))
    (out / "index.html").write_text(index_html(pages), encoding="utf-8")
    (out / MANIFEST).write_text(json.dumps([asdict(p) for p in pages], indent=1))
    return pages


def chapter_label(notebook: str, title: str) -> str:
    """What the index puts before a chapter: its file's number as the chapters say it ("0", "8b"), and
    nothing for an appendix (its title says so)."""
    found = re.match(r"(\d+)([a-z]?)_", notebook)
    if title.lower().startswith("appendix") or not found:
        return ""
    return f"{int(found[1])}{found[2]}"


def index_html(pages: list[Page]) -> str:
    import html

    def row(p: Page) -> str:
        label = chapter_label(p.notebook, p.title)
        shown = f'<span class="n">{label}</span> ' if label else ""
        return f'  <li>{shown}<a href="{html.escape(p.href, quote=True)}">{html.escape(p.title)}</a></li>'

    rows = "\n".join(row(p) for p in pages)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Parallelism Playbook</title>
<style>body {{ font-family: system-ui, sans-serif; max-width: 48em; margin: 3em auto; line-height: 1.6; }}
ul.toc {{ list-style: none; padding-left: 0; }} ul.toc .n {{ display: inline-block; min-width: 2em; }}</style>
</head><body>
<h1>Parallelism Playbook</h1>
<p>Every chapter executed on real processes, with its outputs. Figures are interactive; the dashboards
offer a grid of settings (the notebooks, run in JupyterLab, offer every setting).</p>
<h2>Contents</h2>
<ul class="toc">
{rows}
</ul>
</body></html>
"""


def main(argv: list[str] | None = None) -> int:
    import argparse

    from playbook.book.execute import execute

    ap = argparse.ArgumentParser(prog="python -m playbook.book", description=__doc__)
    ap.add_argument("--notebooks", type=Path, default=Path("notebooks"), help="the chapters (default: notebooks)")
    ap.add_argument("--executed", type=Path, default=Path("build/executed"), help="executed notebooks folder")
    ap.add_argument("--out", type=Path, default=Path("build/book"), help="where the site goes")
    ap.add_argument("--execute", action="store_true", help="run every chapter first (else use --executed as is)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per chapter when executing")
    args = ap.parse_args(argv)
    sources = sorted(args.notebooks.glob("*.ipynb"))
    if not sources:
        print(f"book: no notebooks in {args.notebooks}/ (pass --notebooks DIR)")
        return 2
    for src in sources:  # every chapter readable before anything runs
        if why := not_a_notebook(src):
            print(f"book: {src} is not a notebook ({why}); fix it or move it out of {args.notebooks}/")
            return 2
    if args.execute:
        for src in sources:
            run = execute(src, args.executed, timeout=args.timeout)
            print(f"book: ran {src.name} in {run.seconds:.1f} s" + (f"\n{run.error}" if run.error else ""))
            if run.error:
                return 1
    executed = [args.executed / s.name for s in sources]
    missing = [p.name for p in executed if not p.exists()]
    if missing:
        print(f"book: not executed yet: {', '.join(missing)} (add --execute)")
        return 2
    start = time.perf_counter()
    pages = build(executed, args.out)
    size = sum(f.stat().st_size for f in args.out.iterdir() if f.is_file())
    print(f"book: {len(pages)} pages, {size / 1e6:.1f} MB, built in {time.perf_counter() - start:.1f} s")
    print(f"book: open {(args.out / 'index.html').resolve()}")
    return 0


def not_a_notebook(path: Path) -> str | None:
    """Why ``path`` cannot be read as a notebook, in a few words; None when it can."""
    import nbformat

    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"not JSON: {type(e).__name__} {str(e).splitlines()[0][:80]}"
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        return "no list of cells"
    try:
        nbformat.validate(nbformat.reads(json.dumps(raw), as_version=4))
    except Exception as e:  # nbformat's ValidationError and its relatives: say the first line
        return f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
    return None


__all__ = ["Page", "build", "chapter_label", "index_html", "main", "not_a_notebook"]
