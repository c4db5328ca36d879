"""Communication volume and time of collectives: ring algorithms (pure arithmetic, no torch).

For a buffer of S bytes over n ranks, the bytes each rank *sends* with the ring algorithms
(Patarasuk & Yuan 2009; NCCL tests' PERFORMANCE.md; "How to Scale Your Model", part on collectives):

- all-reduce: 2·S·(n−1)/n (a reduce-scatter then an all-gather)
- all-gather and reduce-scatter: S·(n−1)/n, where S is the full (gathered / unscattered) size
- all-to-all: S·(n−1)/n (every rank keeps 1/n of its buffer)
- broadcast: S; point-to-point send: S

These are the ``sent_bytes`` that ``playbook.cluster.trace.tracer`` records per call, so a measured trace
and a prediction compare exactly. gloo implements some collectives differently (its reduce-scatter
rides on all-reduce): the *logical* bytes are what we compare; wall time is shown as measured.
All sizes in bytes; bandwidth in bytes/s (decimal, as vendors quote); latency in seconds.
"""

from __future__ import annotations

from playbook.config import require_positive

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send")


def sent_bytes(op: str, size: float, n: int) -> float:
    """Bytes one rank sends for ``op`` on a buffer of ``size`` bytes over ``n`` ranks (ring)."""
    require_positive(n=n)
    if size < 0:
        raise ValueError(f"size must be >= 0 bytes, got {size}")
    if op == "all_reduce":
        return 2 * size * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return size * (n - 1) / n
    if op in ("broadcast", "send"):
        return float(size) if n > 1 else 0.0
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")


def ring_steps(op: str, n: int) -> int:
    """Latency-bound steps of the ring algorithm: 2(n−1) for all-reduce, n−1 for the others."""
    return 2 * (n - 1) if op == "all_reduce" else (n - 1 if op in ("all_gather", "reduce_scatter", "all_to_all") else 1)


def collective_seconds(op: str, size: float, n: int, bandwidth: float, latency: float = 5e-6) -> float:
    """Predicted time: bytes sent per rank / link bandwidth + latency × ring steps (alpha-beta model)."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth}")
    if n == 1:
        return 0.0
    return sent_bytes(op, size, n) / bandwidth + latency * ring_steps(op, n)
