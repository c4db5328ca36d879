"""The planner's data axis: seconds of the gradient reduction and weight gathers over the dp·cp
ranks that share weights (expert weights over their dp·cp/ep replicas; the most loaded stage's flat
units, ``theory.plan.axis_bytes.dp_groups``), and how much of them overlaps compute. Used by
:mod:`playbook.theory.plan.cost`; pure arithmetic, no torch.

Each overlaps as below when the stack overlaps the data axis (``hide``, the "dp" of
``theory.plan.cost.OVERLAP_PRESETS``); without it every collective is exposed, as in Megatron-LM's 2021
local DDP, which all-reduced the gradients after the last micro-batch's backward.

- ZeRO 0: one all-reduce, overlapped with the last micro-batch's backward except the last bucket
  (PyTorch DDP, Li et al. 2020, arXiv:2006.15704, buckets of 25 MiB);
- ZeRO 1: a reduce-scatter so overlapped, plus the all-gather of the updated weights, overlapped
  with the next forward except its first bucket (Megatron-LM's overlapped parameter gather);
- ZeRO 2: a reduce-scatter after every micro-batch's backward (the gradient is sharded, so
  accumulation cannot wait), DeepSpeed's way;
- ZeRO 3: also the weights gathered before every forward and backward, prefetched behind the
  micro-batch's compute (Rajbhandari et al. 2019, arXiv:1910.02054, §5, §7).

Bytes on the wire: weights are gathered in bf16; gradients reduce in ``grad_bytes`` per element:
bf16 (2) for our GPT's mixed precision, fp32 (4) for the production stack, which accumulates
Megatron-LM's fp32 ``main_grad`` and reduces it as it is (Llama 3: "we ... reduce-scatter gradients
in FP32", Dubey et al. 2024, arXiv:2407.21783, §3.3.2): ``GRAD_REDUCE_BYTES``.
"""

from __future__ import annotations

import functools

from playbook.config import ModelConfig
from playbook.theory.cost.comm import collective_seconds
from playbook.theory.cost.flops import BACKWARD_SHARE
from playbook.theory.plan.axis_bytes import dp_groups

BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's bucket_cap_mb=25 (MiB)
GRAD_BYTES = 2  # bf16 activations, weights and (our GPT's) gradients on the wire (precision="mixed")
GRAD_REDUCE_BYTES = {"ours": 2, "production": 4}  # gradient bytes reduced per element, by activation model


@functools.lru_cache(maxsize=65536)
def _seconds(op: str, size: float, n: int, bandwidth: float, latency: float) -> float:
    """``collective_seconds``, remembered: a search asks for the same few sizes per structure."""
    return collective_seconds(op, size, n, bandwidth, latency)


def overlapped(comm: float, window: float, floor: float) -> float:
    """Exposed part of ``comm`` hidden behind ``window`` seconds, never less than ``floor`` (<= comm)."""
    return min(comm, max(comm - window, floor))


def dp_seconds(
    cfg: ModelConfig,
    *,
    bandwidth: float,
    latency: float,
    dp: int,
    tp: int,
    pp: int,
    cp: int,
    ep: int,
    zero: int,
    compute: float,
    microbatches: int,
    grad_bytes: int = GRAD_BYTES,
    placement: str = "1f1b",
    hide: bool = True,
) -> tuple[float, float]:
    """(communication, exposed) seconds of the data axis in one step (module docstring); ``placement``:
    the schedule whose placement of the stages sets the most loaded rank (``theory.plan.axis_bytes.dp_groups``);
    ``hide``: overlap as the module docstring says (False: all of it exposed)."""
    m = microbatches
    window = BACKWARD_SHARE * compute / m  # one micro-batch's backward
    comm = exposed = 0.0
    for rs, ag, last_rs, last_ag in _terms(cfg, bandwidth, latency, dp, tp, pp, cp, ep, zero, grad_bytes, placement):
        if zero == 0:  # rs, last_rs: the all-reduce of the gradients and of their last bucket
            c = rs
            e = overlapped(c, window, last_rs)
        elif zero == 1:
            c, e = rs + ag, overlapped(rs, window, last_rs) + last_ag
        elif zero == 2:
            c = m * rs + ag
            e = m * overlapped(rs, window, last_rs) + last_ag
        else:  # rs, last_rs: one micro-batch's two gathers and its reduce-scatter, in full and of the last buckets
            c, e = m * rs, m * overlapped(rs, compute / m, last_rs)
        comm, exposed = comm + c, exposed + (e if hide else c)
    return comm, exposed


@functools.lru_cache(maxsize=65536)
def _terms(cfg, bandwidth, latency, dp, tp, pp, cp, ep, zero, grad_bytes, placement) -> tuple[tuple, ...]:
    """Per data group of ``dp_groups`` (one with a single rank left out), the collective seconds
    :func:`dp_seconds` combines with the compute and the micro-batches: remembered, since a search asks
    for one structure, stage and placement at every micro-batch and recomputation."""
    out = []
    for numel, pad, n in dp_groups(cfg, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, placement=placement):
        if n == 1:
            continue
        w, g = pad * GRAD_BYTES, (numel if zero == 0 else pad) * grad_bytes  # weights gathered, gradients reduced

        def t(op, size):
            return _seconds(op, size, n, bandwidth, latency)

        last_w, last_g = min(BUCKET_BYTES, w), min(BUCKET_BYTES, g)
        if zero == 0:
            out.append((t("all_reduce", g), 0.0, t("all_reduce", last_g), 0.0))
        elif zero in (1, 2):
            out.append(
                (t("reduce_scatter", g), t("all_gather", w), t("reduce_scatter", last_g), t("all_gather", last_w))
            )
        else:
            one = 2 * t("all_gather", w) + t("reduce_scatter", g)
            floor = 2 * t("all_gather", last_w) + t("reduce_scatter", last_g)
            out.append((one, 0.0, floor, 0.0))
    return tuple(out)
