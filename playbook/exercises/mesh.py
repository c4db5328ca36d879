"""Exercise 7 — the hybrid mesh: the ranks of every group for a layout.

A layout ``ParallelDims(dp, tp, pp, cp)`` numbers its ranks with tp fastest, then cp, dp, pp
(Megatron-LM's order, Narayanan et al. 2021, arXiv:2104.04473, §3: tensor-parallel partners are
neighbours, on the fastest links of a node):

    rank = tp_i + tp·(cp_i + cp·(dp_i + dp·pp_i))

A group along an axis is the ranks that differ only in that axis' coordinate. Write
``groups(dims, axis) -> list[list[int]]`` for axis in tp, cp, dp, pp. ``check`` compares with
``playbook.dims.ParallelDims.groups`` (the groups the runtime mesh builds its process groups from)
on several layouts.
"""

from __future__ import annotations

from playbook.dims import AXES, ParallelDims
from playbook.exercises._common import NotYetWritten, Verdict

NAME = "hybrid mesh: the ranks of every group"
LAYOUTS = [ParallelDims(dp=2, tp=2, pp=2), ParallelDims(dp=2, tp=4), ParallelDims(tp=2, cp=2, pp=2), ParallelDims(dp=4)]
_STRIDE = {"tp": "1", "cp": "tp", "dp": "tp·cp", "pp": "tp·cp·dp"}


def solution(dims: ParallelDims, axis: str) -> list[list[int]]:
    """The reference answer: fix every other coordinate, vary this one."""
    sizes = {a: getattr(dims, a) for a in AXES}  # tp, cp, dp, pp: fastest first
    stride = 1
    for a in AXES[: AXES.index(axis)]:
        stride *= sizes[a]
    out = []
    for r in range(dims.world):
        if (r // stride) % sizes[axis] == 0:  # r is the first rank of its group
            out.append([r + i * stride for i in range(sizes[axis])])
    return out


def _one(fn, dims: ParallelDims, axis: str) -> str:
    try:
        got = fn(dims, axis)
        groups = [sorted(int(r) for r in g) for g in got]
    except NotYetWritten:
        raise
    except Exception as e:  # noqa: BLE001 - the learner's error, in one line
        return f"groups({dims}, {axis!r}) raised {type(e).__name__}: {e}"
    want = dims.groups(axis)
    if sorted(groups) == want:
        return ""
    where = f"{dims} ({dims.world} ranks), axis {axis}"
    flat = sorted(r for g in groups for r in g)
    if flat != list(range(dims.world)):
        missing = sorted(set(range(dims.world)) - set(flat))
        twice = sorted({r for r in flat if flat.count(r) > 1})
        return f"{where}: every rank must be in exactly one {axis} group; yours " + (
            f"leave out {missing}" if missing else f"put {twice} in more than one"
        )
    size = getattr(dims, axis)
    if any(len(g) != size for g in groups):
        return f"{where}: your groups have {sorted({len(g) for g in groups})} ranks; {axis}={size}"
    for other in AXES:
        if other != axis and getattr(dims, other) == size and sorted(groups) == dims.groups(other):
            return (
                f"{where}: your {axis} groups are this layout's {other} groups {dims.groups(other)}; ranks go tp fastest, "
                f"then cp, dp, pp, so the ranks of one {axis} group are {_STRIDE[axis]} apart: {want}"
            )
    first = next(g for g in sorted(groups) if g not in want)
    right = dims.ranks_along(axis, first[0])
    return f"{where}: your group {first} should be {right} (the {axis} partners of rank {first[0]} are {_STRIDE[axis]} apart)"


def check(fn) -> Verdict:
    """Compare ``fn(dims, axis)`` with the runtime's groups on several layouts."""
    try:
        for dims in LAYOUTS:
            for axis in AXES:
                problem = _one(fn, dims, axis)
                if problem:
                    return Verdict(NAME, False, problem)
    except NotYetWritten:
        return Verdict(NAME, False, "not yet written — fill in the cell above, then run the check again")
    numbers = {
        str(d): f"{d.world} ranks, " + ", ".join(f"{len(d.groups(a))} {a} groups" for a in d.active) for d in LAYOUTS
    }
    return Verdict(NAME, True, f"your groups equal the runtime mesh's for {len(LAYOUTS)} layouts, every axis", numbers)
