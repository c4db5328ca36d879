"""Measure communication and compute: a per-rank tracer of every ``torch.distributed`` collective.

``install()`` wraps the collectives of the ``torch.distributed`` namespace once per process; each call
is then recorded in the *current* :class:`Tracer` (one per rank function call) as a :class:`Span`
with the op, the group, the buffer bytes as issued and the bytes each rank sends under the ring
algorithm (Patarasuk & Yuan 2009; ``theory.cost.comm``: all-reduce 2S(n-1)/n; all-gather, reduce-scatter, all-to-all S(n-1)/n;
broadcast S, where S is the full buffer in bytes). Compute spans come from ``tracer.span(name)``.

Only calls made through the ``torch.distributed`` namespace are seen (``dist.all_reduce(...)``);
collectives issued from C++ (DDP's reducer) or through functional collectives are not.
Times are ``time.perf_counter()`` seconds, a monotonic clock shared by all processes on one machine.
"""

from __future__ import annotations

import functools
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch.distributed as dist

from playbook.cluster.trace import spans as collectives
from playbook.cluster.trace.sizes import P2P_PEER, call_peer, call_sizes


@dataclass
class Span:
    """One interval on one rank: a collective (``kind="comm"``) or a named compute region."""

    rank: int
    kind: str  # "comm" | "compute"
    name: str  # op name ("all_reduce", ...) or the compute label
    start: float
    end: float | None = None  # None while an async op has not been waited on
    bytes: int = 0  # buffer bytes as issued (the full, gathered size for all-gather/reduce-scatter)
    sent_bytes: float = 0.0  # bytes this rank sends under the ring algorithm
    group_size: int = 1
    group: str = "world"
    dtype: str = ""
    waited: float | None = None  # async ops: when wait() returned (end is when the op completed)
    axis: str = ""  # the mesh axis the group belongs to ("tp", "dp", ...; see ``label_groups``)
    peer: int | None = None  # point-to-point: the global rank sent to (send) or received from (recv)
    tag: int = 0  # point-to-point: the message tag (a send and its receive carry the same)
    p2p: tuple = ()  # batch_isend_irecv: each message as ("send" | "recv", global peer, tag), in order

    @property
    def duration(self) -> float:
        return 0.0 if self.end is None else self.end - self.start

    def as_dict(self) -> dict:
        return asdict(self)


def _group_of(group) -> tuple[int, str]:
    if group is None or group is dist.group.WORLD:
        return dist.get_world_size(), "world"
    ranks = dist.get_process_group_ranks(group)
    return len(ranks), "ranks" + "-".join(map(str, ranks))


_labels: dict[int, str] = {}  # id(process group) -> mesh axis, set by the runtime mesh in use


def label_groups(labels: dict) -> None:
    """Name the mesh axis of each process group (``{group: "tp", ...}``); replaces earlier names.
    The runtime mesh (``playbook.cluster.mesh``) calls this whenever a mesh is taken into use."""
    _labels.clear()
    _labels.update({id(g): name for g, name in labels.items()})


@contextmanager
def on_axis(name: str):
    """Label the collectives issued in this block with axis ``name`` whatever their group: for a
    group that serves two axes at once (ep = dp: the all-to-all is "ep", the gradient sum "dp")."""
    previous = getattr(_current, "axis", None)
    _current.axis = name
    try:
        yield
    finally:
        _current.axis = previous


def _axis_of(group) -> str:
    forced = getattr(_current, "axis", None)
    if forced:
        return forced
    return _labels.get(id(group if group is not None else dist.group.WORLD), "")


TRACED_OPS = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "gather",
    "scatter",
    "barrier",
)
_ASYNC_ALWAYS = {"isend", "irecv", "batch_isend_irecv"}


class Tracer:
    """Records the spans of one rank. ``on_status(text)`` is told what the rank is waiting in
    (``""`` when it is not in a collective): the launcher uses it to say where a hang is."""

    def __init__(self, rank: int = 0, on_status=None):
        self.rank = rank
        self.spans: list[Span] = []
        self.on_status = on_status or (lambda text: None)

    @contextmanager
    def span(self, name: str):
        """Record a compute region: ``with tracer.span("forward"): ...``."""
        s = Span(self.rank, "compute", name, time.perf_counter())
        self.spans.append(s)
        try:
            yield s
        finally:
            s.end = time.perf_counter()

    def comm(self) -> list[Span]:
        return [s for s in self.spans if s.kind == "comm"]

    def bytes_by_op(self, key: str = "sent_bytes") -> dict[str, float]:
        """Total ``sent_bytes`` (or ``bytes``) per collective op, over the recorded spans."""
        return collectives.bytes_by_op(self.spans, key)

    def counts_by_op(self) -> dict[str, int]:
        return collectives.counts_by_op(self.spans)


def _close(span: Span) -> None:
    """End ``span`` now, unless an earlier end was already stamped."""
    now = time.perf_counter()
    span.end = now if span.end is None else min(span.end, now)


class _TracedWork:
    """Wraps the handle of an async op. Its span ends when the collective completes (stamped by a
    callback on the op's future), not when somebody gets round to ``wait()``: that is what shows
    communication overlapping compute."""

    def __init__(self, work, span: Span, tracer: Tracer):
        self._work, self._span, self._tracer = work, span, tracer
        if hasattr(work, "get_future"):
            try:
                work.get_future().then(lambda _fut: _close(span))
            except RuntimeError:  # a backend without futures: the end is taken at wait()
                pass

    def wait(self, *args, **kwargs):
        self._tracer.on_status(f"waiting in {self._span.name} ({self._span.bytes} B, group {self._span.group})")
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            _close(self._span)
            self._span.waited = time.perf_counter()
            self._tracer.on_status("")

    def __getattr__(self, name):
        return getattr(self._work, name)


_current = threading.local()
_process = {"tracer": None}  # for threads that did not open the block (CUDA runs backward on its own thread)
_installed: dict[str, object] = {}


def current() -> Tracer | None:
    return getattr(_current, "tracer", None) or _process["tracer"]


@contextmanager
def recording(tracer: Tracer):
    """Make ``tracer`` the one that traced collectives are recorded in, for the block: on this
    thread, and on any other thread of the process (autograd's device threads) while it lasts."""
    previous, previous_process = getattr(_current, "tracer", None), _process["tracer"]
    _current.tracer = _process["tracer"] = tracer
    try:
        yield tracer
    finally:
        _current.tracer, _process["tracer"] = previous, previous_process


def _wrap(op: str, fn):
    @functools.wraps(fn)
    def traced(*args, **kwargs):
        tracer = current()
        if tracer is None or getattr(_current, "depth", 0):  # untraced, or called from a traced op
            return fn(*args, **kwargs)
        group = kwargs.get("group")
        if group is None and op in ("all_reduce", "broadcast", "all_gather") and len(args) > 2:
            group = args[2]  # (tensor, op|src, group) and (tensor_list, tensor, group)
        if op == "batch_isend_irecv":
            group = (args[0] if args else kwargs["p2p_op_list"])[0].group
        n, name = _group_of(group)
        rank_in_group = dist.get_rank(group) if group is not None else dist.get_rank()
        S, sent, dtype = call_sizes(op, args, kwargs, n, rank_in_group)
        axis = _axis_of(group)
        span = Span(tracer.rank, "comm", op, time.perf_counter(), None, S, sent, n, name, dtype, axis=axis)
        if op in P2P_PEER:
            span.peer, span.tag = call_peer(op, args, kwargs, group)
        elif op == "batch_isend_irecv":
            ops = args[0] if args else kwargs["p2p_op_list"]
            span.p2p = tuple(("send" if "send" in o.op.__name__ else "recv", o.peer, o.tag) for o in ops)
        tracer.spans.append(span)
        is_async = op in _ASYNC_ALWAYS or kwargs.get("async_op", False)
        if not is_async:
            tracer.on_status(f"waiting in {op} ({S} B, group {name}{f', axis {axis}' if axis else ''})")
        _current.depth = 1
        try:
            result = fn(*args, **kwargs)
        finally:
            _current.depth = 0
            if not is_async:
                span.end = time.perf_counter()
                tracer.on_status("")
        if not is_async:
            return result
        if isinstance(result, list):
            return [_TracedWork(w, span, tracer) for w in result]
        return _TracedWork(result, span, tracer) if result is not None else result

    traced.__wrapped_by_playbook__ = True
    return traced


class _P2POp(dist.P2POp):
    """``dist.P2POp`` that accepts the traced ``dist.isend``/``dist.irecv`` (torch checks identity)."""

    def __new__(cls, op, *args, **kwargs):
        return super().__new__(cls, getattr(op, "__wrapped__", op), *args, **kwargs)

    def __init__(self, op, *args, **kwargs):
        super().__init__(getattr(op, "__wrapped__", op), *args, **kwargs)


def install() -> None:
    """Wrap every op in :data:`TRACED_OPS` in the ``torch.distributed`` namespace (idempotent)."""
    if "P2POp" not in _installed:
        _installed["P2POp"] = dist.P2POp
        dist.P2POp = _P2POp
    for op in TRACED_OPS:
        fn = getattr(dist, op, None)
        if fn is None or getattr(fn, "__wrapped_by_playbook__", False):
            continue
        _installed[op] = fn
        setattr(dist, op, _wrap(op, fn))


def uninstall() -> None:
    for op, fn in _installed.items():
        setattr(dist, op, fn)
    _installed.clear()
