"""Executed chapters kept under ``build/executed/``, keyed on their sources, so that a chapter run
once (by JupyterLab's Run All in ``tests/browser``, or by :mod:`~playbook.book.execute`) is not
run again to build the book in the same test session.

The key is a hash of every cell's type and source (an edit to any cell makes the kept copy stale)
and the test session that made it (``PLAYBOOK_TEST_SESSION``, set by ``tests/conftest.py``): a copy
left by an earlier session, run against other code in ``playbook/``, is never reused.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

SESSION = "PLAYBOOK_TEST_SESSION"


def source_key(source: Path) -> str:
    """sha256 over the notebook's cells (type and source), in order."""
    cells = json.loads(Path(source).read_text())["cells"]
    digest = hashlib.sha256()
    for cell in cells:
        text = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        digest.update(cell["cell_type"].encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()


def executed_path(source: Path) -> Path:
    """Where the executed copy of ``notebooks/NAME.ipynb`` is kept: ``build/executed/NAME.ipynb``
    at the repository root (the notebooks folder's parent)."""
    source = Path(source).resolve()
    return source.parent.parent / "build" / "executed" / source.name


def kept(source: Path) -> Path | None:
    """The kept executed copy of ``source`` if its sources are still those of ``source``, else None."""
    path = executed_path(source)
    if not path.exists():
        return None
    meta = json.loads(path.read_text()).get("metadata", {}).get("playbook_executed", {})
    session = os.environ.get(SESSION)
    fresh = session and meta.get("session") == session and meta.get("source_key") == source_key(source)
    if not fresh:
        return None
    try:  # a copy nbformat refuses is executed again instead
        import nbformat

        nbformat.validate(nbformat.read(path, as_version=4))
    except Exception:  # noqa: BLE001
        return None
    return path
