"""Predict data parallelism's communication per step, for the run of ``playbook run dp``.

Every fp32 gradient (4Ψ bytes) is all-reduced once per step however it is grouped, and the loss
(4 bytes) once more for the report; a ring all-reduce of S bytes makes each of n ranks send
2S(n−1)/n (Patarasuk & Yuan 2009; ``theory.comm``). Grouping sets only the number of calls: one
per parameter tensor (naive) or one per bucket (``theory.buckets.bucket_plan``; Li et al. 2020,
arXiv:2006.15704, §3.2.3). Gradient accumulation does not change any of the three.

Pure arithmetic, no torch.
"""

from __future__ import annotations

from playbook.theory.buckets import bucket_plan, parameter_shapes
from playbook.theory.comm import sent_bytes


def predicted_comm(setup, *, world_size: int, variant: str, cap_bytes: int) -> dict[str, float]:
    """Per step on each rank of a ``TrainSetup``'s run: bytes sent by all-reduce (every fp32
    gradient, 4Ψ, plus the 4-byte loss) under the ring formula, the all-reduced buffer bytes, and
    the number of all-reduce calls (tensors or buckets, + 1 for the loss)."""
    cfg = setup.config()
    buffer = 4 * cfg.num_params() + 4
    calls = cfg.num_param_tensors() if variant == "naive" else len(bucket_plan(parameter_shapes(cfg), cap_bytes))
    return {
        "all_reduce": sent_bytes("all_reduce", buffer, world_size),
        "all_reduce buffer": buffer,
        "all_reduce calls": calls + 1,
    }
