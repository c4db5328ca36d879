"""Every chapter as a learner meets it: opened in JupyterLab under headless Chromium, Run All, then
every dashboard control moved once.

Runs when Chromium and Playwright are present; otherwise one skip line, except under ``CI=true``
where a missing browser is a failure. Screenshots: ``build/browser-artifacts/<notebook>/``.
"""

from __future__ import annotations

import os
import re
import time

import pytest

from .conftest import LAYOUT, TIMINGS, why_not_here
from .lab_page import first_difference

pytestmark = pytest.mark.browser

_missing = why_not_here()
if _missing and os.environ.get("CI") == "true":
    pytest.fail(f"CI=true, and the JupyterLab browser tests cannot run: {_missing}", pytrace=False)
if _missing:
    pytest.skip(f"JupyterLab browser tests skipped: {_missing}", allow_module_level=True)


def test_run_all_shows_no_error_and_every_widget(ran):
    doc = ran.notebook()
    problems = []
    for i, cell in enumerate(doc["cells"]):
        if cell["cell_type"] != "code":
            continue
        expected = "raises-exception" in cell.get("metadata", {}).get("tags", [])  # as nbmake and Run All
        for out in cell.get("outputs", []):
            if out["output_type"] == "error" and not expected:
                problems.append(f"cell {i}: {out['ename']}: {out['evalue']}")
        if cell.get("execution_count") is None and cell["source"].strip():
            problems.append(f"cell {i}: never ran (Run All stopped before it)")
    problems += [f"a dialog is open: {text.strip()[:300]}" for text in ran.dialogs()]
    problems += ran.settled_problems
    problems += ran.kernel.others  # its errors are the error outputs above
    assert not problems, f"{ran.name} in JupyterLab:\n" + "\n".join(problems)


def test_the_chapter_is_laid_out_at_1280_px_with_the_file_browser_open(ran):
    """After Run All the page is 1280 px wide with the file browser open beside the notebook, the
    layout ``NotebookPage.layout_problems`` judges: no output wider than its cell, no text-table row
    that wraps, no clipped control text, no plotly title, legend or annotation cut at its figure's
    edge, every row of a plotly table shown. What it finds is also listed after the run ("layout at
    1280 px"); every chapter fits (issue 48)."""
    where = f"{ran.name} at {ran.layout['width']} px, file browser {ran.layout['fileBrowser']} px wide"
    assert ran.layout["width"] == 1280 and ran.layout["fileBrowser"] > 0, f"{where}: not the layout under test"
    LAYOUT[ran.name] = list(ran.layout_seen)
    assert not ran.layout_seen, f"{where}:\n" + "\n".join(ran.layout_seen)


def test_every_control_changes_a_figure_or_says_why_not(ran):
    """Each slider, dropdown, toggle row and checkbox, moved one step from the dashboard's first
    settings, changes the data or layout of a plotly figure in its cell, or is disabled with a reason
    (a tooltip, or a line in the cell's output that names it). Moving it back must bring the figure
    back: a dashboard that keeps stale state fails here."""
    problems, moved, start = [], 0, time.monotonic()
    seen = len(ran.kernel.errors), len(ran.kernel.others)
    count = len(ran.controls())
    for k in range(count):
        c = ran.controls()[k]  # re-read: a dashboard may rebuild or re-enable its controls
        where = f"cell {c['cell']} {c['kind']} {c['label']!r} at {c['value']!r}"
        if c["disabled"]:
            if not c["reason"]:
                problems.append(f"{where}: disabled, and nothing on screen says why")
            continue
        before = ran.figures(c["cell"])
        if not before:
            problems.append(f"{where}: no plotly figure in its cell to change")
            continue
        ran.kernel.doing = f"moving {where}"
        action = ran.move(c)
        changed = ran.wait_changed(c["cell"], before)
        after, moved = ran.controls()[k], moved + 1
        if after["value"] == c["value"]:
            problems.append(f"{where}: did not move ({action})")
            continue
        if not changed:
            problems.append(f"{where} -> {after['value']!r}: no figure changed, and the control is not disabled")
            slug = re.sub(r"\W+", "-", c["label"]).strip("-") or c["kind"]
            ran.screenshot_cell(c["cell"], f"cell-{c['cell']:02d}-{slug}-unchanged")
        moved_to = ran.figures(c["cell"])
        ran.move(c, back=True)
        ran.wait_changed(c["cell"], moved_to, timeout=10.0 if changed else 2.0)
        if ran.figures(c["cell"]) != before:
            diff = first_difference(before, ran.figures(c["cell"]))
            problems.append(f"{where} -> {after['value']!r} and back: the figure did not come back ({diff})")
        if ran.controls()[k]["value"] != c["value"]:
            problems.append(f"{where}: could not move it back (now {ran.controls()[k]['value']!r})")
    TIMINGS[ran.artifacts.name]["controls"] = time.monotonic() - start
    TIMINGS[ran.artifacts.name]["moved"] = moved
    problems += ran.kernel.errors[seen[0] :] + ran.kernel.others[seen[1] :]
    assert not problems, f"{ran.name}, {count} controls walked:\n" + "\n".join(problems)
