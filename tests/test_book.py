"""Every chapter runs top to bottom (this replaces nbmake: one test per notebook, executed once), and
the static book built from those very executions reads in a real browser without a network.

The chapter tests write their executed copies into one session folder; the book test builds the
site from them and opens every page in headless Chromium (Playwright driving the system's
``chromium``): no console error, no request that fails or leaves the machine, as many plotly
figures as the page's notebook makes, and on each static dashboard a control that changes a figure.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from playbook.book.execute import execute

ROOT = Path(__file__).resolve().parent.parent
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


@pytest.fixture(scope="session")
def book_dirs(tmp_path_factory):
    """(executed notebooks, site, timings): shared by the chapter tests and the book test."""
    base = tmp_path_factory.mktemp("book")
    return base / "executed", base / "site", {}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_chapter_runs_top_to_bottom(notebook, book_dirs):
    executed, _, timings = book_dirs
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


def _move_a_control(page, plot) -> str:
    """Click the first control of a static dashboard that is not at its active value; say which."""
    buttons = plot.locator("g.updatemenu-button")
    if buttons.count():
        active = plot.evaluate("gd => gd.layout.updatemenus[0].active")
        target = 1 if active == 0 else 0
        buttons.nth(target).click()
        return f"menu 0 → button {target}"
    rail = plot.locator("rect.slider-rail-touch-rect").first
    box = rail.bounding_box()
    active = plot.evaluate("gd => gd.layout.sliders[0].active")
    x = box["x"] + box["width"] * (0.05 if active else 0.95)
    page.mouse.click(x, box["y"] + box["height"] / 2)
    return "slider 0"


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


def _check_page(context, site: Path, entry: dict, shots: Path) -> list[str]:
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
        moved = _move_a_control(page, plot)
        try:
            page.wait_for_function(CHANGED, arg=[plot.element_handle(), before], timeout=10_000)
        except Exception:  # noqa: BLE001 - reported below
            problems.append(f"{href}: moving {moved} on dashboard {i} did not change its figure")
        plot.screenshot(path=str(shots / f"{Path(href).stem}-dashboard{i}.png"))
    page.close()
    return problems
