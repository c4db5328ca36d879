"""Predict one training step's time on a calibrated machine: compute + exposed communication + bubble.

With a profile that ``playbook calibrate`` wrote (``Hardware.preset(path)``):

- **compute** = FLOPs of this rank's share of the step (``theory.cost.flops.step_flops``: PaLM's 6N + attention
  count, Chowdhery et al. 2022 App. B) / a calibrated rate: the FLOP/s one process reaches training
  the same model alone, at one thread (``flops_per_s``), or, without it, the profile's matmul rate
  (``peak_bf16_flops × achievable_flops_fraction``), which on a CPU is 10× too fast for a whole
  step: softmax, norms, masking, AdamW and the Python between kernels do not count as FLOPs. Every strategy
  here splits the step's FLOPs evenly over its ranks (DP/ZeRO/CP/EP: the tokens; TP: every matmul's
  width; PP: the layers), so a rank's share is the total / world size;
- **communication** = Σ over collectives of calls · ring_steps · α + bytes sent · β, with α and β
  the calibrated fit of that collective (Hockney's α–β model, counted as ``theory.cost.comm`` counts
  the ring; ``theory.cost.alpha_beta``). All of it is counted as exposed: on this machine each rank
  has at most one core, so gloo's transfers compete with the compute they could hide behind;
- **bubble** (PP) = the schedule's idle time: (p − 1)/m of the ideal compute for 1F1B and GPipe
  (Narayanan et al. 2021, PipeDream-Flush; ``theory.pp.schedules.closed_form``).

No term is tuned to any measurement: what this leaves out (Python between kernels, the OS
scheduling more ranks than cores, gloo's per-call overhead beyond its fitted α) shows up as error.
Pure arithmetic, no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from playbook.config import ModelConfig, require_positive
from playbook.hardware import Hardware
from playbook.theory.cost.comm import ring_steps
from playbook.theory.cost.flops import step_flops
from playbook.theory.pp.schedules import closed_form

P2P_SENDS = ("send", "isend", "batch_isend_irecv")  # a message's cost is paid once, on its send
P2P_RECVS = ("recv", "irecv")


def family(op: str) -> str | None:
    """The calibrated collective an op is timed as (None for a receive: its send pays)."""
    for suffix in ("_into_tensor", "_single", "_tensor"):
        op = op.removesuffix(suffix)
    if op in P2P_SENDS:
        return "send"
    if op in P2P_RECVS:
        return None
    return op


@dataclass(frozen=True)
class Comm:
    """One collective's load in one step on one rank: ``calls`` calls over a group of
    ``group_size`` ranks that send ``sent_bytes`` in all (the ring counts of ``theory.cost.comm``)."""

    op: str
    group_size: int
    calls: float
    sent_bytes: float


def comm_seconds(hw: Hardware, load: Comm) -> float:
    """calls · ring_steps(op, n) · α + sent_bytes · β from the profile's fit of that collective
    (a datasheet profile without fits: its intra-node latency and bandwidth)."""
    op = family(load.op)
    if op is None or load.group_size <= 1:
        return 0.0
    fit = hw.collectives.get(op)
    alpha, beta = (fit["alpha"], fit["beta"]) if fit else (hw.intra_node_latency, 1 / hw.intra_node_bandwidth)
    return load.calls * ring_steps(op, load.group_size) * alpha + load.sent_bytes * beta


def achievable_flops(hw: Hardware) -> float:
    return hw.peak_bf16_flops * hw.achievable_flops_fraction


def pipeline_bubble(compute: float, pp: int, microbatches: int, schedule: str = "1f1b") -> float:
    """Idle seconds of a pipeline step whose ideal compute per rank is ``compute``."""
    if pp <= 1:
        return 0.0
    return closed_form(schedule, pp, microbatches)["bubble_over_ideal"] * compute


@dataclass(frozen=True)
class StepPrediction:
    compute: float
    comm: float
    bubble: float
    flops_per_rank: float
    flops_per_s: float

    @property
    def total(self) -> float:
        return self.compute + self.comm + self.bubble

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def predict_step(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    global_batch: int,
    seq_len: int,
    world_size: int,
    comm: list[Comm] = (),
    pp: int = 1,
    microbatches: int = 1,
    schedule: str = "1f1b",
    flops_per_s: float | None = None,
) -> StepPrediction:
    """One step of ``global_batch`` sequences of ``seq_len`` over ``world_size`` ranks (module docstring).
    ``flops_per_s``: the rate one process reached training this model alone (measured by
    ``parallel.step_time.model_rate``); None: the profile's matmul rate, an upper bound that leaves out
    the elementwise kernels and the Python between them."""
    require_positive(global_batch=global_batch, seq_len=seq_len, world_size=world_size)
    flops = step_flops(cfg, tokens=global_batch * seq_len, seq_len=seq_len) / world_size
    rate = flops_per_s or achievable_flops(hw)
    compute = flops / rate
    return StepPrediction(
        compute=compute,
        comm=sum(comm_seconds(hw, c) for c in comm),
        bubble=pipeline_bubble(compute, pp, microbatches, schedule),
        flops_per_rank=flops,
        flops_per_s=rate,
    )
