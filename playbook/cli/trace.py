"""``playbook run ... --trace FILE.json``: the run's measured timeline as a Chrome trace.

The path is checked before any rank starts (a run that measured for seconds must not fail at the
end on a bad path); the file holds the spans of the strategy's own run, the first launch of the
command (a native counterpart, when one runs, comes after it and is left out).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def check_trace_path(path: str) -> None:
    """Refuse, in one line, a ``--trace`` path that cannot be written."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise ValueError(f"--trace {path} is a directory; give a file name such as {target / 'run.json'}")
    if not folder.is_dir():
        raise ValueError(f"--trace {path}: the folder {folder} does not exist; create it or write to ./run.json")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ValueError(f"--trace {path} cannot be written here; choose a writable place such as /tmp/run.json")


def write_trace(path: str, title: str) -> None:
    """Write the first launch's spans of this command to ``path`` and say where, on stderr."""
    from playbook.cluster import LAUNCHED_TRACES, under_torchrun
    from playbook.cluster.trace.chrome import write_chrome_trace

    if under_torchrun() or not LAUNCHED_TRACES:
        print(
            "playbook: --trace records ranks this command starts; under torchrun nothing was written", file=sys.stderr
        )
        return
    spans = LAUNCHED_TRACES[0]
    write_chrome_trace(path, spans, title=title)
    ranks = len({s["rank"] for s in spans})
    print(
        f"playbook: trace of {ranks} rank(s), {len(spans)} spans, written to {path} (open it in Perfetto)",
        file=sys.stderr,
    )
