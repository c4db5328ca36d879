"""Insert a chapter's exercise cells (markdown statement and hint, the blank, the check, the folded
solution) into its notebook, before a given cell, once. Used by the per-chapter scripts here:

    python notebooks/_exercise_cells/01.py            # edits notebooks/01_*.ipynb in place

The solution shown is the checker's own ``solution`` (its source, renamed to the learner's
function), so the folded answer and the one the tests check cannot drift apart.
"""

from __future__ import annotations

import glob
import inspect
import os
import sys

import nbformat

HEADING = "## Exercise"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # notebooks/


def solution_markdown(*pairs) -> str:
    """A folded markdown cell with the source of each (function, name the learner uses)."""
    code = "\n\n".join(inspect.getsource(fn).replace(f"def {fn.__name__}(", f"def {name}(", 1) for fn, name in pairs)
    return f"<details><summary><b>Solution</b> (click to open)</summary>\n\n```python\n{code.rstrip()}\n```\n</details>"


def insert(chapter: str, cells: list[tuple[str, str]], before: str | None, root: str = ROOT) -> str:
    """Put ``cells`` [(kind, source)] before the last markdown cell starting with ``before`` (at the
    end if None or not found) in ``<root>/<chapter>_*.ipynb``; nothing if already there."""
    (path,) = glob.glob(os.path.join(root, f"{chapter}_*.ipynb"))
    nb = nbformat.read(path, as_version=4)
    if any(c.cell_type == "markdown" and c.source.startswith(HEADING) for c in nb.cells):
        return f"{path}: already has an exercise section; left as it is"
    new = [nbformat.v4.new_markdown_cell(s) if kind == "md" else nbformat.v4.new_code_cell(s) for kind, s in cells]
    at = len(nb.cells)
    if before:
        hits = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith(before)]
        at = hits[-1] if hits else at  # the closing questions, not one asked mid-chapter
    if not all("id" in c for c in nb.cells):  # a notebook format without cell ids: none for ours either
        for c in new:
            c.pop("id", None)
    nb.cells[at:at] = new
    nbformat.write(nb, path)
    return f"{path}: {len(new)} exercise cells inserted at position {at} of {len(nb.cells)}"


if __name__ == "__main__":
    sys.exit("run one of the chapter scripts (01.py, 02.py, ...), not this helper")
