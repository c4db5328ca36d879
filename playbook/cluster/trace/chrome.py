"""A run's measured timeline in the Chrome trace event format, for Perfetto or ``chrome://tracing``.

Engineers read distributed runs as timelines with one row per rank; PyTorch's profiler writes
this format too. :func:`chrome_trace` turns the tracer's spans (``playbook.cluster.trace.tracer``) into

- one *process* per rank (``pid`` = rank), with two *threads*: compute (the step, forward,
  backward, pipeline actions: whatever the code marked with ``tracer.span``) and communication
  (every collective and point-to-point message);
- a *complete event* (``"ph": "X"``) per span, in microseconds from the first span of the run,
  with the bytes, bytes sent, mesh axis, group and dtype in its ``args``;
- a *flow* (``"ph": "s"`` then ``"f"``) from each send to the receive that took it: the k-th
  message from rank a to rank b with tag t is the k-th receive at b from a with tag t, the order
  both gloo and NCCL deliver in (a ``batch_isend_irecv`` counts each message of its list: a ring
  step's arrows leave and enter the same slice);
- an *instant event* (``"ph": "i"``) at every step boundary (compute spans named ``step N``);
- optionally, one rank's ``torch.profiler`` operators beside its spans (:func:`fold_profile`).

The format: Google's "Trace Event Format" document (the JSON Object Format, ``traceEvents``).
Open the file at https://ui.perfetto.dev (it stays in the browser) or in ``chrome://tracing``.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

COMPUTE, COMM = 0, 1  # thread ids inside each rank's process
_ARGS = ("bytes", "sent_bytes", "axis", "group", "group_size", "dtype", "peer", "tag")
_SENDS, _RECVS = {"send", "isend"}, {"recv", "irecv"}


def _get(span, key, default=None):
    return span.get(key, default) if isinstance(span, dict) else getattr(span, key, default)


def _end(span) -> float:
    """When the span finished: an async op that was never waited on ends where it started."""
    for key in ("end", "waited"):
        value = _get(span, key)
        if value is not None:
            return value
    return _get(span, "start")


def chrome_trace(spans, *, title: str = "playbook run", torch_profile: tuple[int, dict] | None = None) -> dict:
    """The Chrome trace (a JSON-ready dict) of ``spans``: ``Span`` objects or their dicts, of any
    number of ranks (``ranks.last_trace`` holds every rank's spans of the last call).
    ``torch_profile=(rank, trace)``: fold in what ``torch.profiler`` exported on that rank during
    the same call (its ``export_chrome_trace`` file, loaded), on the same clock (:func:`fold_profile`)."""
    spans = sorted(spans, key=lambda s: (_get(s, "rank"), _get(s, "start")))
    if not spans:
        return {"traceEvents": [], "displayTimeUnit": "ms", "otherData": {"title": title}}
    t0 = min(_get(s, "start") for s in spans)
    us = lambda t: round((t - t0) * 1e6, 3)  # noqa: E731  seconds since the first span -> microseconds
    events: list[dict] = []
    for rank in sorted({_get(s, "rank") for s in spans}):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for tid, name in ((COMPUTE, "compute"), (COMM, "communication")):
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
    sends, recvs = defaultdict(list), defaultdict(list)
    for s in spans:
        rank, kind, name = _get(s, "rank"), _get(s, "kind"), _get(s, "name")
        start, end = us(_get(s, "start")), us(_end(s))
        event = {
            "ph": "X",
            "name": name,
            "cat": kind,
            "pid": rank,
            "tid": COMM if kind == "comm" else COMPUTE,
            "ts": start,
            "dur": max(end - start, 0.0),
        }
        if kind == "comm":
            event["args"] = {k: _get(s, k) for k in _ARGS if _get(s, k) not in (None, "")}
        events.append(event)
        if kind == "compute" and name.startswith("step "):
            events.append({"ph": "i", "s": "g", "name": name, "pid": rank, "tid": COMPUTE, "ts": start})
        for way, peer, tag in _messages(s):
            where = (rank, peer) if way == "send" else (peer, rank)  # (from, to)
            (sends if way == "send" else recvs)[where + (tag,)].append(event)
    for flow_id, (key, out, into) in enumerate(
        (key, a, b) for key in sorted(sends) for a, b in zip(sends[key], recvs.get(key, []))
    ):
        events.append(_flow("s", flow_id, out, key))
        events.append(_flow("f", flow_id, into, key))
    if torch_profile is not None:
        events += fold_profile(*torch_profile, t0=t0)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"title": title}}


TORCH_TIDS = 2  # the profiler's threads of a rank come after its compute and communication threads


def fold_profile(rank: int, profile: dict, *, t0: float) -> list[dict]:
    """The complete events of one rank's ``torch.profiler`` Chrome export, moved onto this file's
    clock: the profiler stamps µs of wall-clock time after its ``baseTimeNanoseconds``, the tracer
    ``time.perf_counter()`` seconds (both clocks are shared by every process on one machine; their
    difference is read here). Each profiler thread becomes a thread of process ``rank``, after the
    compute and communication threads, named "torch.profiler" (operators, with their own args)."""
    shift = profile.get("baseTimeNanoseconds", 0) / 1e3 - (time.time() - time.perf_counter()) * 1e6 - t0 * 1e6
    kept = [e for e in profile.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    tids = {tid: TORCH_TIDS + i for i, tid in enumerate(sorted({str(e.get("tid")) for e in kept}))}
    out = [
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": f"torch.profiler {original}"}}
        for original, tid in tids.items()
    ]
    for e in sorted(kept, key=lambda e: e["ts"]):
        out.append({**e, "pid": rank, "tid": tids[str(e.get("tid"))], "ts": round(e["ts"] + shift, 3)})
    return out


def _messages(span) -> list[tuple[str, int, int]]:
    """The point-to-point messages a span carries, as ("send" | "recv", global peer, tag): one for a
    send or receive, each of its list for a ``batch_isend_irecv`` (a ring step sends and receives)."""
    if _get(span, "kind") != "comm":
        return []
    name, peer = _get(span, "name"), _get(span, "peer")
    if name in _SENDS | _RECVS and peer is not None:
        return [("send" if name in _SENDS else "recv", peer, _get(span, "tag", 0))]
    return [tuple(m) for m in _get(span, "p2p", ()) or ()]


def _flow(phase: str, flow_id: int, slice_: dict, key: tuple) -> dict:
    """One end of a flow arrow, placed inside the slice it binds to (its midpoint)."""
    event = {
        "ph": phase,
        "id": flow_id,
        "name": f"message {key[0]}→{key[1]} tag {key[2]}",
        "cat": "p2p",
        "pid": slice_["pid"],
        "tid": slice_["tid"],
        "ts": slice_["ts"] + slice_["dur"] / 2,
    }
    if phase == "f":
        event["bp"] = "e"  # bind to the enclosing slice (the receive)
    return event


def write_chrome_trace(path, spans, *, title: str = "playbook run", torch_profile=None) -> Path:
    """Write :func:`chrome_trace` of ``spans`` to ``path`` (JSON); returns the path.
    ``torch_profile=(rank, file)``: fold in that rank's ``torch.profiler`` export (a path or its dict)."""
    path = Path(path)
    if torch_profile is not None and not isinstance(torch_profile[1], dict):
        torch_profile = (torch_profile[0], json.loads(Path(torch_profile[1]).read_text()))
    path.write_text(json.dumps(chrome_trace(spans, title=title, torch_profile=torch_profile)))
    return path
