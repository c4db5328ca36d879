"""The planner's search space: a layout, a candidate, a plan's record, and the generators of every
(dp, tp, pp, cp, ep) structure and every variant of one (ZeRO stage, micro-batch, schedule,
recomputation), with their memory (``theory.plan.memory``). ``theory.plan.planner.plan`` walks them;
``theory.plan.advice`` reuses them to say what would plan. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from playbook.config import ModelConfig
from playbook.config import divisors as all_divisors
from playbook.dims import ParallelDims
from playbook.theory.inventory.model_state import ZERO_STAGES
from playbook.theory.inventory.inventory import RECOMPUTE_MODES
from playbook.theory.plan.cost import DEFAULT_OVERLAP, MESH_ORDERS, StepCost
from playbook.theory.plan.memory import memory_bytes
from playbook.theory.plan.schedule import PLAN_SCHEDULES, schedule_options

MAX_MICRO_BATCH = 16  # published runs used micro-batches of 16 (issue 41): the search reaches them
# The most units (a layer, or one routed expert of an MoE layer) a search sizes: each is a unit of its
# own in every rank's parameters and ZeRO's flat units, for every layout, so time and memory grow with
# the count. DeepSeek-V3, the largest published MoE, has 61 + 58 × 256 = 14,909; 100,000 keeps a search
# over 1,000,000 GPUs under a minute and about 1 GB (10,000 MoE layers of 256 experts took 8 GB and
# minutes). One layout (``--layout``) is costed whatever the count.
MAX_UNITS = 100_000


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    zero: int
    micro_batch: int
    microbatches: int
    recompute: str
    schedule: str = "1f1b"  # pipeline schedule (plan_schedule.PLAN_SCHEDULES)
    v: int = 1  # model chunks per stage: interleaved's v, 2 for the V shapes
    ends: str = "even"  # layers per virtual stage: "even", or "light" first and last (plan_schedule.ENDS)

    @property
    def degrees(self) -> dict[str, int]:
        return dict(dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp, ep=self.ep)

    @property
    def degrees_no_dp(self) -> dict[str, int]:
        return dict(tp=self.tp, pp=self.pp, cp=self.cp, ep=self.ep)

    def __str__(self) -> str:
        axes = "×".join(f"{a}{v}" for a, v in self.degrees.items() if v > 1 or a == "dp")
        sched = "" if self.schedule == "1f1b" else f" {self.schedule}" + (f" v{self.v}" if self.v > 1 else "")
        ends = "" if self.ends == "even" else f" ends={self.ends}"
        return f"{axes} z{self.zero} b{self.micro_batch} m{self.microbatches} {self.recompute}{sched}{ends}"


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    memory: float  # bytes on the most loaded GPU
    cost: StepCost
    mfu: float
    tokens_per_s: float

    def as_dict(self) -> dict:
        return {
            "layout": str(self.layout),
            **self.layout.__dict__,
            "sequence_parallel": self.layout.tp > 1,
            "memory_bytes": self.memory,
            "step_s": self.cost.total,
            "mfu": self.mfu,
            "tokens_per_s": self.tokens_per_s,
            "cost": self.cost.as_dict(),
        }


@dataclass
class Plan:
    model: str
    hardware: str
    gpus: int
    gpus_per_node: int
    seq_len: int
    global_batch: int
    device_bytes: float
    attention: str = "flash"  # the attention kernel whose activations are counted (training_memory)
    activations: str = "production"  # whose kernels' saved tensors are counted (plan_memory)
    schedules: tuple[str, ...] = PLAN_SCHEDULES  # pipeline schedules searched (plan_schedule)
    n_layers: int = 0  # the model's, for the schedules' p·v <= layers
    overlap: str = DEFAULT_OVERLAP  # which axes' communication hides behind compute (plan_cost.OVERLAP_PRESETS)
    precision: str = "bf16"  # the linear layers' (plan_precision.PRECISIONS)
    zeros: tuple[int, ...] = ZERO_STAGES  # ZeRO stages searched (a stack without ZeRO: (0,))
    recomputes: tuple[str, ...] = RECOMPUTE_MODES  # recomputation choices searched
    mesh_order: str = MESH_ORDERS[0]  # rank order, fastest axis first (plan_cost.MESH_ORDERS)
    candidates: list[Candidate] = field(default_factory=list)  # fastest first
    rejected: dict[str, list] = field(default_factory=dict)  # reason kind -> [count, first message]
    dominated: int = 0
    smallest: tuple[float, str] | None = None  # least memory seen in a rejected layout
    rope_scaling: str = ""  # past the model's max_position_embeddings: the RoPE scaling assumed (config)

    def reject(self, kind: str, message: str) -> None:
        entry = self.rejected.setdefault(kind, [0, message])
        entry[0] += 1

    def as_dict(self, top: int | None = None) -> dict:
        keys = "model hardware gpus gpus_per_node seq_len global_batch attention activations overlap precision"
        keys += " mesh_order zeros recomputes device_bytes rope_scaling"
        keys = keys.split() + ["dominated"]
        return {
            **{k: getattr(self, k) for k in keys},
            "candidates": [c.as_dict() for c in self.candidates[:top]],
            "n_candidates": len(self.candidates),
            "rejected": {k: {"count": n, "example": msg} for k, (n, msg) in self.rejected.items()},
        }


def powers_of_two(limit: int) -> list[int]:
    return [2**k for k in range(max(limit, 0).bit_length())]


def divisors(n: int, limit: int | None = None) -> list[int]:
    """Every divisor of ``n`` (up to ``limit``), ascending: 384 GPUs allow pp = 3, 6, 12, 24, ...
    (``config.divisors``: pairs up to the square root, not a trial of every k up to n)."""
    return [k for k in all_divisors(n) if limit is None or k <= limit]


def planned_units(cfg: ModelConfig) -> int:
    """The units a search sizes per rank and layout (:data:`MAX_UNITS`): every layer, and every
    routed expert of every MoE layer."""
    return cfg.n_layers + cfg.n_moe_layers * cfg.n_experts


def check_search_size(cfg: ModelConfig) -> None:
    """Refuse, in one line and before any layout is costed, a model past :data:`MAX_UNITS`, naming
    the layers that would plan and the one-layout costing that plans anyway."""
    units = planned_units(cfg)
    if units <= MAX_UNITS:
        return
    dense, per = cfg.n_layers - cfg.n_moe_layers, 1 + cfg.n_experts  # L + (L − dense)·E <= MAX_UNITS
    most = (MAX_UNITS + dense * cfg.n_experts) // per
    raise ValueError(
        f"{cfg.name}: {cfg.n_layers:,} layers ({cfg.n_moe_layers:,} of {cfg.n_experts} routed experts) are "
        f"{units:,} units to size on every rank of every layout; a search takes at most {MAX_UNITS:,} "
        f"(DeepSeek-V3 has 14,909); try num_hidden_layers {most} or fewer, or cost one layout with --layout"
    )


def _structures(cfg: ModelConfig, plan: Plan):
    """Every (dp, tp, pp, cp, ep) over the GPUs that passes ``ParallelDims.check``; rejections recorded."""
    n, g = plan.gpus, plan.gpus_per_node
    for tp in divisors(n):
        if tp > g:
            plan.reject(
                "tp crosses nodes", f"tp={tp} > {g} GPUs per node: TP's per-layer collectives would cross nodes"
            )
            continue
        for cp in divisors(n // tp):
            for pp in divisors(n // (tp * cp)):
                dp = n // (tp * cp * pp)
                if not cfg.is_moe and dp * cp > 1:  # one line per structure, not one per ep
                    plan.reject("ep without experts", f"ep > 1: {plan.model} has no experts (n_experts = 0)")
                for ep in divisors(dp * cp) if cfg.is_moe else [1]:
                    dims = ParallelDims(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
                    try:
                        dims.check(cfg, seq_len=plan.seq_len)
                    except ValueError as e:
                        plan.reject(str(e).split("=")[0] + " vs the model", str(e))
                        continue
                    if plan.global_batch % dp:
                        plan.reject(
                            "global batch split", f"global batch {plan.global_batch} does not split over dp={dp}"
                        )
                        continue
                    yield dims


def _variant_groups(dims: ParallelDims, plan: Plan) -> list[tuple[int, int, list[tuple[str, int]]]]:
    """(b, m, the (schedule, v) options) per micro-batch size a structure can run, in :func:`_variants`'
    order, rejections recorded: the variants are these times the ZeRO stages times the recomputations."""
    rows, out = plan.global_batch // dims.dp, []
    for b in powers_of_two(min(rows, MAX_MICRO_BATCH)):
        if rows % b:
            continue
        m = rows // b
        if m < dims.pp:
            plan.reject("pipeline not filled", f"{dims}: m={m} micro-batches of {b} < pp={dims.pp} stages")
            continue
        out.append((b, m, schedule_options(dims.pp, m, plan.n_layers, plan.schedules)))
    return out


def structure_zeros(dims: ParallelDims, plan: Plan) -> tuple[int, ...]:
    """The ZeRO stages searched for ``dims``: none without data ranks to shard over."""
    return plan.zeros if dims.dp * dims.cp > 1 else (0,)


def _variants(dims: ParallelDims, plan: Plan, groups=None):
    zeros = structure_zeros(dims, plan)
    degrees = {a: getattr(dims, a) for a in ("dp", "tp", "pp", "cp", "ep")}
    for b, m, options in _variant_groups(dims, plan) if groups is None else groups:
        for schedule, v in options:
            for zero in zeros:
                for rc in plan.recomputes:
                    yield Layout(
                        **degrees, zero=zero, micro_batch=b, microbatches=m, recompute=rc, schedule=schedule, v=v
                    )


def _modelled(cfg: ModelConfig, dims: ParallelDims, variants: list[Layout], seq_len: int, out: Plan):
    """(variants training_memory accepts, the least memory among them, that variant). A refusal (e.g.
    full recomputation with cp) depends on the recomputation choice, not on ZeRO or b: drop its kind."""
    while variants:
        least = min(variants, key=lambda v: (v.micro_batch, -v.zero, -RECOMPUTE_MODES.index(v.recompute)))
        try:
            return variants, memory_bytes(cfg, least, seq_len, out.attention, out.activations), least
        except (ValueError, NotImplementedError) as e:
            out.reject("not modelled", f"{dims} recompute={least.recompute}: {e}")
            variants = [v for v in variants if v.recompute != least.recompute]
    return [], 0.0, None
