"""Predict data parallelism's communication per step, for the run of ``playbook run dp``.

Every fp32 gradient (4Ψ bytes) is all-reduced once per step however it is grouped, and the loss
(4 bytes) once more for the report; a ring all-reduce of S bytes makes each of n ranks send
2S(n−1)/n (Patarasuk & Yuan 2009; ``theory.cost.comm``). Grouping sets only the number of calls: one
per parameter tensor (naive) or one per bucket (``theory.dp.buckets.bucket_plan``; Li et al. 2020,
arXiv:2006.15704, §3.2.3). Gradient accumulation does not change any of the three.

Pure arithmetic, no torch.
"""

from __future__ import annotations

from playbook.theory.dp.buckets import bucket_plan, parameter_shapes
from playbook.theory.cost.comm import sent_bytes


def predicted_comm(setup, *, world_size: int, variant: str, cap_bytes: int, element_bytes: int = 4) -> dict[str, float]:
    """Per step on each rank of a ``TrainSetup``'s run: bytes sent by all-reduce (every gradient,
    ``element_bytes``·Ψ — 4 in fp32, 2 in bf16 mixed precision — plus the 4-byte fp32 loss) under the
    ring formula, the all-reduced buffer bytes, and the number of all-reduce calls (tensors or
    buckets, planned at ``element_bytes`` an element, + 1 for the loss)."""
    cfg = setup.config()
    buffer = element_bytes * cfg.num_params() + 4
    plan = bucket_plan(parameter_shapes(cfg), cap_bytes, element_bytes=element_bytes)
    calls = cfg.num_param_tensors() if variant == "naive" else len(plan)
    return {
        "all_reduce": sent_bytes("all_reduce", buffer, world_size),
        "all_reduce buffer": buffer,
        "all_reduce calls": calls + 1,
    }
