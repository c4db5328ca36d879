"""``playbook run ... --trace FILE.json``: the run's measured timeline as a Chrome trace.

The path is checked before any rank starts (a run that measured for seconds must not fail at the
end on a bad path); the file holds the spans of the strategy's own run, the first launch of the
command (a native counterpart, when one runs, comes after it and is left out).
"""

from __future__ import annotations

import json
import sys

from playbook.validate import check_output_path, write_output


def check_trace_path(path: str) -> None:
    """Refuse, in one line, a ``--trace`` path that cannot be written (``validate.check_output_path``)."""
    check_output_path("--trace", path, "run.json")


def write_trace(path: str, title: str, traces: list[list[dict]]) -> None:
    """Write the first launch's spans of this command (``traces``: a ``Launcher``'s, one list of
    every rank's spans per launch) to ``path`` and say where, on stderr."""
    from playbook.cluster import under_torchrun
    from playbook.cluster.trace.chrome import chrome_trace

    if under_torchrun() or not traces:
        print(
            "playbook: --trace records ranks this command starts; under torchrun nothing was written", file=sys.stderr
        )
        return
    spans = traces[0]
    write_output("--trace", path, json.dumps(chrome_trace(spans, title=title)))  # a failure: one line
    ranks = len({s["rank"] for s in spans})
    print(
        f"playbook: trace of {ranks} rank(s), {len(spans)} spans, written to {path} (open it in Perfetto)",
        file=sys.stderr,
    )
