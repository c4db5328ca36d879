"""Data parallelism, predicted (chapter 1): the buckets and the bytes of one step.

- ``buckets.py``: how DDP packs gradients into buckets and when each bucket's all-reduce runs.
- ``dp.py``: bytes per step of ``playbook run dp``.
"""

from playbook.theory.dp.buckets import bucket_cap_bytes, bucket_plan, parameter_shapes, predict_dp_step
from playbook.theory.dp.dp import predicted_comm

__all__ = ["bucket_cap_bytes", "bucket_plan", "parameter_shapes", "predict_dp_step", "predicted_comm"]
