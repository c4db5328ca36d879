"""A run's whole life at scale (chapter 10): checkpoints, failures and the goodput left.

- ``goodput.py``: a cluster's MTBF from a per-GPU failure rate (Llama 3's), Young's (1974) and
  Daly's (2006) checkpoint interval, goodput against the interval (exact for exponential failures)
  and its numerical optimum.
- ``simulate.py``: a seeded simulation of failures, save and restart, whose goodput the closed form
  must match within a few standard errors.
- ``checkpoint.py``: bytes of a training checkpoint (weights, Adam moments, step) and its save time
  from a per-node storage bandwidth.

Layer 1 of ``theory``: it reads the model-state convention of ``inventory`` and nothing else.
"""

from playbook.theory.life.checkpoint import checkpoint_bytes, checkpoint_bytes_per_param, save_seconds
from playbook.theory.life.goodput import (
    LLAMA3_FAILURES_PER_GPU_HOUR,
    best_interval,
    cluster_mtbf,
    daly_interval,
    goodput,
    goodput_first_order,
    summary,
    young_interval,
)
from playbook.theory.life.simulate import Simulated, simulate

__all__ = [
    "LLAMA3_FAILURES_PER_GPU_HOUR",
    "Simulated",
    "best_interval",
    "checkpoint_bytes",
    "checkpoint_bytes_per_param",
    "cluster_mtbf",
    "daly_interval",
    "goodput",
    "goodput_first_order",
    "save_seconds",
    "simulate",
    "summary",
    "young_interval",
]
