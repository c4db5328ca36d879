"""Predicted time of one training step for a whole layout: compute, exposed communication per axis,
and the pipeline bubble (pure arithmetic, no torch). Used by :mod:`playbook.theory.plan.planner`.

Compute. Training FLOPs are PaLM's count (``playbook.theory.cost.flops``, Chowdhery et al. 2022,
arXiv:2204.02311, Appendix B), split evenly over every GPU and run at ``peak_bf16_flops ×
achievable_flops_fraction`` of the hardware profile, slowed by the GEMMs' shapes
(``theory.cost.gemm_efficiency``: tile and wave quantization on the profile's SMs and the roofline, or
``playbook calibrate``'s measured matmul curve), so a micro-batch of 2 can beat 1. Recomputation
adds work that MFU does not count (Korthikanti et al. 2022, arXiv:2205.05198, §5): ``full`` runs
the forward again (a third of the training FLOPs), ``selective`` only attention's two [T, T]
matmuls forward.

Communication: the bytes of ``theory.plan.axis_bytes`` (the functions the shrunk replays verify), timed
with ``playbook.theory.cost.comm.collective_seconds`` (α–β, ring) on the link the axis's group uses:
inside a node while the group's ranks fit in one (rank order tp fastest, then cp, dp, pp as
``playbook.dims``, or Llama 3's tp, cp, pp, dp: ``mesh_order``), the network card otherwise. What
overlaps:

- **tp** (Megatron with sequence parallelism, Korthikanti et al. §4.2.2): per layer and
  micro-batch an all-gather and a reduce-scatter of the [s/cp, b, h] activation before and after
  attention and the MLP: 4 forward, 4 backward (+4 with full recomputation). Exposed: each one
  sits between two matmuls that need it (Narayanan et al. 2021, arXiv:2104.04473, §3.2), unless
  ``overlap`` hides it (``OVERLAP_PRESETS``: all but 1/t with "megatron-tp").
- **cp** (ring attention, Liu et al. 2023, arXiv:2310.01889): per layer and micro-batch, cp − 1
  passes of the local K and V forward and twice that backward (K, V and their fp32 gradients), once
  more when recomputation reruns the core; hidden behind attention's own compute except the first
  pass of each ring.
- **ep** (DeepSpeed-MoE, arXiv:2201.05596): an all-to-all to dispatch and one to combine per MoE
  layer forward, as many backward (+2 with full recomputation); exposed, but for what exceeds the
  compute with "deepseek-ep" (which hides pp's sends the same way).
- **pp** (Narayanan et al. 2021 §2.2): one activation forward and one gradient backward per
  micro-batch and boundary the busiest rank's chunks cross (v times as many interleaved, twice on
  a V; ``theory.plan.axis_bytes.pp_sends``), point to point and small; exposed. Bubble:
  ``theory.plan.schedule.bubble_fraction`` of the busiest rank's pipelined time (compute and the exposed
  tp/cp/ep/pp time of the m micro-batches): (p − 1)/m for 1F1B, (p − 1)/(v·m) interleaved,
  (p − 1)/(3m) ZB-H1, simulated for ZB-V and DualPipe-V; plus the busiest rank's extra compute
  (``theory.plan.stage_balance``: the output head, uneven layers), which the others wait through.
- **dp**: ``theory.plan.dp`` (ZeRO 0-3; gradients reduced in bf16, or fp32 for the production stack),
  overlapped with the backward and the next forward unless the preset is "none".

Not modelled: attention's kernel efficiency by shape, stragglers, optimizer step time.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.cost.comm import collective_seconds
from playbook.theory.cost.flops import attention_flops_per_token, flops_per_token
from playbook.theory.cost.gemm_efficiency import compute_factor
from playbook.theory.plan.dp import GRAD_BYTES, dp_seconds, overlapped
from playbook.theory.plan.precision import FP8_DISPATCH_SHARE, time_factor
from playbook.theory.plan.axis_bytes import cp_layer, pp_message_bytes, pp_sends
from playbook.theory.plan.schedule import bubble_fraction
from playbook.theory.plan.stage_balance import pipeline_idle, stage_imbalance

# Which axes' collectives a stack overlaps with compute (``overlap=``); the planner's default is
# "megatron-tp". dp: gradient buckets reduced during the backward and weights gathered ahead of use
# (``theory.plan.dp``; PyTorch DDP, Li et al. 2020, arXiv:2006.15704); "none" overlaps nothing, as
# Megatron-LM's 2021 local DDP, which all-reduced after the whole backward. tp: a collective matmul,
# the all-gather / reduce-scatter cut into t chunks each overlapped with the GEMM on the previous
# one, so only the first chunk is exposed (Wang et al. 2023,
# "Overlap communication with dependent computation via decomposition", ASPLOS 2023, doi:10.1145/3567955.3567959;
# Megatron-LM's --tp-comm-overlap). ep and pp: DeepSeek-V3's DualPipe runs one micro-batch's
# all-to-all and pipeline sends under another's compute (DeepSeek-AI 2024, arXiv:2412.19437,
# §3.2.1), so only what exceeds the compute is exposed.
OVERLAP_PRESETS = {"none": (), "dp": ("dp",), "megatron-tp": ("dp", "tp"), "deepseek-ep": ("dp", "tp", "ep", "pp")}
DEFAULT_OVERLAP = "megatron-tp"
# Rank order, fastest axis first: Megatron-LM's tp-cp-(ep)-dp-pp (``playbook.dims``, the default) or
# Llama 3's [TP, CP, PP, DP] (Dubey et al. 2024, arXiv:2407.21783, §3.3.2), where pp sits inside dp:
# with tp < GPUs per node the pipeline's sends stay on NVLink and dp's collectives cross nodes.
MESH_ORDERS = ("tp-cp-dp-pp", "tp-cp-pp-dp")
# tp + SP per layer and micro-batch: all-gather + reduce-scatter around attention and the MLP, forward and back;
# Megatron's full recomputation reruns the forward (+4), our replay's stops before the MLP's last (11, theory.tp).
TP_COLLECTIVES_PER_LAYER = {"none": 8, "selective": 8, "full": 12}


@functools.lru_cache(maxsize=256)
def _per_token(cfg: ModelConfig, seq_len: int) -> tuple[float, float, float, float]:
    """(training FLOPs, forward FLOPs, attention training FLOPs, attention forward FLOPs) per token:
    the same for every layout of one search, so counted once (a ModelConfig is frozen, hashable)."""
    return (
        flops_per_token(cfg, seq_len),
        flops_per_token(cfg, seq_len, training=False),
        attention_flops_per_token(cfg, seq_len),
        attention_flops_per_token(cfg, seq_len, training=False),
    )


@dataclass(frozen=True)
class StepCost:
    """Seconds of one step: compute (the average rank's), bubble (the pipeline's idle time: fill and
    drain, and the wait on the busiest rank, ``theory.plan.stage_balance.pipeline_idle``), and per axis (comm, exposed)."""

    compute: float
    bubble: float
    axes: dict[str, tuple[float, float]] = field(default_factory=dict)  # axis -> (communication, exposed)
    model_flops: float = 0.0  # useful FLOPs of the step (no recomputation): what MFU counts

    @property
    def exposed(self) -> float:
        return sum(e for _, e in self.axes.values())

    @property
    def total(self) -> float:
        return self.compute + self.bubble + self.exposed

    def mfu(self, gpus: int, peak: float) -> float:
        """Model FLOPs utilization: useful FLOPs over (step time · GPUs · ``peak``) (Chowdhery et al.
        2022, arXiv:2204.02311, Appendix B; the planner's peak is BF16's whatever the precision)."""
        return self.model_flops / (self.total * gpus * peak)

    def as_dict(self) -> dict:
        axes = {a: {"comm": c, "exposed": e} for a, (c, e) in self.axes.items()}
        return {
            "compute": self.compute,
            "bubble": self.bubble,
            "exposed_comm": self.exposed,
            "total": self.total,
            "axes": axes,
        }


def span(axis: str, *, dp: int, tp: int, pp: int, cp: int, ep: int = 1, order: str = MESH_ORDERS[0]) -> int:
    """Consecutive ranks one group of ``axis`` covers, the axes nested fastest first as ``order``
    says (``MESH_ORDERS``; ep inside dp·cp, over tp·ep ranks, as ``playbook.dims`` lays it out)."""
    if order not in MESH_ORDERS:
        raise ValueError(f"mesh order must be one of {', '.join(MESH_ORDERS)}; got {order!r}")
    if axis == "ep":
        return tp * ep
    sizes, out, axes = dict(tp=tp, cp=cp, dp=dp, pp=pp), 1, order.split("-")
    for a in axes[: axes.index(axis) + 1]:
        out *= sizes[a]
    return out


def link(
    hw: Hardware, axis: str, gpus_per_node: int, order: str = MESH_ORDERS[0], **degrees
) -> tuple[float, float, str]:
    """(bandwidth, latency, "intra"/"inter") of the link a group of ``axis`` uses; a profile placed
    on a topology (``theory.plan.placed``) answers itself, with the level its group reaches."""
    placed = getattr(hw, "axis_link", None)
    if placed is not None:
        return placed(axis, order, degrees)
    if span(axis, order=order, **degrees) <= gpus_per_node:
        return hw.intra_node_bandwidth, hw.intra_node_latency, "intra"
    return hw.inter_node_bandwidth, hw.inter_node_latency, "inter"


def step_cost(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    dp: int,
    tp: int,
    pp: int,
    cp: int,
    ep: int,
    zero: int,
    micro_batch: int,
    microbatches: int,
    recompute: str,
    seq_len: int,
    gpus_per_node: int,
    schedule: str = "1f1b",
    v: int = 1,
    overlap: str = "dp",
    precision: str = "bf16",
    mesh_order: str = MESH_ORDERS[0],
    grad_bytes: int = GRAD_BYTES,
    placement: str = "1f1b",
    ends: str = "even",
    data_axis: bool = True,
) -> StepCost:
    """Predicted seconds of one step of ``dp·micro_batch·microbatches`` sequences (module docstring);
    ``precision="fp8"``: the linear layers at the FP8 peak, ep's dispatch in FP8 (``theory.plan.precision``);
    ``grad_bytes``: bytes per gradient element dp reduces (``theory.plan.dp.GRAD_REDUCE_BYTES``); ``placement``:
    "1f1b", or a V schedule whose rank 0 holds the embedding and the head (the data axis's units);
    ``ends``: the layers per virtual stage (``theory.plan.schedule.ENDS``), which set the busiest rank;
    ``data_axis=False``: without the dp axis (the search adds it per ZeRO stage, :func:`with_data_axis`)."""
    if overlap not in OVERLAP_PRESETS:
        raise ValueError(f"overlap must be one of {', '.join(OVERLAP_PRESETS)}; got {overlap!r}")
    hidden = OVERLAP_PRESETS[overlap]
    s, b, m, h = seq_len, micro_batch, microbatches, cfg.hidden
    compute, model_flops = step_compute(
        cfg, hw, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, micro_batch=b, microbatches=m, recompute=recompute,
        seq_len=s, precision=precision,
    )  # fmt: skip
    world, tokens, attention_train = dp * tp * pp * cp, dp * b * m * s, _per_token(cfg, s)[2]
    rate = hw.peak_bf16_flops * hw.achievable_flops_fraction
    degrees = dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
    layers = math.ceil(cfg.n_layers / pp)
    moe_layers = math.ceil(cfg.n_moe_layers / pp)
    act = (s // cp) * b * h * GRAD_BYTES  # one micro-batch's [s/cp, b, h] activation on a rank, gathered over tp
    axes: dict[str, tuple[float, float]] = {}
    if tp > 1:
        bw, lat, _ = link(hw, "tp", gpus_per_node, mesh_order, **degrees)
        per_layer = TP_COLLECTIVES_PER_LAYER[recompute]
        one = collective_seconds("all_gather", act, tp, bw, lat)
        comm = m * layers * per_layer * one
        axes["tp"] = (comm, overlapped(comm, compute, comm / tp) if "tp" in hidden else comm)
    if cp > 1:
        bw, lat, _ = link(hw, "cp", gpus_per_node, mesh_order, **degrees)
        sent, passes, kv = cp_layer(
            cfg, micro_batch=b, seq_len=s, cp=cp, tp=tp, recompute=recompute, dtype_bytes=GRAD_BYTES
        )
        comm = m * layers * (sent / bw + passes * lat)  # each pass one point-to-point step of the ring
        attention = tokens * attention_train / world / rate
        axes["cp"] = (comm, overlapped(comm, attention, m * layers * collective_seconds("send", kv, 2, bw, lat)))
    if ep > 1 and moe_layers:
        bw, lat, _ = link(hw, "ep", gpus_per_node, mesh_order, **degrees)
        per_layer = 6 if recompute == "full" else 4
        wire = act * cfg.top_k * (FP8_DISPATCH_SHARE if precision == "fp8" else 1.0)
        comm = m * moe_layers * per_layer * collective_seconds("all_to_all", wire, ep, bw, lat)
        axes["ep"] = (comm, overlapped(comm, compute, 0.0) if "ep" in hidden else comm)
    if pp > 1:
        bw, lat, _ = link(hw, "pp", gpus_per_node, mesh_order, **degrees)
        msg = pp_message_bytes(cfg, micro_batch=b, seq_len=s, cp=cp, tp=tp, dtype_bytes=GRAD_BYTES)
        comm = m * pp_sends(schedule, pp, v) * collective_seconds("send", msg, 2, bw, lat)
        axes["pp"] = (comm, overlapped(comm, compute, 0.0) if "pp" in hidden else comm)
    imbalance = stage_imbalance(cfg, s, pp, schedule, v, ends)
    bubble = pipeline_idle(compute, sum(e for _, e in axes.values()), bubble_fraction(schedule, pp, m, v), imbalance)
    if dp * cp > 1 and data_axis:
        bw, lat, _ = link(hw, "dp", gpus_per_node, mesh_order, **degrees)
        axes["dp"] = dp_seconds(
            cfg,
            bandwidth=bw,
            latency=lat,
            zero=zero,
            compute=compute,
            **degrees,
            microbatches=m,
            grad_bytes=grad_bytes,
            placement=placement,
            hide="dp" in hidden,
        )
    return StepCost(compute=compute, bubble=bubble, axes=axes, model_flops=model_flops)


def step_compute(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    dp: int,
    tp: int,
    pp: int,
    cp: int,
    ep: int,
    micro_batch: int,
    microbatches: int,
    recompute: str,
    seq_len: int,
    precision: str = "bf16",
) -> tuple[float, float]:
    """(compute seconds of the average rank, model FLOPs) of one step: :func:`step_cost`'s first term,
    which the search also uses alone as a lower bound of a step (every other term is >= 0)."""
    world, s, b, m = dp * tp * pp * cp, seq_len, micro_batch, microbatches
    tokens = dp * b * m * s
    train, forward, attention_train, attention_forward = _per_token(cfg, s)
    model_flops = tokens * train
    extra = {"none": 0.0, "full": forward, "selective": attention_forward}[recompute]
    rate = hw.peak_bf16_flops * hw.achievable_flops_fraction
    shapes = compute_factor(cfg, hw, tokens=b * s // cp, tp=tp, ep=ep, seq_len=s)  # small GEMMs run slower
    return (model_flops + tokens * extra) / world / rate * time_factor(cfg, hw, s, precision) * shapes, model_flops


def with_data_axis(cfg: ModelConfig, hw: Hardware, base: StepCost, *, zero: int, **layout) -> StepCost:
    """``base`` (a step without, or with another, dp axis) with the data axis of ZeRO stage ``zero``
    (``theory.plan.dp.dp_seconds``), as :func:`step_cost` adds it: the same arguments, the same float."""
    degrees = {a: layout[a] for a in ("dp", "tp", "pp", "cp", "ep")}
    if degrees["dp"] * degrees["cp"] == 1:
        return base
    bw, lat, _ = link(hw, "dp", layout["gpus_per_node"], layout.get("mesh_order", MESH_ORDERS[0]), **degrees)
    dp = dp_seconds(
        cfg,
        bandwidth=bw,
        latency=lat,
        zero=zero,
        compute=base.compute,
        microbatches=layout["microbatches"],
        **degrees,
        grad_bytes=layout.get("grad_bytes", GRAD_BYTES),
        placement=layout.get("placement", "1f1b"),
        hide="dp" in OVERLAP_PRESETS[layout.get("overlap", "dp")],
    )
    return StepCost(base.compute, base.bubble, {**base.axes, "dp": dp}, base.model_flops)


def step_costs(
    cfg: ModelConfig, hw: Hardware, *, zeros: tuple[int, ...], like: dict | None = None, **layout
) -> dict[int, StepCost]:
    """:func:`step_cost` for every ZeRO stage in ``zeros`` at once: only the dp axis depends on the
    stage (compute, tp, cp, ep, pp and the bubble do not), so the rest is computed once. ``like``:
    this layout's costs under another ``placement``, whose dp alone is computed again."""
    base = like[zeros[0]] if like else step_cost(cfg, hw, zero=zeros[0], **layout)
    out = {} if like else {zeros[0]: base}
    if "dp" not in base.axes:
        return {zeros[0]: base}
    for zero in zeros if like else zeros[1:]:
        out[zero] = with_data_axis(cfg, hw, base, zero=zero, **layout)
    return out


def with_schedule(base: StepCost, *, pp: int, microbatches: int, schedule: str, v: int, imbalance: float) -> StepCost:
    """``base`` (a 1F1B step) under another schedule: pp's point-to-point time times the boundaries
    crossed, and the idle time (``theory.plan.stage_balance.pipeline_idle``) from the new pipelined time and the
    schedule's ``imbalance`` (``theory.plan.stage_balance.stage_imbalance``); the rest does not depend on it."""
    if pp == 1:
        return base
    axes = dict(base.axes)
    if "pp" in axes:
        k = pp_sends(schedule, pp, v) / pp_sends("1f1b", pp)
        axes["pp"] = (axes["pp"][0] * k, axes["pp"][1] * k)
    exposed = sum(e for a, (_, e) in axes.items() if a != "dp")
    bubble = pipeline_idle(base.compute, exposed, bubble_fraction(schedule, pp, microbatches, v), imbalance)
    return StepCost(base.compute, bubble, axes, base.model_flops)


def scheduled_total(base: StepCost, *, pp: int, microbatches: int, schedule: str, v: int, imbalance: float) -> float:
    """``with_schedule(base, ...).total`` (the same sums in the same order, so the same float) without
    building the StepCost: the search orders every variant by it and builds only those it tries."""
    if pp == 1:
        return base.total
    k = pp_sends(schedule, pp, v) / pp_sends("1f1b", pp)
    pipelined = every = 0.0
    for a, (_, e) in base.axes.items():
        e = e * k if a == "pp" else e
        every += e
        if a != "dp":
            pipelined += e
    idle = pipeline_idle(base.compute, pipelined, bubble_fraction(schedule, pp, microbatches, v), imbalance)
    return base.compute + idle + every


def scheduled_split(
    base: StepCost, *, pp: int, microbatches: int, schedule: str, v: int, imbalance: float
) -> tuple[float, float]:
    """(compute + idle, every exposed time but dp's) of ``base`` under ``schedule``, so that
    :func:`scheduled_total` is ``first + (second + dp's exposed)`` to the bit (dp is the last axis a
    step adds and the idle does not depend on it): the search bounds a variant by ``first + second``
    before costing its data axis (``theory.plan.best_first``)."""
    if pp == 1:
        return base.compute + base.bubble, sum(e for a, (_, e) in base.axes.items() if a != "dp")
    k = pp_sends(schedule, pp, v) / pp_sends("1f1b", pp)
    pipelined = 0.0
    for a, (_, e) in base.axes.items():
        if a != "dp":
            pipelined += e * k if a == "pp" else e
    idle = pipeline_idle(base.compute, pipelined, bubble_fraction(schedule, pp, microbatches, v), imbalance)
    return base.compute + idle, pipelined
