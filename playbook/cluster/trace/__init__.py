"""The tracer every rank runs under: each ``torch.distributed`` call recorded with its bytes and times.

- ``tracer.py``: the per-rank tracer (op, group, mesh axis, bytes, start and end; compute spans).
- ``sizes.py``: what one call moves, its peer and tag; ``spans.py``: spans summed per step and op.
- ``chrome.py``: a run's timeline as a Chrome trace file, for Perfetto.
"""

from playbook.cluster.trace.spans import measured_comm, bytes_by_op
from playbook.cluster.trace.chrome import write_chrome_trace

__all__ = ["bytes_by_op", "measured_comm", "write_chrome_trace"]
