"""The ring all-reduce, step by step: a reduce-scatter phase, then an all-gather phase.

Patarasuk & Yuan 2009, *Bandwidth optimal all-reduce algorithms for clusters of workstations*,
J. Parallel Distrib. Comput. 69(2). The buffer is cut into n chunks. In reduce-scatter step t
(t = 0 … n−2) rank r sends chunk (r − t) mod n to rank r + 1, which adds it to its own copy; after
n − 1 steps rank r holds the full sum of chunk (r + 1) mod n. In all-gather step t rank r sends
chunk (r + 1 − t) mod n, now complete, to rank r + 1, which overwrites its copy. 2(n − 1) steps of
S/n bytes each: every rank sends 2S(n − 1)/n, and pays the latency α 2(n − 1) times.
"""

from __future__ import annotations


def ring_allreduce_steps(n: int) -> list[dict]:
    """The state of every rank's n chunks before and after each of the 2(n−1) steps.

    Returns a list of 2(n − 1) + 1 dicts: the first is the start (``phase`` "start", no sends), then
    one per step with ``phase`` ("reduce-scatter" or "all-gather"), ``sends`` (a list of
    ``(src, dst, chunk)``) and ``held``: ``held[r][c]`` is the set of ranks whose contribution rank
    r's copy of chunk c contains after the step.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"a ring needs n >= 2 ranks (an integer), got {n!r}")
    held = [[frozenset({r}) for _ in range(n)] for r in range(n)]
    out = [{"phase": "start", "step": 0, "sends": [], "held": [list(row) for row in held]}]
    for phase in ("reduce-scatter", "all-gather"):
        for t in range(n - 1):
            shift = -t if phase == "reduce-scatter" else 1 - t
            sends = [(r, (r + 1) % n, (r + shift) % n) for r in range(n)]
            arriving = [(dst, c, held[src][c]) for src, dst, c in sends]  # all ranks send at once
            for dst, c, contrib in arriving:
                held[dst][c] = held[dst][c] | contrib if phase == "reduce-scatter" else contrib
            out.append({"phase": phase, "step": len(out), "sends": sends, "held": [list(row) for row in held]})
    return out


def ring_allreduce_cost(size: float, n: int, *, bandwidth: float, latency: float) -> dict[str, float]:
    """Bytes each rank sends and the alpha-beta time of a ring all-reduce of ``size`` bytes:
    2(n−1) steps of size/n bytes, time = 2(n−1)·latency + 2(n−1)/n · size / bandwidth."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive number of ranks, got {n!r}")
    if bandwidth <= 0 or latency < 0 or size < 0:
        raise ValueError("need bandwidth > 0 bytes/s, latency >= 0 s and size >= 0 bytes")
    steps = 2 * (n - 1)
    sent = steps * size / n
    return {
        "steps": steps,
        "sent_bytes": sent,
        "latency_s": steps * latency,
        "bandwidth_s": sent / bandwidth,
        "seconds": steps * latency + sent / bandwidth,
    }
