"""Measure: what a run actually did, by category, to put beside ``playbook.theory``'s predictions."""

from playbook.measure.memory import (
    MemorySnapshot,
    SavedActivations,
    SavedTensor,
    gradient_bytes,
    measure_training_step,
    optimizer_bytes,
    parameter_bytes,
)

__all__ = [
    "MemorySnapshot",
    "SavedActivations",
    "SavedTensor",
    "gradient_bytes",
    "measure_training_step",
    "optimizer_bytes",
    "parameter_bytes",
]
