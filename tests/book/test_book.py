"""Every chapter runs top to bottom (one test per notebook, executed once in this session), and
the static book built from those very executions reads in a real browser without a network.

The chapter tests write their executed copies into one session folder; the book test builds the
site from them and opens every page in headless Chromium (Playwright driving the system's
``chromium``): no console error, no request that fails or leaves the machine, as many plotly
figures as the page's notebook makes, and on each static dashboard a control that changes a figure.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from playbook.book.execute import execute
from playbook.book.executed import kept

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CHROMIUM = os.environ.get("PLAYBOOK_CHROMIUM", "/usr/bin/chromium")
NOTEBOOK_LIMIT = int(os.environ.get("PLAYBOOK_NOTEBOOK_TIMEOUT", "600"))  # seconds per chapter, all cells
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# ---- the pieces, without a kernel -----------------------------------------------------------------
def test_the_book_orders_the_mesh_then_its_planner_then_the_appendices():
    """Chapter order is file order (site, browser tests): 08 the mesh, 08b the planner, then the
    appendices: 09 debugging, 10 a run's life."""
    stems = [p.stem for p in NOTEBOOKS]
    assert stems[-4:] == ["08_hybrid_mesh", "08b_planning", "09_debugging", "10_run_life"], stems


def test_static_memory_frames_hold_the_zero_papers_model_state():
    """ZeRO-3 over N ranks keeps 16Ψ/N bytes of model state per rank in mixed precision (Rajbhandari
    et al. 2020, §5): the frame a reader reaches by moving the controls must show exactly that."""
    from playbook.book.grid import frame_for
    from playbook.book.static import static_memory
    from playbook.config import ModelConfig

    fig = static_memory(model="llama-3.1-70b", seq_len=4096, dp=8, zero=0)  # chapter 0's cell: cached for the book
    names = [t.name for t in fig.data]
    for zero, dp in ((3, 16), (3, 64), (0, 4)):
        frame = frame_for(fig, {"model": "llama-3.1-8b", "zero": zero, "recompute": "full", "dp": dp})
        by_name = dict(zip(names, frame.data))
        state = sum(by_name[c].y[0] for c in ("parameters", "gradients", "optimizer states")) * 1e9
        psi = ModelConfig.preset("llama-3.1-8b").num_params()
        want = 16 * psi / dp if zero == 3 else 16 * psi
        assert state == pytest.approx(want, rel=1e-3), (zero, dp)
        assert "llama-3.1-8b" in frame.layout.title.text and f"ZeRO-{zero} over dp={dp}" in frame.layout.title.text


def _dashboard_cells() -> list[tuple[str, str, dict]]:
    """(chapter, dashboard, the cell's literal settings) for every dashboard cell with a static form."""
    import nbformat

    from playbook.book.render import dashboard_call

    found = []
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and (call := dashboard_call(cell.source)):
                found.append((path.stem, *call))
    return found


DASHBOARD_CELLS = _dashboard_cells()


@pytest.mark.parametrize("chapter,name,settings", DASHBOARD_CELLS, ids=[f"{c}-{n}" for c, n, _ in DASHBOARD_CELLS])
def test_every_static_dashboard_has_a_frame_per_setting_and_opens_where_the_cell_does(chapter, name, settings):
    """The very figure the book shows (same settings, cached for the build)."""
    import itertools

    from playbook.book.grid import META_KEY, SEP
    from playbook.book.static import STATIC

    fig = STATIC[name](**settings)
    controls = fig.layout.meta[META_KEY]["controls"]
    names = [f.name for f in fig.frames]
    assert len(names) == len(set(names))
    assert set(names) == {SEP.join(c) for c in itertools.product(*(c["labels"] for c in controls))}
    for c in controls:
        ctl = (fig.layout.sliders if c["kind"] == "slider" else fig.layout.updatemenus)[c["index"]]
        steps = ctl.steps if c["kind"] == "slider" else ctl.buttons
        assert [s.label for s in steps] == c["labels"]
    start = SEP.join(
        c["labels"][(fig.layout.sliders if c["kind"] == "slider" else fig.layout.updatemenus)[c["index"]].active]
        for c in controls
    )
    opened = next(f for f in fig.frames if f.name == start)
    assert [t.y for t in opened.data if t.visible is not False] == [t.y for t in fig.data if t.visible is not False]
    # each control, moved one step from the start, shows a different figure
    for i, c in enumerate(controls):
        labels = start.split(SEP)
        j = c["labels"].index(labels[i])
        labels[i] = c["labels"][j - 1 if j else 1]
        moved = next(f for f in fig.frames if f.name == SEP.join(labels))
        assert moved.to_plotly_json() != opened.to_plotly_json(), f"{name}: {c['name']} changes nothing"


def _cell(source, outputs=()):
    import nbformat

    cell = nbformat.v4.new_code_cell(source)
    cell.outputs = [nbformat.from_dict(o) for o in outputs]
    return cell


def test_a_page_draws_every_figure_once_swaps_dashboards_and_drops_what_needs_a_kernel(monkeypatch):
    import nbformat
    import plotly.graph_objects as go

    from playbook.book import render
    from playbook.book.render import PLOTLY, WIDGET, prepare

    # a stand-in static form that says which settings it got (the real grids are tested above)
    monkeypatch.setitem(render.STATIC, "memory_dashboard", lambda **kw: go.Figure(layout={"title": repr(kw)}))

    fig = {"data": [{"type": "bar", "y": [1, 2]}], "layout": {}}
    widget = {"output_type": "display_data", "metadata": {}, "data": {WIDGET: {"model_id": "x"}, "text/plain": "VBox"}}
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Title"),
        _cell(
            "show()",
            [
                {
                    "output_type": "display_data",
                    "metadata": {},
                    "data": {"text/html": "<script>window.PlotlyConfig = {};</script>"},
                },
                {"output_type": "display_data", "metadata": {}, "data": {PLOTLY: fig, "text/html": "<div>"}},
            ],
        ),
        _cell("run_on_ranks()", [widget, {"output_type": "stream", "name": "stdout", "text": "done\n"}]),
        _cell('memory_dashboard(model="llama-3.1-8b", dp=some_variable)', [widget]),
        _cell("mesh_dashboard(cluster)", [widget]),  # no static form: a note says where it lives
        nbformat.v4.new_markdown_cell("Keep this.\n\n(The dashboard needs a live kernel.)"),
        nbformat.v4.new_markdown_cell("(In a static export it stays empty.)"),
    ]
    ready, count = prepare(nb)
    assert count == 2
    html = json_dump(ready)
    assert WIDGET not in html and "PlotlyConfig" not in html and "done" in html
    assert html.count("A live dashboard: open this chapter in JupyterLab") == 1
    assert html.count('class=\\"playbook-plot\\"') == 2 and "{'model': 'llama-3.1-8b'}" in html
    assert [c.source for c in ready.cells if c.cell_type == "markdown"] == ["# Title", "Keep this."]


def json_dump(nb) -> str:
    import json

    return json.dumps(nb)


def test_dashboard_calls_are_found_by_name_with_their_literal_settings():
    from playbook.book.render import dashboard_call

    assert dashboard_call('x = 1\nmemory_dashboard(model="gpt-small", dp=4)') == (
        "memory_dashboard",
        {"model": "gpt-small", "dp": 4},
    )
    assert dashboard_call("pipeline_explorer(p=4, last_run=measured_timeline(m))") == ("pipeline_explorer", {"p": 4})
    assert dashboard_call("box = memory_dashboard()") is None  # not shown by the cell
    assert dashboard_call("print(1)") is None and dashboard_call("def (") is None


def test_a_failing_chapter_names_its_cell_and_error(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    nb.cells = [nbformat.v4.new_markdown_cell("# T"), _cell("x = 1"), _cell("y = x + 1"), _cell("{}['missing']")]
    nbformat.write(nb, tmp_path / "ch.ipynb")
    run = execute(tmp_path / "ch.ipynb", tmp_path / "out", timeout=120)
    assert run.error.startswith("ch.ipynb: cell 3 (\"{}['missing']\") raised KeyError: 'missing'"), run.error
    assert (tmp_path / "out" / "ch.ipynb").exists()


# ---- every chapter, once, then the book built from those runs ----------------------------------------
@pytest.fixture(scope="session")
def book_dirs(tmp_path_factory):
    """(executed notebooks, site, timings): shared by the chapter tests and the book test."""
    base = tmp_path_factory.mktemp("book")
    return base / "executed", base / "site", {}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_chapter_runs_top_to_bottom(notebook, book_dirs):
    executed, _, timings = book_dirs
    ran_in_lab = kept(notebook)  # Run All in JupyterLab (tests/browser) already executed it this session
    if ran_in_lab is not None:
        executed.mkdir(parents=True, exist_ok=True)
        shutil.copy(ran_in_lab, executed / notebook.name)
        meta = json.loads(ran_in_lab.read_text())["metadata"]["playbook_executed"]
        timings[notebook.name] = (meta["seconds"], (meta["load"],) * 3)
        print(f"{notebook.name}: executed by {meta['by']} in {meta['seconds']} s, not run again")
        return
    run = execute(notebook, executed, timeout=NOTEBOOK_LIMIT)
    timings[notebook.name] = (run.seconds, run.load)
    print(f"{notebook.name}: {run.seconds:.1f} s, load average {run.load[0]:.1f}")
    if run.error:
        pytest.fail(run.error, pytrace=False)


def _browser_or_skip():
    """Playwright and the system Chromium, or a skip (a failure under CI=true) saying which is missing."""
    why = None
    try:
        from playwright.sync_api import sync_playwright  # noqa: F401
    except ImportError:
        why = "Playwright's Python package is not installed (pip install playwright)"
    if why is None and not Path(CHROMIUM).exists():
        why = f"no browser at {CHROMIUM} (apt-get install chromium, or set PLAYBOOK_CHROMIUM)"
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true needs the browser check: {why}", pytrace=False)
        pytest.skip(why)


PLOT_STATE = """gd => JSON.stringify([gd.data.map(t => [t.x, t.y, t.base, t.visible]), gd.layout.title,
                                      gd.layout.annotations, gd.layout.shapes])"""
CHANGED = f"([gd, before]) => ({PLOT_STATE})(gd) !== before"


def _move_a_control(page, plot) -> tuple[str, int, int]:
    """Move the first control of a static dashboard off its active value: the first button menu's
    other button, else the first slider's far end. A dropdown is skipped: its options are drawn only
    while it is open, and plotly draws every menu's buttons in one container, so the first button on
    the page belongs to the first menu of type buttons, not to updatemenus[0].
    Returns (the control's kind, its index in the layout, the value index it now shows)."""
    menus = plot.evaluate("gd => (gd.layout.updatemenus || []).map(m => m.type || 'buttons')")
    if "buttons" in menus:
        k = menus.index("buttons")
        headers = plot.locator("g.updatemenu-container g.updatemenu-header-group")
        buttons = headers.nth(k).locator("g.updatemenu-button")
        target = 1 if plot.evaluate(f"gd => gd.layout.updatemenus[{k}].active || 0") == 0 else 0
        buttons.nth(target).click()
        return "menu", k, target
    box = plot.locator("rect.slider-rail-touch-rect").first.bounding_box()
    steps = plot.evaluate("gd => gd.layout.sliders[0].steps.length")
    target = 0 if plot.evaluate("gd => gd.layout.sliders[0].active") else steps - 1
    page.mouse.click(box["x"] + box["width"] * (0.02 if target == 0 else 0.98), box["y"] + box["height"] / 2)
    return "slider", 0, target


def _expected_frame(spec: dict, kind: str, index: int, target: int) -> dict:
    """The frame the page should show once the ``kind`` control at ``index`` shows ``target``, read from
    the figure's own JSON on the page (not from the page script under test)."""
    layout = spec["layout"]
    labels = []
    moved = False
    for c in layout["meta"]["playbook_grid"]["controls"]:
        ctl = (layout["sliders"] if c["kind"] == "slider" else layout["updatemenus"])[c["index"]]
        shown = ctl.get("active", 0)
        if c["kind"] == kind and c["index"] == index and not moved:
            shown, moved = target, True
        labels.append(c["labels"][shown])
    name = layout["meta"]["playbook_grid"]["sep"].join(labels)
    return next(f for f in spec["frames"] if f["name"] == name)


def test_the_book_builds_and_reads_offline_in_a_browser(book_dirs, tmp_path):
    from playbook.book.site import build

    executed_dir, site, timings = book_dirs
    executed = [executed_dir / p.name for p in NOTEBOOKS]
    missing = [p.name for p in executed if not p.exists()]
    if missing:
        pytest.skip(f"the chapter tests did not run for {', '.join(missing)} (run the whole file)")
    start = time.perf_counter()
    pages = build(executed, site)
    seconds = time.perf_counter() - start
    size = sum(f.stat().st_size for f in site.iterdir())
    print(f"book: built in {seconds:.1f} s (load {os.getloadavg()[0]:.1f}), {size / 1e6:.1f} MB in {site}")
    assert [p.href for p in pages] == [p.stem + ".html" for p in NOTEBOOKS]
    assert (site / "plotly.min.js").stat().st_size > 1_000_000
    for page in pages:
        text = (site / page.href).read_text()
        assert "window.PlotlyConfig" not in text, f"{page.href} embeds its own copy of plotly.js"
        assert "needs a live kernel" not in text, f"{page.href} still says a control needs a live kernel"
    _browser_or_skip()
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("PLAYBOOK_BOOK_SHOTS", tmp_path))
    if "PLAYBOOK_BOOK_SHOTS" not in os.environ and os.environ.get("PLAYBOOK_BROWSER_SHOTS") == "0":
        shots = None  # CI: screenshots are for people, and no check reads them (as in tests/browser)
    problems: list[str] = []
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, args=FLAGS, viewport={"width": 1280, "height": 900}
        )
        try:
            context.route(
                "**/*",
                lambda route: route.continue_() if route.request.url.startswith("file://") else route.abort(),
            )
            for entry in [{"href": "index.html", "figures": 0, "dashboards": []}] + [p.__dict__ for p in pages]:
                problems += _check_page(context, site, entry, shots)
        finally:
            context.close()
    assert not problems, "\n".join(problems)


def _check_page(context, site: Path, entry: dict, shots: Path | None) -> list[str]:
    page = context.new_page()
    href, problems = entry["href"], []
    page.on("console", lambda m: m.type == "error" and problems.append(f"{href}: console error: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"{href}: page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"{href}: request failed or blocked: {r.url}"))
    page.goto((site / href).resolve().as_uri(), wait_until="load")
    want = entry["figures"]
    try:
        page.wait_for_function(
            f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {want}", timeout=60_000
        )
    except Exception:  # noqa: BLE001 - reported as a count below
        pass
    drawn = page.evaluate("document.querySelectorAll('.js-plotly-plot').length")
    if drawn != want:
        problems.append(f"{href}: {drawn} plotly figures drawn, its notebook makes {want}")
    if href != "index.html" and not page.locator("nav.book a[href='index.html']").count():
        problems.append(f"{href}: no link back to the contents")
    plots = page.locator(".js-plotly-plot")
    grids = [
        plots.nth(i) for i in range(drawn) if plots.nth(i).evaluate("gd => !!(gd.layout.meta || {}).playbook_grid")
    ]
    if len(entry["dashboards"]) != len(grids):
        problems.append(f"{href}: {len(grids)} static dashboards drawn for {entry['dashboards']}")
    for i, plot in enumerate(grids):
        plot.scroll_into_view_if_needed()
        before = plot.evaluate(PLOT_STATE)
        spec = json.loads(page.locator(f"#{plot.get_attribute('id')}-json").text_content())
        kind, index, target = _move_a_control(page, plot)
        try:
            page.wait_for_function(CHANGED, arg=[plot.element_handle(), before], timeout=10_000)
        except Exception:  # noqa: BLE001 - reported below
            problems.append(f"{href}: moving the first {kind} on dashboard {i} did not change its figure")
            continue
        want = _expected_frame(spec, kind, index, target)
        shown = plot.evaluate("gd => gd.layout.title.text")
        if shown != want["layout"]["title"]["text"]:
            problems.append(
                f"{href}: dashboard {i} shows {shown!r} after its {kind} {index} moved to {target}, "
                f"not its frame {want['name']!r}"
            )
        ys = plot.evaluate("gd => gd.data.map(t => t.visible === false ? null : t.y)")
        frame_ys = [None if t.get("visible") is False else t.get("y") for t in want["data"]]
        if all(isinstance(y, list) or y is None for y in frame_ys) and ys != frame_ys:
            problems.append(f"{href}: dashboard {i} draws other data than its frame {want['name']!r}")
        if shots is not None:
            plot.screenshot(path=str(shots / f"{Path(href).stem}-dashboard{i}.png"))
    page.close()
    return problems


def test_a_kept_execution_is_reused_only_from_this_session_and_these_sources(tmp_path, monkeypatch):
    from playbook.book.executed import SESSION, executed_path, source_key

    (tmp_path / "notebooks").mkdir()
    source = tmp_path / "notebooks" / "ch.ipynb"
    source.write_text(json.dumps({"cells": [{"cell_type": "code", "source": "1 + 1", "metadata": {}}]}))
    monkeypatch.setenv(SESSION, "this-session")
    path = executed_path(source)
    assert path == tmp_path / "build" / "executed" / "ch.ipynb"
    path.parent.mkdir(parents=True)

    def keep(session, key):
        meta = {"playbook_executed": {"session": session, "source_key": key}}
        path.write_text(json.dumps({"cells": [], "metadata": meta}))

    keep("this-session", source_key(source))
    assert kept(source) == path
    keep("an-earlier-session", source_key(source))  # other code in playbook/ may have run it
    assert kept(source) is None
    keep("this-session", source_key(source))
    source.write_text(json.dumps({"cells": [{"cell_type": "code", "source": "1 + 2", "metadata": {}}]}))
    assert kept(source) is None  # a cell changed since
