"""Step times per rank over many steps, their percentiles, and the straggler found from them.

From one rank's tracer spans (``cluster.trace``; dicts or ``Span`` objects): each training step's
span ``"step N"`` (``parallel.training.train``), the ``"input wait"`` before it (``parallel.loader``),
and the collectives inside it. Per step:

- ``seconds``: the iteration, input wait + step, what a rank's clock shows between two steps;
- ``comm``: time inside collectives (the union of their spans within the step: a rank that waits
  for a late peer waits *inside* the collective, so this is mostly waiting, not transfer);
- ``busy``: step − comm, the rank's own work. Asynchronous collectives that overlap compute count as
  comm, so busy is a lower bound on the compute.

A straggler makes every rank's step slow (they all wait for it in the next collective), so step
times alone cannot name it; the rank's own work can: the straggler is busy longest and waits least
(the reading of chapter 9's case 7, and of per-rank timings on real clusters: Llama 3, Dubey et al.
2024 §3.3.4, found slow hosts from per-rank collective times with NCCL's flight recorder).
:func:`find_straggler` names a rank when its median own work exceeds its peers' by more than four
times their step-to-step spread (median absolute deviation) and 10 % of their median, and it is the
busiest rank in at least 60 % of the steps; peers are the ranks of the same pipeline stage when a
stage has two or more, else every rank (a pipeline's stages differ by design). Fewer than
``MIN_STEPS`` measured steps name no one: a spread needs steps to be measured (one step has none,
and any rank is then "busiest in 1 of 1").
Percentiles interpolate linearly between order statistics (Hyndman & Fan 1996, type 7: numpy's default).
"""

from __future__ import annotations

import statistics
from typing import Iterable, Mapping, Sequence

INPUT_WAIT = "input wait"  # the span name of parallel.loader (measure sits below parallel)
QUANTILES = (50, 90, 99)
MIN_STEPS = 5  # measured steps (after the skipped first) below which find_straggler names no rank


def _get(span, key):
    return span[key] if isinstance(span, Mapping) else getattr(span, key)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between order statistics (type 7)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in 0..100, got {q!r}")
    h = (len(xs) - 1) * q / 100
    lo = int(h)
    return xs[lo] + (h - lo) * (xs[min(lo + 1, len(xs) - 1)] - xs[lo])


def percentiles(values: Sequence[float], qs: Iterable[float] = QUANTILES) -> dict[str, float]:
    return {f"p{q:g}": percentile(values, q) for q in qs}


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def step_records(spans: Iterable) -> list[dict]:
    """One rank's steps, in order: {"step", "seconds", "step_s", "input_wait", "comm", "busy"}."""
    spans = list(spans)
    steps = sorted(
        (s for s in spans if _get(s, "kind") == "compute" and _get(s, "name").startswith("step ")),
        key=lambda s: _get(s, "start"),
    )
    waits = [s for s in spans if _get(s, "kind") == "compute" and _get(s, "name") == INPUT_WAIT]
    comms = [s for s in spans if _get(s, "kind") == "comm"]
    out, previous_end = [], float("-inf")
    for s in steps:
        a, b = _get(s, "start"), _get(s, "end")
        wait = sum(_get(w, "end") - _get(w, "start") for w in waits if previous_end <= _get(w, "start") <= a)
        inside = []
        for c in comms:
            end = _get(c, "end") if _get(c, "end") is not None else _get(c, "waited")
            if end is not None and _get(c, "start") < b and end > a:
                inside.append((max(a, _get(c, "start")), min(b, end)))
        comm = _union(inside)
        out.append(
            {
                "step": int(_get(s, "name").split()[1]),
                "seconds": wait + (b - a),
                "step_s": b - a,
                "input_wait": wait,
                "comm": comm,
                "busy": (b - a) - comm,
            }
        )
        previous_end = b
    return out


def rank_table(records: Sequence[Sequence[dict]], *, skip: int = 1, stages: Sequence[int] | None = None) -> list[dict]:
    """Per rank: percentiles of the iteration, the input wait and the own work over its steps, the
    first ``skip`` left out (step 0 warms up: allocations, the loader's workers starting)."""
    rows = []
    for rank, recs in enumerate(records):
        kept = list(recs[skip:]) or list(recs)
        rows.append(
            {
                "rank": rank,
                "stage": stages[rank] if stages is not None else 0,
                "steps": len(kept),
                "seconds": percentiles([r["seconds"] for r in kept]),
                "input_wait": percentiles([r["input_wait"] for r in kept]),
                "busy": percentiles([r["busy"] for r in kept]),
                "busy_per_step": [r["busy"] for r in kept],
            }
        )
    return rows


def find_straggler(rows: Sequence[dict]) -> dict | None:
    """The rank whose own work stands out from its peers' (module docstring), or None."""
    if len(rows) < 2:
        return None
    by_stage: dict[int, list[dict]] = {}
    for r in rows:
        by_stage.setdefault(r["stage"], []).append(r)
    groups = [g for g in by_stage.values() if len(g) >= 2] or [list(rows)]
    found = None
    for group in groups:
        if len(group) < 2:
            continue
        cand = max(group, key=lambda r: r["busy"]["p50"])
        peers = [r for r in group if r is not cand]
        base = statistics.median(r["busy"]["p50"] for r in peers)
        spread = statistics.median(abs(x - r["busy"]["p50"]) for r in peers for x in r["busy_per_step"])
        excess = cand["busy"]["p50"] - base
        n = min(len(r["busy_per_step"]) for r in group)
        if n < MIN_STEPS:
            continue
        wins = sum(max(group, key=lambda r: r["busy_per_step"][i]) is cand for i in range(n))
        if excess > max(4 * spread, 0.1 * base) and wins >= 0.6 * n:
            if found is None or excess > found["excess_s"]:
                found = {
                    "rank": cand["rank"],
                    "excess_s": excess,
                    "peers_busy_s": base,
                    "spread_s": spread,
                    "busiest_steps": wins,
                    "of": n,
                }
    return found


def step_report(answers: Sequence[Mapping], *, skip: int = 1) -> dict:
    """From every rank's answer (``"steps"``: its step records; ``"coords"``): the table and the straggler."""
    stages = [a["coords"].get("pp", 0) for a in answers]
    rows = rank_table([a["steps"] for a in answers], skip=skip, stages=stages)
    return {"ranks": rows, "straggler": find_straggler(rows)}


def report_lines(report: Mapping) -> list[str]:
    """Text lines for a summary: per rank p50/p90/p99 (ms), and the straggler line only when found."""
    rows = report["ranks"]
    waits = any(r["input_wait"]["p90"] > 0 for r in rows)
    head = f"  step times over {rows[0]['steps']} steps (ms; p50 / p90 / p99): iteration, own work (step − collectives)"
    lines = [head + (", input wait" if waits else "")]
    for r in rows:
        cells = [_ms(r["seconds"]), _ms(r["busy"])] + ([_ms(r["input_wait"])] if waits else [])
        lines.append(f"    rank {r['rank']}: " + "; ".join(cells))
    s = report.get("straggler")
    if s:
        lines.append(
            f"  straggler: rank {s['rank']}, its own work {s['excess_s'] * 1e3:.1f} ms a step above its peers' "
            f"{s['peers_busy_s'] * 1e3:.1f} ms (busiest in {s['busiest_steps']} of {s['of']} steps)"
        )
    return lines


def _ms(p: Mapping) -> str:
    return " / ".join(f"{p[k] * 1e3:.1f}" for k in ("p50", "p90", "p99"))
