"""The input wait a data loader leaves per step, in steady state: a rank that needs a batch every
``step`` seconds from ``workers`` processes, each making one in ``delay`` seconds and keeping enough
ahead (PyTorch's ``prefetch_factor`` ≥ 1), gets ``workers / delay`` batches a second, so it waits

    max(0, delay / workers − step)        per step (workers ≥ 1),
    delay                                  with no worker (the batch is made in the rank itself).

The producer–consumer bound of any pipeline: the slower stage sets the rate (a D/D/1 queue; the first
batches, before the workers are ahead, wait longer). Pure arithmetic, seconds.
"""

from __future__ import annotations


def input_wait(delay: float, workers: int, step: float) -> float:
    """Seconds a rank waits for its batch each step, in steady state (module docstring)."""
    if not (isinstance(delay, (int, float)) and delay >= 0 and isinstance(step, (int, float)) and step >= 0):
        raise ValueError(f"delay and step must be numbers of seconds at least 0, got {delay!r} and {step!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be an integer at least 0, got {workers!r}")
    if workers == 0:
        return float(delay)
    return max(0.0, delay / workers - step)


def workers_to_hide(delay: float, step: float) -> int:
    """The fewest workers whose batches keep up with the step: ceil(delay / step)."""
    if not (delay >= 0 and step > 0):
        raise ValueError(f"delay must be at least 0 and step greater than 0, got {delay!r} and {step!r}")
    import math

    return max(1, math.ceil(delay / step - 1e-12))
