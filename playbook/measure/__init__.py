"""Measure: what a run actually did, to put beside ``playbook.theory``'s predictions. Instruments only:
nothing here runs a strategy (that is ``parallel``'s, e.g. ``parallel.step_time``).

- ``memory.py``: one rank's bytes by category (parameters, gradients, optimizer state, saved activations).
- ``memory_timeline.py``: one step's bytes by category over time, from PyTorch's profiler (where the peak falls).
- ``held.py``: the bytes autograd holds right now; ``sharding.py``: a sharded rank's bytes, from storages.
- ``pipeline.py``: a pipeline run's measured timeline, bubble and held activations.
- ``flight_recorder.py``: PyTorch's record of each rank's last collectives, and the first the ranks disagree on.
- ``stacks.py``: a rank's Python stack, dumped by ``faulthandler`` while it waits.
- ``steps.py``: step times per rank over many steps (iteration, own work, input wait), their
  percentiles, and the straggler found from them (chapter 10).
- ``matmul.py``: one rank's matmul throughput; ``calibrate.py``: this machine's rates, fitted into a profile.
"""

from playbook.measure.memory import (
    MemorySnapshot,
    SavedActivations,
    SavedTensor,
    gradient_bytes,
    measure_training_step,
    optimizer_bytes,
    parameter_bytes,
)
from playbook.measure.steps import report_lines, step_report

__all__ = [
    "MemorySnapshot",
    "SavedActivations",
    "SavedTensor",
    "gradient_bytes",
    "measure_training_step",
    "optimizer_bytes",
    "parameter_bytes",
    "report_lines",
    "step_report",
]
