"""ZeRO and FSDP, predicted (chapter 2), exactly for our flat padded units.

- ``zero.py``: bytes per rank by category and moment, bytes sent per step, the gathered peak of stage 3.
- ``sharded.py``: a sharded run on a ``TrainSetup`` (``playbook run zero``, ``playbook run fsdp2``).
"""

from playbook.theory.zero.zero import (
    fsdp2_state_bytes,
    padded,
    padding_elements,
    zero3_gathered_peak,
    zero_comm_per_step,
    zero_comm_seconds,
    zero_memory_by_moment,
    zero_units,
)
from playbook.theory.zero.sharded import fsdp2_comm_per_step

__all__ = [
    "fsdp2_comm_per_step",
    "fsdp2_state_bytes",
    "padded",
    "padding_elements",
    "zero3_gathered_peak",
    "zero_comm_per_step",
    "zero_comm_seconds",
    "zero_memory_by_moment",
    "zero_units",
]
