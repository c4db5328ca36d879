"""A notebook without its outputs, as the chapters are committed: git's clean filter for notebooks/*.ipynb.

``./setup.sh`` installs it (``git config filter.playbook-strip-outputs.clean``) and ``.gitattributes``
applies it, so a chapter saved by JupyterLab with its outputs (autosave does it every two minutes) is
stored without them while the working copy keeps them. Reads a notebook on stdin, writes it on stdout:
outputs emptied, execution counts cleared, nothing else changed (the JSON is written as Jupyter writes
it, so a clean notebook passes through byte for byte). Standard library only: git runs it with the
system's ``python3``, inside or outside the virtual environment.
"""

from __future__ import annotations

import json
import sys


def strip(text: str) -> str:
    """``text`` (a notebook's JSON) without outputs and execution counts; anything else unchanged."""
    try:
        nb = json.loads(text)
    except json.JSONDecodeError:
        return text  # not ours to fix: git stores what was saved
    for cell in nb.get("cells", []) if isinstance(nb, dict) else []:
        if isinstance(cell, dict) and cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    sys.stdout.write(strip(sys.stdin.read()))
