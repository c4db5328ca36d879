"""The runtime mesh: a ``ParallelDims`` made real, one process group per axis, built once per rank set.

``build_mesh(dims)`` (or ``ctx.mesh_for(dims)`` in a rank function) returns this rank's
:class:`Mesh`: its coordinates and a process group for each axis of ``playbook.dims.GROUP_AXES``
(``tp``, ``cp``, ``dp``, ``pp``, and the combined ``dp_cp``, ``ep``, ``ep_replica``). Groups are
created once per process and per list of ranks and then cached, so a persistent rank set pays for
them on the first call only (no ``new_group`` per call or per step), and two meshes that share a
group share its process group.

``new_group`` is called by every rank of the world for every group, axis by axis in one fixed
order (torch requires it; creating a group from its members alone, ``use_local_synchronization``,
hung on gloo once the world had made other groups). An axis that spans the whole world uses the
world group itself. The ``ep`` groups are their own process groups even where their ranks are
those of ``dp_cp`` (ep = dp·cp), so that the trace tells the all-to-alls (ep) from the gradient
sums (dp).

A group-local rank becomes a global one in exactly one place, :meth:`Mesh.global_rank`: pass it to
``dst``/``src`` of point-to-point calls (``isend(..., dst=r, group=g)`` reads ``r`` as a *global*
rank in torch; a pipeline inside a mesh would otherwise talk to the wrong ranks).
"""

from __future__ import annotations

import torch.distributed as dist

from playbook.dims import GROUP_AXES, ParallelDims
from playbook.cluster.trace import tracer as trace

_groups: dict[tuple, object] = {}  # per process: (kind, *ranks) -> process group
_meshes: dict[ParallelDims, Mesh] = {}


def _group(ranks: list[int], kind: str = ""):
    """The process group of ``ranks`` (created on first use). Every rank of the world calls this
    for every group, in the same order (``new_group`` needs the whole world), so the cache below is
    the same on every rank and each group is created once per process."""
    if not kind and list(ranks) == list(range(dist.get_world_size())):  # the whole world, in order
        return dist.group.WORLD
    key = (kind, *ranks)
    if key not in _groups:
        _groups[key] = dist.new_group(list(ranks))
    return _groups[key]


def _axis_group(dims: ParallelDims, axis: str, rank: int):
    """This rank's group along ``axis``, after creating every group of the axis (world-wide)."""
    kind = "ep" if axis == "ep" and dims.ep > 1 else ""
    mine = None
    for ranks in dims.groups(axis):
        g = _group(ranks, kind)
        mine = g if rank in ranks else mine
    return mine


def axis_label(dims: ParallelDims, axis: str) -> str:
    """The name a collective on ``axis`` is reported under: a combined axis is named by its parts
    with more than one rank (``dp_cp`` is ``dp`` when cp = 1), so predictions and measurements agree."""
    if axis == "dp_cp":
        parts = [a for a in ("dp", "cp") if dims.size(a) > 1]
        return "×".join(parts) if len(parts) != 1 else parts[0]
    if axis == "ep_replica":
        return "ep_replica" if dims.ep > 1 else axis_label(dims, "dp_cp")
    return axis


class Mesh:
    """This rank's place in a layout, with a process group per axis (see the module docstring)."""

    def __init__(self, dims: ParallelDims, rank: int, groups: dict[str, object]):
        self.dims, self.rank, self.groups = dims, rank, groups
        self.coords = dims.coords(rank)
        self._device_mesh = None

    def __repr__(self) -> str:
        where = ", ".join(f"{a}={self.coords[a]}" for a in ("tp", "cp", "dp", "pp"))
        return f"Mesh({self.dims}, rank {self.rank}: {where})"

    def group(self, axis: str):
        """The process group of this rank along ``axis``."""
        if axis not in self.groups:
            raise ValueError(f"unknown axis {axis!r}; axes are {', '.join(GROUP_AXES)}")
        return self.groups[axis]

    def size(self, axis: str) -> int:
        return self.dims.size(axis)

    def ranks(self, axis: str) -> list[int]:
        """Global ranks of this rank's group along ``axis``, in group order."""
        return self.dims.ranks_along(axis, self.rank)

    def index(self, axis: str) -> int:
        """This rank's position in its group along ``axis`` (its group-local rank)."""
        return self.ranks(axis).index(self.rank)

    def global_rank(self, axis: str, local: int) -> int:
        """The global rank of group-local rank ``local`` along ``axis``: the one place where the two meet."""
        members = self.ranks(axis)
        if not 0 <= local < len(members):
            raise ValueError(f"{axis} rank {local} is outside this {axis} group of {len(members)} ranks {members}")
        return members[local]

    def labels(self) -> dict:
        """{process group: axis name} for the tracer; a group shared by several axes keeps the first name."""
        out: dict = {}
        for axis in GROUP_AXES:
            g = self.groups[axis]
            if self.dims.size(axis) > 1 and g not in out:
                out[g] = axis_label(self.dims, axis)
        return out

    def activate(self) -> Mesh:
        """Make the tracer name collectives by this mesh's axes."""
        trace.label_groups(self.labels())
        return self

    def device_mesh(self, device_type: str = "cpu"):
        """PyTorch's ``DeviceMesh`` over the same grid, dims named ("pp", "dp", "cp", "tp"), for the
        native counterparts (FSDP2, DTensor). Built on first use, by every rank of the world."""
        if self._device_mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            d = self.dims
            self._device_mesh = init_device_mesh(
                device_type, (d.pp, d.dp, d.cp, d.tp), mesh_dim_names=("pp", "dp", "cp", "tp")
            )
        return self._device_mesh


def build_mesh(dims: ParallelDims) -> Mesh:
    """This rank's mesh for ``dims`` (cached per process); every rank of the world must call it."""
    world = dist.get_world_size()
    if dims.world != world:
        raise ValueError(
            f"layout {dims} needs {dims.world} ranks but this world has {world}; "
            f"start {dims.world} ranks or choose degrees whose product is {world}"
        )
    if dims not in _meshes:
        rank = dist.get_rank()
        groups = {axis: _axis_group(dims, axis, rank) for axis in GROUP_AXES}
        _meshes[dims] = Mesh(dims, rank, groups)
    return _meshes[dims].activate()


def world_mesh() -> Mesh:
    """The default: every rank along one data-parallel axis (the world group), as chapters 1–6 use."""
    return build_mesh(ParallelDims(dp=dist.get_world_size()))
