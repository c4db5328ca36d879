"""A tensor-parallel all-reduce's time by message size: one-shot, two-shot or ring, whichever is least.

``theory.serving.serving`` prices an all-reduce as a ring: 2(t − 1) steps of latency α plus 2(t − 1)/t of the
message over the link. At decode sizes (a few KB per token) that is all latency, and 2(t − 1)·5 µs
grows with t: 70 µs at t = 8. Inside an NVLink/NVSwitch node small all-reduces do not run as rings:
every GPU can read every other's buffer, and libraries pick the algorithm by size (vLLM's custom
all-reduce: one-shot below a threshold, two-shot above; NCCL: its tree/NVLS/ring choice by size),
so a small all-reduce costs about one latency, ~10 µs, whatever t from 2 to 8
(``theory.serving.serving.flat_allreduce_latency`` reads that measured figure into the ring formula). Here the
algorithms themselves, each with its own cost (m bytes per rank, B bytes/s per GPU's link):

- one-shot: each rank reads the other t − 1 buffers and reduces: ``α + (t − 1)·m / B``;
- two-shot: reduce-scatter then all-gather by direct reads: ``2α + 2·(t − 1)/t·m / B``;
- ring: ``2(t − 1)·α_ring + 2·(t − 1)/t·m / B``.

The least of the three is the model; small messages take one-shot, large ones the bandwidth-optimal
two-shot or ring. Pure arithmetic, no torch.
"""

from __future__ import annotations

from playbook.config import require_positive


def algorithms(message: float, tp: int, bandwidth: float, *, alpha: float = 10e-6, ring_alpha: float = 5e-6) -> dict:
    """Seconds of one all-reduce of ``message`` bytes per rank over ``tp`` ranks, by algorithm."""
    require_positive(tp=tp)
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth}; NVLink on an H100: 450e9")
    if tp == 1:
        return {"one-shot": 0.0, "two-shot": 0.0, "ring": 0.0}
    share = 2 * (tp - 1) / tp * message / bandwidth
    return {
        "one-shot": alpha + (tp - 1) * message / bandwidth,
        "two-shot": 2 * alpha + share,
        "ring": 2 * (tp - 1) * ring_alpha + share,
    }


def allreduce_seconds(message: float, tp: int, bandwidth: float, **latencies) -> tuple[float, str]:
    """(the least time, the algorithm that gives it) for an all-reduce of ``message`` bytes."""
    by = algorithms(message, tp, bandwidth, **latencies)
    name = min(by, key=by.get)
    return by[name], name
