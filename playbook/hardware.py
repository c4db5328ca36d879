"""Configure: hardware profiles from ``data/hardware/`` (an accelerator or CPU and its links), and the
product's one rule for whether a rank's bytes fit (``MEM_UTIL``).

Every profile is validated where it is read, and a bad one is refused with the field it breaks and
values that would work (``playbook.validate``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from playbook.config import DATA_DIR, preset_file
from playbook.validate import check_hardware, read_json_object

HARDWARE_DIR = DATA_DIR / "hardware"
# The product's one rule for "does it fit": a rank's bytes against MEM_UTIL of the memory the device
# reports (``Hardware.capacity_bytes``: nvidia-smi's 81,559 MiB on an "80 GB" H100, the datasheet's
# figure where a profile does not know it), i.e. ``Hardware.usable_bytes``. 0.9 is a planning
# assumption, not a measurement: the CUDA context, NCCL's buffers and the allocator's fragmentation
# are not counted (vLLM's gpu_memory_utilization default is the same 0.9).
MEM_UTIL = 0.9


@dataclass(frozen=True)
class Hardware:
    """One accelerator (or CPU) and its links. Units: bytes, FLOP/s, bytes/s (decimal, as vendors quote)."""

    name: str
    memory_bytes: float
    peak_bf16_flops: float
    memory_bandwidth: float
    intra_node_bandwidth: float  # per direction, per device (NVLink, xGMI, or shared memory for the CPU)
    inter_node_bandwidth: float  # per device (NIC)
    devices_per_node: int = 8
    source: str = field(default="", compare=False)
    # for the planner (playbook.theory.plan.planner); defaults keep older profiles and callers working
    intra_node_latency: float = 5e-6  # seconds per ring step inside a node (alpha of the alpha-beta model)
    inter_node_latency: float = 5e-6  # seconds per ring step between nodes
    achievable_flops_fraction: float = 0.5  # share of peak_bf16_flops the matmul-bound compute reaches
    sms: int = 0  # streaming multiprocessors (AMD: compute units): the waves of a GEMM (theory.gemm_efficiency)
    reported_memory_bytes: float = 0.0  # the total the driver reports (nvidia-smi); 0: memory_bytes (capacity_bytes)
    planning_source: str = field(default="", compare=False)  # where the three planning numbers come from
    peak_fp8_flops: float = 0.0  # dense FP8 FLOP/s, read by --precision fp8 (theory.plan.precision); 0: none
    # bytes/s each node writes to the checkpoint store (theory.life.checkpoint); a cluster's storage, not the device's
    storage_bandwidth: float = 1e9
    storage_source: str = field(default="", compare=False)
    # written by ``playbook calibrate`` (playbook.measure.calibrate); empty for datasheet profiles
    collectives: dict = field(default_factory=dict, compare=False)  # op -> {alpha, beta, points, ...}
    matmul: list = field(default_factory=list, compare=False)  # [{size, flops_per_s}]: square matmuls measured
    load_average: dict = field(default_factory=dict, compare=False)  # os.getloadavg() before/after
    date: str = field(default="", compare=False)  # when it was measured (UTC, ISO 8601)

    @classmethod
    def preset(cls, name: str) -> Hardware:
        """A profile of ``data/hardware/`` by name, or any profile file by its path (``….json``),
        such as the one ``playbook calibrate --out`` wrote."""
        if name.endswith(".json"):
            path = Path(name).expanduser()
            if not path.exists():
                raise ValueError(f"no hardware profile file {name!r}; write one with `playbook calibrate --out {name}`")
            name = path.stem
        else:
            path = preset_file(
                "hardware profile", name, HARDWARE_DIR, "; or a profile file by its path, ending in .json"
            )
        raw = read_json_object(path, "hardware profile")
        where = f"hardware profile {str(path)!r}"
        check_hardware(where, raw)
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in fields and k != "name"}, name=name)

    @property
    def capacity_bytes(self) -> float:
        """Device memory as the driver reports it when the profile knows it (an "80 GB" H100 reports
        81,559 MiB), else ``memory_bytes`` as the datasheet quotes it: what the planner fills."""
        return self.reported_memory_bytes or self.memory_bytes

    @property
    def usable_bytes(self) -> float:
        """What a fit is judged against everywhere (the planner, ``playbook memory``, the dashboards):
        ``MEM_UTIL`` of :attr:`capacity_bytes`."""
        return MEM_UTIL * self.capacity_bytes

    @property
    def fit_label(self) -> str:
        """How a figure names that line: e.g. "h100-sxm: 90 % of 85.5 GB"."""
        return self.fit_label_in("GB")

    def fit_label_in(self, unit: str) -> str:
        """:attr:`fit_label` in the unit of the figure it labels (``"GB"`` or ``"GiB"``), so that one
        label never mixes the two: "h100-sxm: 90 % of 79.6 GiB"."""
        scale = {"GB": 1e9, "GiB": 2**30}.get(unit)
        if scale is None:
            raise ValueError(f"unit must be 'GB' or 'GiB'; got {unit!r}")
        return f"{self.name}: {MEM_UTIL * 100:.0f} % of {self.capacity_bytes / scale:.1f} {unit}"

    @staticmethod
    def presets() -> list[str]:
        return sorted(p.stem for p in HARDWARE_DIR.glob("*.json"))
