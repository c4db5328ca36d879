"""Run a chapter top to bottom in a fresh kernel and keep every output: the one execution that both
the test suite (a cell error fails the chapter) and the static book (it renders what ran) rely on.

nbclient starts a kernel in the notebooks' folder, runs each code cell in order and stops at the
first error; the executed notebook is written beside the others in ``out_dir`` with the wall time
in its metadata, so the book builder never runs a chapter a second time.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

META = "playbook_book"  # notebook metadata key: {"seconds": wall time, "load": load average after}


@dataclass
class Execution:
    """What running one notebook gave: where the executed copy is, how long it took, what failed."""

    source: Path
    executed: Path
    seconds: float
    load: tuple[float, float, float]
    error: str | None = None  # one paragraph naming the cell and the error; None when every cell ran


def _failing_cell(nb) -> tuple[int, str]:
    """The index and first source line of the last cell that produced an error output."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return i, (cell.source.strip().splitlines() or [""])[0]
    return -1, ""


def execute(source: Path, out_dir: Path, *, timeout: int = 300, kernel: str = "python3") -> Execution:
    """Execute ``source`` in a fresh ``kernel`` (working directory: the notebook's folder) with at most
    ``timeout`` seconds per cell, and write the executed copy to ``out_dir / source.name``.

    Never raises for a failing notebook: the returned :class:`Execution` carries the error (cell
    number, its first line, the exception name and message, the traceback's tail) and the executed
    copy still holds every output up to the failure.
    """
    source, out_dir = Path(source), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(source, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=kernel,
        resources={"metadata": {"path": str(source.parent.resolve())}},
        record_timing=False,
        store_widget_state=False,  # the book swaps widget outputs for static figures
    )
    error = None
    start = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as e:
        index, first = _failing_cell(nb)
        error = f"{source.name}: cell {index} ({first!r}) raised {e.ename}: {e.evalue}\n{_tail(str(e))}"
    except CellTimeoutError:
        error = f"{source.name}: a cell ran past the {timeout} s limit per cell (timeout=...)"
    except DeadKernelError as e:
        error = f"{source.name}: the kernel died ({e})"
    seconds = time.perf_counter() - start
    load = os.getloadavg()
    nb.metadata[META] = {"seconds": round(seconds, 2), "load": [round(x, 2) for x in load], "error": error}
    executed = out_dir / source.name
    nbformat.write(nb, executed)
    return Execution(source, executed, seconds, load, error)


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


__all__ = ["META", "Execution", "execute"]
