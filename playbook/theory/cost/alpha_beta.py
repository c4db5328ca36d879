"""Fit the α–β (latency–bandwidth) model to measured collective times: least squares, no torch.

Hockney's model (Hockney 1994, *The communication challenge for MPP*, Parallel Computing 20(3)),
counted the way ``playbook.theory.cost.comm`` counts a ring collective (Patarasuk & Yuan 2009): a call
on a buffer of S bytes over n ranks takes

    time = ring_steps(op, n) · α + sent_bytes(op, S, n) · β

with α the latency of one step (seconds) and β the cost of one byte on the wire (seconds/byte,
1/bandwidth). Each measured point gives one row ``[steps, bytes_on_wire]`` of a 2-column system
that we solve for (α, β).

The points span several orders of magnitude of time (tens of µs to tens of ms). Plain least
squares on seconds would let the largest messages decide everything and leave α to their noise;
we minimise the *relative* residuals instead (each row divided by its measured time, i.e.
weights 1/t²), so every message size counts alike. Both parameters are physical, so the fit is
non-negative: if the unconstrained optimum puts one below zero, that one is pinned to 0 and the
other refitted alone (the fit says which it pinned).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from playbook.theory.cost.comm import ring_steps, sent_bytes


@dataclass(frozen=True)
class Fit:
    """α (s per ring step), β (s per byte sent), and how well they explain the points."""

    alpha: float
    beta: float
    rms_rel_residual: float  # sqrt(mean(((predicted − measured) / measured)²))
    pinned: str = ""  # "alpha" or "beta" when the non-negative fit pinned one to 0

    @property
    def bandwidth(self) -> float:
        """1/β in bytes/s (inf when β = 0)."""
        return 1.0 / self.beta if self.beta > 0 else math.inf

    def seconds(self, steps: float, wire_bytes: float) -> float:
        return steps * self.alpha + wire_bytes * self.beta

    def as_dict(self) -> dict:
        return {**asdict(self), "bandwidth": self.bandwidth}


def _solve(rows: list[tuple[float, float]], times: list[float]) -> tuple[float, float]:
    """Weighted normal equations of the 2-column system, each row scaled by 1/t."""
    a11 = a12 = a22 = b1 = b2 = 0.0
    for (s, w), t in zip(rows, times):
        s, w = s / t, w / t  # relative rows: the target becomes 1
        a11, a12, a22 = a11 + s * s, a12 + s * w, a22 + w * w
        b1, b2 = b1 + s, b2 + w
    det = a11 * a22 - a12 * a12
    if det <= 1e-12 * max(a11 * a22, 1e-300):
        raise ValueError(
            "cannot separate α from β: the points need at least two different message sizes "
            "(steps and bytes on the wire must not be proportional)"
        )
    return (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det


def _one(column: list[float], times: list[float]) -> float:
    """Best non-negative c for t ≈ c · column in relative terms."""
    num = sum(x / t for x, t in zip(column, times))
    den = sum((x / t) ** 2 for x, t in zip(column, times))
    return max(num / den, 0.0) if den > 0 else 0.0


def fit_points(steps: list[float], wire_bytes: list[float], seconds: list[float]) -> Fit:
    """Least-squares α, β ≥ 0 for ``seconds[i] ≈ steps[i]·α + wire_bytes[i]·β``."""
    if not (len(steps) == len(wire_bytes) == len(seconds)) or len(seconds) < 2:
        raise ValueError(f"need >= 2 points with steps, bytes and seconds each, got {len(seconds)}")
    if any(not (t > 0 and math.isfinite(t)) for t in seconds):
        raise ValueError("every measured time must be a positive finite number of seconds")
    rows = list(zip(steps, wire_bytes))
    alpha, beta = _solve(rows, seconds)
    pinned = ""
    if alpha < 0:
        alpha, beta, pinned = 0.0, _one(list(wire_bytes), seconds), "alpha"
    elif beta < 0:
        alpha, beta, pinned = _one(list(steps), seconds), 0.0, "beta"
    rel = [(s * alpha + w * beta - t) / t for (s, w), t in zip(rows, seconds)]
    return Fit(alpha, beta, math.sqrt(sum(r * r for r in rel) / len(rel)), pinned)


def model_terms(op: str, size: float, n: int) -> tuple[int, float]:
    """(ring steps, bytes one rank sends) of ``op`` on a ``size``-byte buffer over ``n`` ranks,
    as ``playbook.theory.cost.comm`` counts them; ``send`` is one step of ``size`` bytes."""
    return ring_steps(op, n), sent_bytes(op, size, n)


def fit_collective(op: str, n: int, sizes: list[float], seconds: list[float]) -> Fit:
    """α, β of ``op`` over ``n`` ranks from buffer sizes (bytes, as issued) and measured times."""
    terms = [model_terms(op, s, n) for s in sizes]
    return fit_points([st for st, _ in terms], [w for _, w in terms], seconds)


def predict_seconds(fit: Fit | dict, op: str, size: float, n: int, calls: int = 1) -> float:
    """Time of ``calls`` calls of ``op`` on ``size`` bytes each over ``n`` ranks, from a fit."""
    alpha, beta = (fit.alpha, fit.beta) if isinstance(fit, Fit) else (fit["alpha"], fit["beta"])
    steps, wire = model_terms(op, size, n)
    return calls * (steps * alpha + wire * beta)
