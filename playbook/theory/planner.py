"""Plan a training run: every layout of N GPUs, why each rejected one fails, and the fastest that fits.

A layout is dp × tp × pp × cp (ep inside dp·cp, ``playbook.dims``), a ZeRO stage, a micro-batch size
b, a number of micro-batches m (global batch = dp·b·m) and a recomputation choice. For each
candidate: memory per GPU from ``playbook.theory.memory.training_memory`` (every degree together,
mixed precision, sequence parallelism whenever tp > 1, the most loaded 1F1B stage; by default a
fused FlashAttention kernel, Dao et al. 2022, arXiv:2205.14135, as production runs use: no [s, s]
scores kept, only an fp32 log-sum-exp; ``attention="eager"`` counts our teaching model's softmax),
activations counted by ``activations=``: "production" (the default, ``theory.prod_activations``) or
"ours"; step time from ``playbook.theory.plan_cost`` (compute + exposed communication per axis, less
what the ``overlap`` preset hides, + the bubble of each schedule of ``theory.plan_schedule``),
MFU (model FLOPs / (step time · GPUs · peak), Chowdhery et al. 2022, arXiv:2204.02311, Appendix B)
and tokens per second. The shape follows Narayanan et al. 2021 (arXiv:2104.04473, §3.2: tp inside a node, pp
across nodes, dp for the rest) and Llama 3 (Dubey et al. 2024, arXiv:2407.21783, §3.3.2).

Degrees: every divisor of the GPUs (384 GPUs plan: dp 3·2^k, pp 12, ...). Pruned (and said so):
tp ≤ GPUs per node is a rejection; m ≥ pp (1F1B fills its pipeline); b ≤ ``MAX_MICRO_BATCH`` (the
cost model gives a larger micro-batch no speed, only memory). Within one (dp, tp, pp, cp, ep), the variant with the least
memory (largest ZeRO stage, full recomputation, smallest b) is tried first: if even it does not fit,
the layout is rejected for memory at once; otherwise variants are tried fastest first and the first
that fits is the layout's candidate, the slower ones counted as dominated. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from playbook.config import Hardware, ModelConfig, require_positive
from playbook.dims import ParallelDims
from playbook.theory.memory import ATTENTION, RECOMPUTE, ZERO_STAGES
from playbook.theory.plan_cost import DEFAULT_OVERLAP, OVERLAP_PRESETS, StepCost, step_costs, with_schedule
from playbook.theory.plan_memory import _memory_key, _needs_more, memory_breakdown, memory_bytes  # noqa: F401
from playbook.theory.plan_schedule import PLAN_SCHEDULES, check_schedules, schedule_options
from playbook.theory.prod_activations import check_activations

MAX_MICRO_BATCH = 8
MEM_UTIL = 0.9  # share of device memory a plan may fill: CUDA context, NCCL buffers, fragmentation are not counted


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
    candidates: list[Candidate] = field(default_factory=list)  # fastest first
    rejected: dict[str, list] = field(default_factory=dict)  # reason kind -> [count, first message]
    dominated: int = 0
    smallest: tuple[float, str] | None = None  # least memory seen in a rejected layout

    def reject(self, kind: str, message: str) -> None:
        entry = self.rejected.setdefault(kind, [0, message])
        entry[0] += 1

    def as_dict(self, top: int | None = None) -> dict:
        keys = "model hardware gpus gpus_per_node seq_len global_batch attention activations overlap device_bytes"
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
    """Every divisor of ``n`` (up to ``limit``), ascending: 384 GPUs allow pp = 3, 6, 12, 24, ..."""
    top = n if limit is None else min(n, limit)
    return [k for k in range(1, top + 1) if n % k == 0]


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


def _variants(dims: ParallelDims, plan: Plan):
    rows = plan.global_batch // dims.dp
    zeros = ZERO_STAGES if dims.dp * dims.cp > 1 else (0,)
    for b in powers_of_two(min(rows, MAX_MICRO_BATCH)):
        if rows % b:
            continue
        m = rows // b
        if m < dims.pp:
            plan.reject("pipeline not filled", f"{dims}: m={m} micro-batches of {b} < pp={dims.pp} stages")
            continue
        degrees = {a: getattr(dims, a) for a in ("dp", "tp", "pp", "cp", "ep")}
        for schedule, v in schedule_options(dims.pp, m, plan.n_layers, plan.schedules):
            for zero in zeros:
                for rc in RECOMPUTE:
                    yield Layout(
                        **degrees, zero=zero, micro_batch=b, microbatches=m, recompute=rc, schedule=schedule, v=v
                    )


def _modelled(cfg: ModelConfig, dims: ParallelDims, variants: list[Layout], seq_len: int, out: Plan):
    """(variants training_memory accepts, the least memory among them, that variant). A refusal (e.g.
    full recomputation with cp) depends on the recomputation choice, not on ZeRO or b: drop its kind."""
    while variants:
        least = min(variants, key=lambda v: (v.micro_batch, -v.zero, -RECOMPUTE.index(v.recompute)))
        try:
            return variants, memory_bytes(cfg, least, seq_len, out.attention, out.activations), least
        except (ValueError, NotImplementedError) as e:
            out.reject("not modelled", f"{dims} recompute={least.recompute}: {e}")
            variants = [v for v in variants if v.recompute != least.recompute]
    return [], 0.0, None


def plan(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    gpus: int,
    seq_len: int,
    global_batch: int,
    gpus_per_node: int | None = None,
    mem_util: float = MEM_UTIL,
    attention: str = "flash",
    activations: str = "production",
    schedules: tuple[str, ...] = PLAN_SCHEDULES,
    overlap: str = DEFAULT_OVERLAP,
    precision: str = "bf16",
    mesh_order: str = "tp-cp-dp-pp",
) -> Plan:
    """Every layout of ``gpus`` GPUs for ``cfg`` on ``hw``: candidates fastest first, rejections by reason.
    ``attention``: "flash" (a fused kernel, what production runs use) or "eager" (our model's
    softmax, [b, a, s, s] kept per layer); see ``theory.activations``. ``activations``: "production"
    (fused kernels as Megatron-LM runs them, ``theory.prod_activations``) or "ours" (our GPT's);
    ``precision``: "bf16" or "fp8" (``theory.plan_precision``); ``mesh_order``: ``plan_cost.MESH_ORDERS``.
    Raises ``ValueError`` (one line) on bad input, when no layout divides, the global batch splits over
    none, or nothing fits (naming the smallest memory found)."""
    g = hw.devices_per_node if gpus_per_node is None else gpus_per_node
    require_positive(gpus=gpus, gpus_per_node=g, seq_len=seq_len, global_batch=global_batch)
    if gpus > g and gpus % g:
        raise ValueError(
            f"--gpus {gpus} is not a whole number of nodes of {g}; try --gpus {gpus // g * g} or {(gpus // g + 1) * g}"
        )
    if seq_len > cfg.max_seq_len:
        raise ValueError(
            f"--seq-len {seq_len} exceeds {cfg.name}'s max_seq_len {cfg.max_seq_len}; try --seq-len {cfg.max_seq_len}"
        )
    if not 0 < mem_util <= 1:
        raise ValueError(f"mem_util must be in (0, 1], got {mem_util}; try 0.9")
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, got {attention!r}; try flash")
    check_activations(activations)
    out = Plan(cfg.name, hw.name, gpus, g, seq_len, global_batch, hw.memory_bytes, attention, activations)
    out.schedules, out.n_layers = check_schedules(schedules), cfg.n_layers
    if overlap not in OVERLAP_PRESETS:
        raise ValueError(f"overlap must be one of {', '.join(OVERLAP_PRESETS)}, got {overlap!r}; try {DEFAULT_OVERLAP}")
    out.overlap = overlap  # a bad precision or mesh order: one line from the first step costed
    budget, common = hw.memory_bytes * mem_util, dict(seq_len=seq_len, gpus_per_node=g)
    timing = dict(overlap=overlap, precision=precision, mesh_order=mesh_order)
    structures = list(_structures(cfg, out))
    if not structures:
        if "global batch split" in out.rejected:  # some layout divides the model; the batch splits over none
            from playbook.theory.plan_advice import batch_advice

            raise ValueError(batch_advice(cfg, gpus=gpus, gpus_per_node=g, seq_len=seq_len, global_batch=global_batch))
        first = next((msg for k, (_, msg) in out.rejected.items() if k.endswith("vs the model")), "")
        raise ValueError(f"no layout of {gpus} GPUs divides {cfg.name}: {first}")
    for dims in structures:
        variants = list(_variants(dims, out))
        if not variants:
            continue
        variants, need, least = _modelled(cfg, dims, variants, seq_len, out)
        if not variants:
            continue
        if need > budget:
            out.reject(
                "memory", f"{least} needs {need / 1e9:.1f} GB per GPU of a {hw.memory_bytes / 1e9:.0f} GB device"
            )
            if out.smallest is None or need < out.smallest[0]:
                out.smallest = (need, str(least))
            continue
        zeros = tuple(sorted({v.zero for v in variants}))
        by_zero: dict[tuple, dict[int, StepCost]] = {}  # (b, recompute) -> 1F1B cost per ZeRO stage
        for v in variants:
            if (v.micro_batch, v.recompute) not in by_zero:
                by_zero[v.micro_batch, v.recompute] = step_costs(
                    cfg,
                    hw,
                    zeros=zeros,
                    **v.degrees,
                    micro_batch=v.micro_batch,
                    microbatches=v.microbatches,
                    recompute=v.recompute,
                    **timing,
                    **common,
                )
        costs = sorted(
            (
                (
                    with_schedule(
                        by_zero[v.micro_batch, v.recompute][v.zero],
                        pp=dims.pp,
                        microbatches=v.microbatches,
                        schedule=v.schedule,
                        v=v.v,
                    ),
                    v,
                )
                for v in variants
            ),
            key=lambda cv: (cv[0].total, -cv[1].zero),
        )
        too_big: list[tuple] = []  # (memory key, layout) of variants that did not fit
        for i, (cost, v) in enumerate(costs):
            key = _memory_key(v)
            if any(_needs_more(key, f) for f, _ in too_big):  # grows with b, falls with ZeRO and recomputation
                seen = "memory" in out.rejected  # the first message is kept: format no other
                out.reject("memory", "" if seen else f"{v} needs more than {too_big[0][1]}, which does not fit")
                continue
            mem = memory_bytes(cfg, v, seq_len, attention, activations)
            if mem <= budget:
                mfu = cost.model_flops / (cost.total * gpus * hw.peak_bf16_flops)
                out.candidates.append(Candidate(v, mem, cost, mfu, global_batch * seq_len / cost.total))
                out.dominated += len(costs) - i - 1
                break
            out.reject("memory", f"{v} needs {mem / 1e9:.1f} GB per GPU of a {hw.memory_bytes / 1e9:.0f} GB device")
            too_big = [(f, w) for f, w in too_big if not _needs_more(f, key)] + [(key, v)]  # keep the minimal
    if not out.candidates:
        from playbook.theory.plan_advice import nothing_fits, nothing_plans

        if out.smallest is None:
            raise ValueError(nothing_plans(cfg, out))
        advice = dict(smallest=out.smallest, attention=attention, activations=activations)

        raise ValueError(
            nothing_fits(cfg, hw, **common, gpus=gpus, global_batch=global_batch, mem_util=mem_util, **advice)
        )
    out.candidates.sort(key=lambda c: (c.cost.total, c.memory))
    return out
