"""Collectives measured from tracer spans, per training step: what the chapters put beside the
ring-formula predictions of ``playbook.theory`` (bytes sent per rank, buffer bytes, calls), summed
per op, op family or mesh axis from ``cluster.trace.tracer``'s spans (the ``Span`` objects or their dicts)."""

from __future__ import annotations

from collections import defaultdict


def without_loop_steps(spans: list) -> list[dict]:
    """The tracer ``Span``s a chapter draws, as dicts: the one training loop's own ``step N`` spans
    (one around each step, ``training.train``) left out, so that a step's figure shows its forward,
    backward and collectives as before the loop was shared."""
    return [s.as_dict() for s in spans if not (s.kind == "compute" and s.name.startswith("step "))]


def measured_comm(result, steps: int) -> dict[str, float]:
    """Data parallelism's three numbers from a rank's spans (``DPResult``): bytes sent by all-reduce
    per step, its buffer bytes per step, and its calls in the last step (``result.windows[-1]``)."""
    first, last = result.windows[-1]
    in_last_step = [s for s in result.spans if first <= s["start"] <= last]
    return {
        "all_reduce": bytes_by_op(result.spans, per=steps).get("all_reduce", 0.0),
        "all_reduce buffer": bytes_by_op(result.spans, "bytes", per=steps).get("all_reduce", 0.0),
        "all_reduce calls": counts_by_op(in_last_step).get("all_reduce", 0),
    }


def comm_per_step(spans: list, steps: int) -> tuple[dict, dict]:
    """Bytes sent and calls per step by collective (``all_gather_single`` counts as ``all_gather``)."""
    return bytes_by_op(spans, per=steps, family=True), counts_by_op(spans, per=steps, family=True)


def op_family(name: str) -> str:
    """The collective an op implements, as ``theory.cost.comm`` names it: ``all_gather_single`` and
    ``all_gather_into_tensor`` -> ``all_gather``, ``reduce_scatter_tensor`` -> ``reduce_scatter``."""
    for suffix in ("_into_tensor", "_single", "_tensor"):
        name = name.removesuffix(suffix)
    return name


def _field(span, key: str):
    return span[key] if isinstance(span, dict) else getattr(span, key)


def bytes_by_op(spans, key: str = "sent_bytes", *, per: int = 1, family: bool = False) -> dict[str, float]:
    """Sum of ``key`` over the comm spans (``Span`` objects or their dicts), per op name (or per
    :func:`op_family`), divided by ``per`` (e.g. the number of steps the spans cover)."""
    out: dict[str, float] = defaultdict(float)
    for s in spans:
        if _field(s, "kind") == "comm":
            name = op_family(_field(s, "name")) if family else _field(s, "name")
            out[name] += _field(s, key)
    return {k: v / per for k, v in out.items()}  # sum first, then divide: no rounding per span


def bytes_by_axis(spans, key: str = "sent_bytes", *, per: int = 1) -> dict[str, float]:
    """Sum of ``key`` over the comm spans per mesh axis (spans with no axis under ``"?"``)."""
    out: dict[str, float] = defaultdict(float)
    for s in spans:
        if _field(s, "kind") == "comm":
            out[_field(s, "axis") or "?"] += _field(s, key)
    return {k: v / per for k, v in out.items()}


def counts_by_op(spans, *, per: int = 1, family: bool = False) -> dict[str, int]:
    """Number of comm spans per op name (or per :func:`op_family`), divided by ``per``."""
    out: dict[str, int] = defaultdict(int)
    for s in spans:
        if _field(s, "kind") == "comm":
            out[op_family(_field(s, "name")) if family else _field(s, "name")] += 1
    return {k: v // per for k, v in out.items()}
