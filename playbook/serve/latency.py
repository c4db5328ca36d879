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
second that met every latency target (DistServe, Zhong et al. 2024, §2, defines it as the rate
served within the SLO; vLLM's benchmark counts requests meeting the SLO per second, as here).
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


def predicted_steps(steps: list[dict], cfg, hw, *, tp: int = 1, dtype: str = "fp32", **rates) -> list[dict]:
    """The same schedule timed by the roofline: each step's seconds = a prefill phase per prompt
    chunk it computed (``prefilled``) + one decode phase over its decoding rows at their mean
    context (``theory.serving.prefill`` / ``decode``; ``rates``: mfu, mbu, latency)."""
    from playbook.theory import serving

    out = []
    for s in steps:
        t = sum(
            serving.prefill(cfg, hw, prompt=n, tp=tp, dtype=dtype, **rates).seconds for n in s["prefilled"].values()
        )
        if s["decoded"]:
            context = sum(s["lengths"].get(i, 1) for i in s["decoded"]) // len(s["decoded"])
            t += serving.decode(
                cfg, hw, context=max(context, 1), batch=len(s["decoded"]), tp=tp, dtype=dtype, **rates
            ).seconds
        out.append({**s, "seconds": t})
    return out
