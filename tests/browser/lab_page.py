"""A notebook open in JupyterLab under headless Chromium: open it, Run All, read back what a learner
would see (error outputs, dialogs, widgets that failed to render), walk every dashboard control.

The page is driven through the application object JupyterLab exposes with
``--LabApp.expose_app_in_browser`` (``window.jupyterapp``): its commands are what the menus call.
Kernel messages are read off the page's websocket, so an exception raised in a widget callback
(which JupyterLab shows in the log console, not under a cell) is seen too.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_FLAGS = [  # keep Chromium off the network and away from a GPU it does not have
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# A laptop's window with JupyterLab's file browser open beside the notebook: the narrowest layout a
# learner is likely to read a chapter in, so every output must fit its cell here (layout_problems)
VIEWPORT = {"width": 1280, "height": 900}
QUIET = 0.3  # seconds with no kernel status change and no DOM change in a cell: a control's move has settled
JS = (Path(__file__).parent / "lab_page.js").read_text()


def find_chromium() -> str | None:
    """Chromium from the distribution (``PLAYBOOK_CHROMIUM`` overrides), or None."""
    return shutil.which(os.environ.get("PLAYBOOK_CHROMIUM", "chromium"))


def launch(playwright, profile: Path, executable: str):
    """A fresh persistent Chromium profile in ``profile``; Playwright's own browser download is never used."""
    return playwright.chromium.launch_persistent_context(
        str(profile), executable_path=executable, headless=True, args=CHROMIUM_FLAGS, viewport=VIEWPORT
    )


def kernel_messages(payload: str | bytes) -> list[dict]:
    """Decode one websocket frame of the kernel channel (JSON, or the binary v1 protocol) to messages."""
    if isinstance(payload, str):
        msg = json.loads(payload)
        return [msg] if isinstance(msg, dict) else []
    (n,) = struct.unpack_from("<Q", payload)
    offsets = list(struct.unpack_from(f"<{n}Q", payload, 8)) + [len(payload)]
    parts = [payload[a:b] for a, b in zip(offsets, offsets[1:])]  # channel, header, parent, metadata, content
    if len(parts) < 5:
        return []
    return [{"channel": parts[0].decode(), "header": json.loads(parts[1]), "content": json.loads(parts[4])}]


def first_difference(a, b, path: str = "") -> str:
    """Where two JSON-like values first differ, as ``path: a != b`` (for messages)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return first_difference(a.get(key), b.get(key), f"{path}.{key}")
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path or 'figures'}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return first_difference(x, y, f"{path}[{i}]")
    return f"{path or 'figures'}: {str(a)[:120]} != {str(b)[:120]}"


@dataclass
class KernelLog:
    """What the kernel reported that a learner should never see, each tagged with what was being done:
    ``errors`` (error messages: Run All also shows these under their cells) and ``others`` (a
    traceback printed to stderr, a kernel restarting or dead)."""

    doing: str = "opening"
    errors: list[str] = field(default_factory=list)
    others: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return self.errors + self.others

    def on_frame(self, payload: str | bytes) -> None:
        try:
            messages = kernel_messages(payload)
        except (ValueError, struct.error):
            return
        for msg in messages:
            kind, content = msg.get("header", {}).get("msg_type"), msg.get("content", {})
            if kind == "error":
                self.errors.append(f"{self.doing}: {content.get('ename')}: {content.get('evalue')}")
            elif kind == "stream" and content.get("name") == "stderr" and "Traceback" in content.get("text", ""):
                self.others.append(f"{self.doing}: traceback on stderr: {content['text'][-400:]}")
            elif kind == "status" and content.get("execution_state") in ("restarting", "dead"):
                self.others.append(f"{self.doing}: the kernel is {content['execution_state']}")


class NotebookPage:
    """One notebook in a fresh browser tab of ``context``, served by ``server`` (a ``LabServer``)."""

    def __init__(self, context, server, name: str, artifacts: Path):
        self.name, self.server, self.artifacts = name, server, artifacts
        self.artifacts.mkdir(parents=True, exist_ok=True)
        self.kernel = KernelLog()
        self.settled_problems: list[str] = []  # widget_problems() after Run All (the fixture fills it)
        self.layout_seen: list[str] = []  # layout_problems() after Run All (the fixture fills it)
        self.layout: dict = {}  # the window's width and the file browser's, as open() left them
        self.console: list[str] = []
        self.page = context.new_page()
        self.page.on("websocket", lambda ws: ws.on("framereceived", self.kernel.on_frame))
        self.page.on("console", lambda m: m.type == "error" and self.console.append(m.text))
        self.page.on("pageerror", lambda e: self.console.append(f"uncaught: {e}"))
        self.page.add_init_script(JS)

    def js(self, expression: str, arg=None):
        return self.page.evaluate(expression, arg)

    def open(self, timeout: float = 120.0) -> float:
        """Load the notebook and wait for its kernel to be started and idle; returns seconds."""
        start = time.monotonic()
        self.page.goto(self.server.notebook_url(self.name), timeout=timeout * 1000)
        self.page.wait_for_function(
            "n => window.playbookTest && playbookTest.panel(n)", arg=self.name, timeout=timeout * 1000
        )
        self.js("n => playbookTest.kernelReady(n)", self.name)  # awaits the session and kernel
        self.page.wait_for_function(
            "n => playbookTest.kernelStatus(n) === 'idle'", arg=self.name, timeout=timeout * 1000
        )
        self.layout = self.js("() => playbookTest.layout()")
        if not self.layout["fileBrowser"]:
            self.layout = self.js("() => playbookTest.openFileBrowser()")
        return time.monotonic() - start

    def run_all(self, timeout: float = 600.0) -> float:
        """Run All (the menu's command) and wait until no cell is queued or running; returns seconds."""
        self.kernel.doing = "Run All"
        start = time.monotonic()
        self.js("n => playbookTest.runAll(n)", self.name)
        self.page.wait_for_function(
            "n => playbookTest.runFinished(n)", arg=self.name, timeout=timeout * 1000, polling=500
        )
        return time.monotonic() - start

    def notebook(self) -> dict:
        """The notebook as JupyterLab holds it now (nbformat JSON, outputs included)."""
        return self.js("n => playbookTest.panel(n).context.model.toJSON()", self.name)

    def dialogs(self) -> list[str]:
        return self.js("() => Array.from(document.querySelectorAll('.jp-Dialog')).map(d => d.innerText)")

    def widget_problems(self, settle: float = 60.0) -> list[str]:
        """Cells showing "Error displaying widget", still "Loading widget..." or an empty figure, once
        the page has settled (no widget loading and the number of figures steady for 2 s; at most ``settle`` s)."""
        deadline, plots, steady = time.monotonic() + settle, -1, 0
        while time.monotonic() < deadline:
            found = self.js("n => playbookTest.widgetProblems(n)", self.name)
            count = self.js("() => playbookTest.plotCount()")
            steady = steady + 1 if count == plots and not any("Loading widget" in p for p in found) else 0
            plots = count
            if steady >= 4:
                break
            time.sleep(0.5)
        return found + self.js("n => playbookTest.emptyFigures(n)", self.name)

    def layout_problems(self) -> list[str]:
        """What a learner cannot read in this window, per cell: an output wider than its cell, a text
        table whose rows wrap, a clipped control label, and in plotly figures a title, legend or
        annotation cut at the figure's edge, a table showing fewer rows than its data holds or a header
        wider than its column (``playbookTest.layoutProblems``; one evaluation over the page)."""
        deadline = time.monotonic() + 10.0
        while self.js("() => playbookTest.unsizedPlots()") and time.monotonic() < deadline:
            time.sleep(0.2)  # plotly fits a figure to its cell after drawing it at its default width
        return self.js("n => playbookTest.layoutProblems(n)", self.name)

    def screenshot_outputs(self) -> list[Path]:
        """One PNG per code cell whose output holds a widget or a plotly figure: ``cell-NN.png``, all
        taken in one viewport taller than the tallest of them (each resize lays the whole notebook out
        again: one resize per notebook, not two per cell)."""
        cells = self.js("n => playbookTest.visualCells(n)", self.name)
        if not cells:
            return []
        tallest = max(self.cell(i).bounding_box()["height"] for i in cells)
        self.page.set_viewport_size({**VIEWPORT, "height": max(VIEWPORT["height"], int(tallest) + 400)})
        try:
            return [self._shoot(i, f"cell-{i:02d}") for i in cells]
        finally:
            self.page.set_viewport_size(VIEWPORT)

    def screenshot_cell(self, index: int, label: str) -> Path:
        """The whole cell, in a viewport taller than it, so the toolbar and status bar cover none of it."""
        height = self.cell(index).bounding_box()["height"]
        self.page.set_viewport_size({**VIEWPORT, "height": max(VIEWPORT["height"], int(height) + 400)})
        try:
            return self._shoot(index, label)
        finally:
            self.page.set_viewport_size(VIEWPORT)

    def _shoot(self, index: int, label: str) -> Path:
        path, cell = self.artifacts / f"{label}.png", self.cell(index)
        cell.scroll_into_view_if_needed()
        cell.screenshot(path=str(path), animations="disabled")
        return path

    def screenshot(self, label: str) -> Path:
        path = self.artifacts / f"{label}.png"
        self.page.screenshot(path=str(path))
        return path

    def cell(self, index: int):
        return self.page.locator(f'[data-playbook-cell="{self.name}:{index}"]')

    # ---- the controls walk -------------------------------------------------------------------
    def controls(self) -> list[dict]:
        """Every slider, dropdown, toggle-button row and checkbox under a cell: id, cell, kind, label, state."""
        return self.js("n => playbookTest.controls(n)", self.name)

    def figures(self, cell: int) -> list[dict]:
        """The data and layout of every plotly figure under ``cell`` (compared as values: plotly
        may reorder an object's keys when it redraws)."""
        return json.loads(self.js("([n, c]) => playbookTest.figures(n, c)", [self.name, cell]))

    def move(self, control: dict, back: bool = False) -> str:
        """Move one control one step (the next option, the next value), or ``back`` to where it was.
        From just before the move, the page watches the control's cell (see :meth:`wait_changed`)."""
        self.js("([n, c]) => playbookTest.watch(n, c)", [self.name, control["cell"]])
        loc = self.page.locator(f'[data-playbook-control="{control["id"]}"]')
        kind, i = control["kind"], control["selected"]
        j = i - 1 if i == control["options"] - 1 else i + 1  # the option a step away
        if kind == "slider":
            key = "ArrowLeft" if control["at_end"] != back else "ArrowRight"
            handle = loc.locator(".noUi-handle").first
            handle.focus()
            handle.press(key)
            return key
        if kind == "dropdown":
            loc.locator("select").select_option(index=i if back else j)
            return f"option {i if back else j}"
        if kind == "toggle":
            loc.locator("button").nth(i if back else j).click()
            return f"button {i if back else j}"
        loc.locator("input[type=checkbox]").click()
        return "click"

    def wait_changed(self, cell: int, before: list[dict], timeout: float = 10.0) -> bool:
        """Whether the cell's figures differ from ``before`` within ``timeout`` seconds of the last
        :meth:`move`. Waits for the move to settle: the kernel has handled the control's message and
        is idle, and neither the kernel nor the cell's output area has changed for ``QUIET`` s (one
        update can take several messages and redraws: a snapshot between two is not the result).
        Only a move that changed nothing waits out the timeout, looking again every 0.2 s."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout  # the skip path runs without it

        deadline, changed = time.monotonic() + timeout, False
        while True:
            left = deadline - time.monotonic()
            try:
                self.page.wait_for_function(
                    "([n, q]) => playbookTest.settled(n, q)",
                    arg=[self.name, QUIET * 1000],
                    timeout=max(left, 0.05) * 1000,
                    polling=50,
                )
            except PlaywrightTimeout:
                pass
            changed = self.figures(cell) != before
            if changed or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        self.js("() => playbookTest.unwatch()")
        self.wait_idle()
        return changed

    def wait_idle(self, timeout: float = 60.0) -> None:
        self.page.wait_for_function(
            "n => playbookTest.kernelStatus(n) === 'idle'", arg=self.name, timeout=timeout * 1000, polling=200
        )

    def close(self) -> None:
        self.page.close()
