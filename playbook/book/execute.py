"""Run a chapter top to bottom in a fresh kernel and keep every output: the one execution that both
the test suite (a cell error fails the chapter) and the static book (it renders what ran) rely on.

nbclient starts a kernel in the notebooks' folder, runs each code cell in order and stops at the
first error; the executed notebook is written beside the others in ``out_dir`` with the wall time
in its metadata, so the book builder never runs a chapter a second time.
"""

from __future__ import annotations

import os
import re
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


def _first_line(nb, index: int) -> str:
    return (nb.cells[index].source.strip().splitlines() or [""])[0] if 0 <= index < len(nb.cells) else ""


def execute(source: Path, out_dir: Path, *, timeout: float = 600, kernel: str = "python3") -> Execution:
    """Execute ``source`` in a fresh ``kernel`` (working directory: the notebook's folder) within
    ``timeout`` seconds for the whole notebook, and write the executed copy to ``out_dir / source.name``.

    Never raises for a failing notebook: the returned :class:`Execution` carries the error (cell
    number, its first line, the exception name and message, the traceback's tail) and the executed
    copy still holds every output up to the failure.
    """
    source, out_dir = Path(source), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(source, as_version=4)
    deadline = time.monotonic() + timeout
    client = NotebookClient(
        nb,
        timeout_func=lambda cell: max(1, int(deadline - time.monotonic())),  # what is left of the budget
        kernel_name=kernel,
        resources={"metadata": {"path": str(source.parent.resolve())}},
        record_timing=False,
        store_widget_state=False,  # the book swaps widget outputs for static figures
    )
    running = [-1]  # index of the cell being executed, for the error message
    client.on_cell_start = lambda cell, cell_index: running.__setitem__(0, cell_index)
    error = None
    start = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as e:
        index = running[0]
        error = (
            f"{source.name}: cell {index} ({_first_line(nb, index)!r}) raised {e.ename}: {e.evalue}\n{_tail(str(e))}"
        )
    except CellTimeoutError:
        error = (
            f"{source.name}: cell {running[0]} ({_first_line(nb, running[0])!r}) was still running when the notebook's {timeout:.0f} s ran out "
            "(raise it with timeout=..., or PLAYBOOK_NOTEBOOK_TIMEOUT for the tests)"
        )
    except DeadKernelError as e:
        error = f"{source.name}: the kernel died ({e})"
    seconds = time.perf_counter() - start
    load = os.getloadavg()
    nb.metadata[META] = {"seconds": round(seconds, 2), "load": [round(x, 2) for x in load], "error": error}
    executed = out_dir / source.name
    nbformat.write(nb, executed)
    return Execution(source, executed, seconds, load, error)


def _tail(text: str, lines: int = 25) -> str:
    """The last ``lines`` of a traceback, without the terminal colour codes IPython adds."""
    return "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", text).strip().splitlines()[-lines:])


__all__ = ["META", "Execution", "execute"]
