"""A cluster's communication domains as a tree of levels (innermost first), read from ``data/topology/``.

Each :class:`Level` groups ``size`` units of the level below it (level 0 groups GPUs): an NVLink
domain of 8 GPUs (a DGX H100) or 72 (a GB200 NVL72 rack), GPUs under one PCIe switch, switches on
one CPU socket, sockets of one machine (their traffic crosses UPI/xGMI), nodes on a leaf switch,
leaves on a spine. ``bandwidth`` is per GPU and per direction for traffic that crosses the level
(leaves the unit below it), ``latency`` the seconds of one step of a ring over it (the α of the
α–β model, Hockney 1994), and ``oversubscription`` the ratio of the bandwidth into the level's
switches to the bandwidth out of them (2: a leaf with 32 ports down and 16 up), so that with every
GPU sending across it at once each gets ``bandwidth / oversubscription`` (:attr:`Level.effective`).
``rails``: how many NICs of a node reach separate leaf switches (NVIDIA's rail-optimized DGX
SuperPOD: NIC *i* of every node on leaf *i*), so that GPUs of the same local rank reach each
other through one switch; 0: every NIC of a node on the same leaf (a top-of-rack switch).
``storage``: the bandwidth per node of the checkpoint path (:func:`storage_bandwidth`).

A two-level hardware profile (``playbook.hardware``: one bandwidth inside a node, one between
nodes, ``devices_per_node``) is the simplest topology (:func:`from_hardware`); its ``collectives``
is "flat", the profiles' own model (a group that leaves the node pays the NIC for its whole ring),
so plans on it are the planner's plans unchanged. Pure: no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from playbook.config import DATA_DIR, preset_file
from playbook.hardware import Hardware
from playbook.validate import Range, check_fields, read_json_object, require_keys

TOPOLOGY_DIR = DATA_DIR / "topology"
KINDS = ("link", "pcie", "numa", "node", "leaf", "spine")  # scale-up kinds first, then the network's
SCALE_UP = ("link", "pcie", "numa", "node")  # levels inside one machine or NVLink domain
COLLECTIVES = ("hierarchical", "flat")
_LEVEL = {
    "size": Range("int", 1, 1_000_000, "8"),
    "bandwidth": Range("number", 0, 1e15, "5e10", open_low=True),
    "latency": Range("number", 0, 1.0, "1e-5"),
    "oversubscription": Range("number", 1, 1000, "2"),
}
_TOP = {"rails": Range("int", 0, 64, "8")}
_STORAGE = {"bandwidth": Range("number", 0, 1e15, "4e9", open_low=True)}


@dataclass(frozen=True)
class Level:
    name: str
    kind: str  # one of KINDS
    size: int  # units of the level below in one unit of this one (level 0: GPUs)
    bandwidth: float  # bytes/s per GPU per direction, crossing this level
    latency: float  # seconds per ring step over this level
    oversubscription: float = 1.0
    source: str = ""

    @property
    def effective(self) -> float:
        """Bytes/s each GPU gets across this level when every GPU sends across it at once."""
        return self.bandwidth / self.oversubscription


@dataclass(frozen=True)
class Topology:
    name: str
    hardware: str  # the profile of data/hardware/ for the GPU itself (memory, FLOP/s)
    levels: tuple[Level, ...]
    rails: int = 0
    collectives: str = "hierarchical"  # or "flat" (the two-level profiles' model)
    storage: float = 0.0  # bytes/s per node to checkpoint storage; 0: not known
    source: str = ""

    def capacity(self, i: int) -> int:
        """GPUs in one unit of level ``i`` (level −1: one GPU)."""
        return math.prod(lv.size for lv in self.levels[: i + 1])

    @property
    def gpus(self) -> int:
        """The most GPUs the topology holds."""
        return self.capacity(len(self.levels) - 1)

    @property
    def node_gpus(self) -> int:
        """GPUs of the largest scale-up domain (NVLink, PCIe, sockets of one machine): the planner's
        "GPUs per node", past which tp is refused."""
        inner = [i for i, lv in enumerate(self.levels) if lv.kind in SCALE_UP]
        return self.capacity(inner[-1]) if inner else 1

    def level(self, name: str) -> Level:
        for lv in self.levels:
            if lv.name == name:
                return lv
        raise ValueError(f"topology {self.name!r} has no level {name!r}; its levels: {', '.join(self.names)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(lv.name for lv in self.levels)


def from_hardware(hw: Hardware) -> Topology:
    """The two-level profile as a topology: a node of ``devices_per_node`` GPUs on its intra-node
    link, nodes on a network at the NIC's bandwidth, priced "flat" as the planner always has."""
    top = max(1, 1_000_000 // hw.devices_per_node)
    levels = (
        Level("node", "node", hw.devices_per_node, hw.intra_node_bandwidth, hw.intra_node_latency, source=hw.source),
        Level("network", "spine", top, hw.inter_node_bandwidth, hw.inter_node_latency, source=hw.source),
    )
    storage = float(hw.storage_bandwidth)
    return Topology(hw.name, hw.name, levels, collectives="flat", storage=storage, source=hw.source)


def storage_bandwidth(topology: Topology) -> float:
    """Bytes/s per node to checkpoint storage (the ``storage`` entry of a topology file), for a
    checkpoint's save time (``theory.life.checkpoint.save_seconds``); a converted hardware profile's is
    the profile's ``storage_bandwidth``."""
    return topology.storage


def load_topology(name: str) -> Topology:
    """A topology of ``data/topology/`` by name, or a file by its path (``….json``); a bad file is
    refused in one line naming the field and a value that works."""
    if name.endswith(".json"):
        path = Path(name).expanduser()
        if not path.exists():
            known = ", ".join(presets())
            raise ValueError(f"no topology file {name!r}; give a path to one, or a name: {known}")
    else:
        try:
            path = preset_file("topology", name, TOPOLOGY_DIR, "; or a topology file by its path, ending in .json")
        except ValueError as e:
            raise ValueError(str(e).replace("topologys", "topologies")) from None
    where = f"topology {str(path)!r}"
    raw = read_json_object(path, "topology")
    return parse_topology(raw, where, path.stem)


def parse_topology(raw: dict, where: str, name: str) -> Topology:
    """A topology from its JSON object (``load_topology``'s format), checked field by field."""
    require_keys(where, raw, ["hardware", "levels", "storage"], "topology")
    Hardware.preset(raw["hardware"])  # a GPU profile that exists (one line if not)
    check_fields(where, raw, _TOP, sep=": ")
    mode = raw.get("collectives", "hierarchical")
    if mode not in COLLECTIVES:
        raise ValueError(f"{where}: collectives must be one of {', '.join(COLLECTIVES)}, got {mode!r}")
    if not isinstance(raw["levels"], list) or not raw["levels"]:
        raise ValueError(f'{where}: levels must be a non-empty list, innermost first, e.g. [{{"name": "nvlink", ...}}]')
    levels = []
    for i, lv in enumerate(raw["levels"]):
        at = f"{where}: levels[{i}]"
        if not isinstance(lv, dict):
            raise ValueError(f'{at} must be a JSON object, e.g. {{"name": "nvlink", "kind": "link", "size": 8, ...}}')
        require_keys(at, lv, ["name", "kind", "size", "bandwidth", "latency", "source"], "level")
        check_fields(at, lv, _LEVEL, sep=": ")
        if lv["kind"] not in KINDS:
            raise ValueError(f"{at}: kind must be one of {', '.join(KINDS)}, got {lv['kind']!r}")
        keys = ("name", "kind", "size", "bandwidth", "latency", "oversubscription", "source")
        levels.append(Level(**{k: lv[k] for k in keys if k in lv}))
    if len({lv.name for lv in levels}) < len(levels):
        raise ValueError(f"{where}: two levels share a name; name each once")
    storage = raw["storage"]
    if not isinstance(storage, dict):
        raise ValueError(f'{where}: storage must be a JSON object, e.g. {{"bandwidth": 4e9, "source": "..."}}')
    require_keys(f"{where}: storage", storage, ["bandwidth", "source"], "storage path")
    check_fields(f"{where}: storage", storage, _STORAGE, sep=": ")
    return Topology(
        name=name,
        hardware=raw["hardware"],
        levels=tuple(levels),
        rails=raw.get("rails", 0),
        collectives=mode,
        storage=float(storage["bandwidth"]),
        source=raw.get("source", ""),
    )


def presets() -> list[str]:
    return sorted(p.stem for p in TOPOLOGY_DIR.glob("*.json"))
