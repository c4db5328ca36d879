"""Collectives measured from tracer spans, per training step: what the chapters put beside the
ring-formula predictions of ``playbook.theory`` (bytes sent per rank, buffer bytes, calls)."""

from __future__ import annotations

from playbook.measure.trace import bytes_by_op, counts_by_op


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
