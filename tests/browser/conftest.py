"""Fixtures for the chapters in a real JupyterLab under headless Chromium.

One JupyterLab server and one browser for this package's tests (closed before tests/book/test_book.py
opens its own Playwright: two sync Playwrights cannot share a thread); per notebook, a fresh tab that opens
the notebook and runs it all once (``ran``), shared by the tests on that notebook; its kernel is shut
down when they are done. Screenshots and timings go to ``build/browser-artifacts/``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from .lab_page import NotebookPage, find_chromium, launch
from .lab_process import LabServer

ROOT = Path(__file__).resolve().parents[2]
# every notebook nbmake collects (setup.sh runs pytest --nbmake notebooks/ after these tests)
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
IDS = [str(p.relative_to(ROOT / "notebooks").with_suffix("")) for p in NOTEBOOKS]
ARTIFACTS = Path(os.environ.get("PLAYBOOK_BROWSER_ARTIFACTS", ROOT / "build" / "browser-artifacts"))
TIMINGS: dict[str, dict[str, float]] = {}
LAYOUT: dict[str, list[str]] = {}  # notebook -> what layout_problems found at 1280 px (listed after the run)


def save_executed(source: Path, executed: dict, seconds: float) -> Path:
    """Keep the notebook as Run All left it (before any control moves), keyed on its sources, for the
    book (``playbook.book``): a chapter executed here is not executed a second time to build it."""
    import json

    from playbook.book.executed import SESSION, executed_path, source_key

    executed.setdefault("metadata", {})["playbook_executed"] = {
        "source_key": source_key(source),
        "session": os.environ.get(SESSION, ""),
        "by": "JupyterLab Run All (tests/browser)",
        "seconds": round(seconds, 1),
        "load": round(os.getloadavg()[0], 1),
    }
    for cell in executed.get("cells", []):  # JupyterLab writes "attachments": null, which nbformat refuses
        for key in [k for k, v in cell.items() if v is None]:
            del cell[key]
    path = executed_path(source)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(executed, indent=1))
    return path


def why_not_here() -> str | None:
    """Why the browser tests cannot run on this machine, or None when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing (pip install -e '.[dev]')"
    if find_chromium() is None:
        return "no chromium on PATH (Debian/Ubuntu: apt-get install chromium; or set PLAYBOOK_CHROMIUM=/path/to/it)"
    return None


@pytest.fixture(scope="package")
def lab():
    server = LabServer(ROOT / "notebooks")
    yield server
    leftover = server.stop()
    server.cleanup()
    assert not leftover, f"processes still running after the server and its kernels stopped (killed): {leftover}"


@pytest.fixture(scope="package")
def browser_context():
    from playwright.sync_api import sync_playwright

    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    profile = Path(tempfile.mkdtemp(prefix="playbook-chromium-"))
    playwright = sync_playwright().start()
    context = launch(playwright, profile, find_chromium())
    yield context
    context.close()
    playwright.stop()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module", params=IDS)
def ran(request, lab, browser_context) -> NotebookPage:
    """The notebook open in a fresh tab after Run All (outputs cleared first), screenshots taken."""
    name, key = f"{request.param}.ipynb", request.param.replace("/", "__")
    page = NotebookPage(browser_context, lab, name, ARTIFACTS / key)
    times = TIMINGS.setdefault(key, {})
    try:
        times["open"] = page.open()
        times["run_all"] = page.run_all()
        times["load"] = os.getloadavg()[0]
        start = time.monotonic()
        page.settled_problems = page.widget_problems()
        page.layout_seen = page.layout_problems()
        times["settle"] = time.monotonic() - start
        save_executed(NOTEBOOKS[IDS.index(request.param)], page.notebook(), times["run_all"])
        if os.environ.get("PLAYBOOK_BROWSER_SHOTS", "1") != "0":  # for people to look at; nothing reads them
            start = time.monotonic()
            page.screenshot_outputs()
            times["screenshots"] = time.monotonic() - start
    except Exception:
        page.screenshot("failed")
        raise
    yield page
    kernel = page.js("n => playbookTest.kernelId(n)", name)
    page.close()
    if kernel:
        lab.api(f"kernels/{kernel}", method="DELETE")


def pytest_terminal_summary(terminalreporter):
    if not TIMINGS:
        return
    terminalreporter.section("JupyterLab in Chromium: seconds per notebook")
    for stem, t in TIMINGS.items():
        parts = ", ".join(f"{k} {v:.0f} s" for k, v in t.items() if k not in ("load", "moved"))
        parts += f", {t['moved']:.0f} controls moved" if "moved" in t else ""
        terminalreporter.write_line(f"{stem}: {parts} (1-min load average {t.get('load', float('nan')):.1f})")
    terminalreporter.write_line(f"screenshots: {ARTIFACTS}")
    if LAYOUT:
        terminalreporter.section("layout at 1280 px with the file browser open: what the check found")
        for name, problems in LAYOUT.items():
            terminalreporter.write_line(f"{name}: " + ("fits" if not problems else f"{len(problems)} problems"))
            for line in problems:
                terminalreporter.write_line(f"  {line}")
