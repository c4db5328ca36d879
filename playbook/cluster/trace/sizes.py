"""What one traced ``torch.distributed`` call moves: its buffer bytes S, the bytes this rank sends
under the ring algorithm (Patarasuk & Yuan 2009; ``theory.cost.comm``: all-reduce 2S(n-1)/n; all-gather,
reduce-scatter, all-to-all S(n-1)/n; broadcast S), its dtype, and a point-to-point call's peer and
tag, read from the call's own arguments. ``cluster.trace.tracer`` records them as spans."""

from __future__ import annotations

import torch
import torch.distributed as dist

# How each traced op's buffer S and per-rank sent bytes are read from its arguments.
_RING = {
    "all_reduce": lambda S, n: 2 * S * (n - 1) / n,
    "broadcast": lambda S, n: S,
    "reduce": lambda S, n: S * (n - 1) / n,
}
_GATHER_LIKE = lambda S, n: S * (n - 1) / n  # noqa: E731  all-gather, reduce-scatter, all-to-all


def _nbytes(t) -> int:
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return 0


def _first_tensor(args, kwargs, *names):
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return args[0] if args else None


def call_sizes(op: str, args, kwargs, n: int, rank_in_group: int) -> tuple[int, float, str]:
    """(buffer bytes S, bytes this rank sends, dtype) for one call of ``op``."""
    a = list(args)
    if op in ("all_reduce", "broadcast", "reduce"):
        t = _first_tensor(a, kwargs, "tensor")
        return _nbytes(t), _RING[op](_nbytes(t), n), str(getattr(t, "dtype", ""))
    if op in ("all_gather_into_tensor", "all_gather_single", "reduce_scatter_tensor", "reduce_scatter_single"):
        out = a[0] if a else kwargs.get("output_tensor", kwargs.get("output"))
        inp = a[1] if len(a) > 1 else kwargs.get("input_tensor", kwargs.get("input"))
        full = out if op.startswith("all_gather") else inp
        return _nbytes(full), _GATHER_LIKE(_nbytes(full), n), str(full.dtype)
    if op == "all_gather":
        out = a[0] if a else kwargs["tensor_list"]
        return _nbytes(out), _GATHER_LIKE(_nbytes(out), n), str(out[0].dtype)
    if op == "reduce_scatter":
        inp = a[1] if len(a) > 1 else kwargs["input_list"]
        return _nbytes(inp), _GATHER_LIKE(_nbytes(inp), n), str(inp[0].dtype)
    if op == "all_to_all":
        inp = a[1] if len(a) > 1 else kwargs["input_tensor_list"]
        return _nbytes(inp), _nbytes(inp) - _nbytes(inp[rank_in_group]), str(inp[0].dtype)
    if op == "all_to_all_single":
        inp = a[1] if len(a) > 1 else kwargs["input"]
        splits = a[3] if len(a) > 3 else kwargs.get("input_split_sizes")
        S = _nbytes(inp)
        if splits:
            own = splits[rank_in_group] * (S // max(inp.shape[0], 1))
            return S, S - own, str(inp.dtype)
        return S, _GATHER_LIKE(S, n), str(inp.dtype)
    if op in ("send", "isend"):
        t = _first_tensor(a, kwargs, "tensor")
        return _nbytes(t), float(_nbytes(t)), str(t.dtype)
    if op in ("recv", "irecv"):
        t = _first_tensor(a, kwargs, "tensor")
        return _nbytes(t), 0.0, str(t.dtype)
    if op == "batch_isend_irecv":
        p2p = a[0] if a else kwargs["p2p_op_list"]
        sent = sum(_nbytes(o.tensor) for o in p2p if "send" in o.op.__name__)
        return sum(_nbytes(o.tensor) for o in p2p), float(sent), str(p2p[0].tensor.dtype) if p2p else ""
    if op in ("gather", "scatter"):
        t = _first_tensor(a, kwargs, "tensor")
        return _nbytes(t), float(_nbytes(t)), str(getattr(t, "dtype", ""))
    return 0, 0.0, ""  # barrier


P2P_PEER = {"send": "dst", "isend": "dst", "recv": "src", "irecv": "src"}


def call_peer(op: str, args, kwargs, group) -> tuple[int | None, int]:
    """(global peer rank, tag) of a point-to-point call: ``dst``/``src`` are global ranks in
    ``torch.distributed``; ``group_dst``/``group_src`` are ranks inside ``group``."""
    key = P2P_PEER[op]
    peer = kwargs.get(key, args[1] if len(args) > 1 else None)
    local = kwargs.get(f"group_{key}")
    if peer is None and local is not None:
        peer = dist.get_global_rank(group, local)
    return peer, int(kwargs.get("tag", args[3] if len(args) > 3 else 0) or 0)
