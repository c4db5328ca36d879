"""What serving users read first: time to first token, time per output token, end-to-end latency.

From a ``BatchRun``'s step records (each step's wall seconds and the requests that got a token in
it), on a clock that starts at step 0 and where a request arriving at step k arrives when step k
starts:

- TTFT: arrival to the end of the step that gave its first token (waiting, then its prefill);
- inter-token latency: the gap between two consecutive tokens of a request (every gap, all
  requests pooled: its p99 is what a stalled step shows up in);
- TPOT: a request's (last token − first token) / (tokens − 1), its mean gap;
- e2e: arrival to its last token.

Percentiles are linear between order statistics (numpy's default). Goodput is the requests per
second that met every latency target, as vLLM's benchmark counts it. DistServe (Zhong et al. 2024,
§2) means another quantity by the word: the highest request rate per GPU at which a target share of
requests (e.g. 90 %) meets the SLOs.
"""

from __future__ import annotations

import math


def percentile(values, q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linear between order statistics."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (pos - lo)


def token_times(steps: list[dict], requests) -> tuple[dict[int, float], dict[int, list[float]]]:
    """(arrival time, every token's time) per request id, on the steps' clock (``seconds`` per step,
    ``emitted``: the requests that got a token). ``step_seconds`` can replace measured seconds."""
    ends, t = [], 0.0
    for s in steps:
        t += s["seconds"]
        ends.append(t)
    starts = [0.0] + ends[:-1]
    arrival = {r.id: starts[min(r.arrival, len(starts) - 1)] for r in requests}
    times: dict[int, list[float]] = {r.id: [] for r in requests}
    for s, end in zip(steps, ends):
        for i in s["emitted"]:
            times[i].append(end)
    return arrival, times


def request_latencies(steps: list[dict], requests) -> dict:
    """Per request: TTFT, TPOT (requests of one token have none), e2e; every inter-token gap; the
    run's duration and tokens."""
    arrival, times = token_times(steps, requests)
    return {
        "ttft": [ts[0] - arrival[i] for i, ts in times.items()],
        "tpot": [(ts[-1] - ts[0]) / (len(ts) - 1) for ts in times.values() if len(ts) > 1],
        "tpot_by_id": {i: (ts[-1] - ts[0]) / (len(ts) - 1) if len(ts) > 1 else 0.0 for i, ts in times.items()},
        "ttft_by_id": {i: ts[0] - arrival[i] for i, ts in times.items()},
        "itl": [b - a for ts in times.values() for a, b in zip(ts, ts[1:])],
        "e2e": [ts[-1] - arrival[i] for i, ts in times.items()],
        "duration": sum(s["seconds"] for s in steps),
        "tokens": sum(len(ts) for ts in times.values()),
    }


def summarize(parts: list[dict], *, slo_ttft: float | None = None, slo_tpot: float | None = None) -> dict:
    """Pool ``request_latencies`` of replicas running side by side (the run lasts as long as the
    slowest): p50/p90/p99 of each, throughput (tokens/s) and goodput (requests/s meeting every SLO)."""
    pooled = {k: [x for p in parts for x in p[k]] for k in ("ttft", "tpot", "itl", "e2e")}
    duration = max(p["duration"] for p in parts)
    met = sum(
        (slo_ttft is None or p["ttft_by_id"][i] <= slo_ttft) and (slo_tpot is None or p["tpot_by_id"][i] <= slo_tpot)
        for p in parts
        for i in p["ttft_by_id"]
    )
    out = {k: {f"p{q}": percentile(v, q) for q in (50, 90, 99)} for k, v in pooled.items()}
    return {
        "requests": len(pooled["ttft"]),
        **out,
        "duration": duration,
        "throughput_tokens_per_s": sum(p["tokens"] for p in parts) / duration,
        "slo": {"ttft": slo_ttft, "tpot": slo_tpot},
        "slo_met": met,
        "goodput_requests_per_s": met / duration,
    }


def latency_report(
    steps: list[dict], requests, *, slo_ttft: float | None = None, slo_tpot: float | None = None
) -> dict:
    """``summarize`` of one replica's run."""
    return summarize([request_latencies(steps, requests)], slo_ttft=slo_ttft, slo_tpot=slo_tpot)


def fused_step_seconds(cfg, hw, *, chunks, decode_rows: int, context: int, tp: int = 1, dtype="bf16", **rates) -> float:
    """One step that computes prompt ``chunks`` (token counts) and ``decode_rows`` decode tokens in one
    batch, by the roofline: the FLOPs of all of them at the achievable rate, against the weights read
    once (plus the decode rows' KV), plus every TP all-reduce (``theory.serving.serving.prefill``/``decode``)."""
    from playbook.theory.serving import serving

    phases = [serving.prefill(cfg, hw, prompt=n, tp=tp, dtype=dtype, **rates) for n in chunks if n]
    if decode_rows:
        phases.append(serving.decode(cfg, hw, context=max(context, 1), batch=decode_rows, tp=tp, dtype=dtype, **rates))
    if not phases:
        return 0.0
    return max(sum(p.compute for p in phases), max(p.memory for p in phases)) + sum(p.comm for p in phases)


def predicted_steps(
    steps: list[dict], cfg, hw, *, tp: int = 1, dtype: str = "fp32", scale: int = 1, **rates
) -> list[dict]:
    """The same schedule timed by the roofline, each step fused (``fused_step_seconds``) from its
    prompt chunks (``prefilled``) and its decoding rows at their mean context; ``scale``: every
    chunk and context that many times longer (a shrunk trace at its real lengths)."""
    out = []
    for s in steps:
        rows = s["decoded"]
        context = scale * sum(s["lengths"].get(i, 1) for i in rows) // len(rows) if rows else 1
        t = fused_step_seconds(
            cfg,
            hw,
            chunks=[scale * n for n in s["prefilled"].values()],
            decode_rows=len(rows),
            context=context,
            tp=tp,
            dtype=dtype,
            **rates,
        )
        out.append({**s, "seconds": t})
    return out


def stall_at_scale(cfg, hw, *, prompt: int, budget: int, batch: int, context: int, tp: int = 1, **rates) -> dict:
    """A ``prompt``-token request joining ``batch`` decoding ones: the step that prefills it whole
    (what every running request waits between two tokens) against the steps of a ``budget``-token
    chunked schedule (``batch`` decode tokens + a chunk of budget − batch), by the roofline."""
    chunk = budget - batch
    if chunk < 1:
        raise ValueError(f"budget {budget} must exceed the batch {batch}; try budget={batch + 512}")
    base = fused_step_seconds(cfg, hw, chunks=[], decode_rows=batch, context=context, tp=tp, **rates)
    return {
        "decode_only": base,
        "stalled_step": fused_step_seconds(
            cfg, hw, chunks=[prompt], decode_rows=batch, context=context, tp=tp, **rates
        ),
        "chunked_step": fused_step_seconds(cfg, hw, chunks=[chunk], decode_rows=batch, context=context, tp=tp, **rates),
        "chunked_steps": -(-prompt // chunk),
    }
