"""``playbook run hybrid``: a layout on real ranks, against the single process on the same batch.

The report gives parity (loss, every gradient, parameters after the last step), bytes per rank per
step on every mesh axis (predicted by ``theory.hybrid.hybrid``, measured by the tracer), and each rank's
memory by category as measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


from playbook.cluster import default_backend, launch, under_torchrun
from playbook.parallel.checkpoint import options as checkpoint_options
from playbook.dims import ParallelDims
from playbook.theory.inventory.inventory import RECOMPUTE_MODES
from playbook.theory.cp import VARIANTS as CP_VARIANTS
from playbook.theory.hybrid.plan import Plan
from playbook.parallel.hybrid import conditions as life
from playbook.parallel.hybrid.parallelize import train_hybrid
from playbook.parallel.hybrid.merge import comm_table, merge
from playbook.parallel.hybrid.moe import reference as moe_reference
from playbook.parallel.hybrid.native import check_native, native_parity, summary_line
from playbook.parallel.parity import gated
from playbook.parallel.registry import register
from playbook.parallel.report import RunReport, bounds_lines, compare
from playbook.parallel.training import TrainSetup
from playbook.measure.steps import report_lines, step_report
from playbook.theory.pp.schedules import SCHEDULES, V_SCHEDULES


@dataclass
class HybridReport(RunReport):
    """``RunReport`` plus the layout and, per rank, bytes per axis and memory by category."""

    layout: dict = field(default_factory=dict)
    per_rank: list = field(default_factory=list)
    steps: dict = field(default_factory=dict)  # per-rank step-time percentiles and the straggler (measure.steps)
    checkpoint: dict | None = None  # --save / --resume: every save and load, bytes per rank predicted / measured

    def summary(self) -> str:
        p = self.parity
        lines = [
            f"hybrid {self.layout['name']} on {self.world_size} rank(s), backend {self.backend}",
            f"  loss per step: {', '.join(f'{x:.4f}' for x in self.losses)}",
            f"  parity vs {p['reference']}: loss {p['max_abs_loss_diff']:.2e} (abs), grads {p['max_rel_grad_diff']:.2e} "
            f"(rel), params {p['max_rel_l2_param_diff']:.2e} (rel L2)",
            *bounds_lines(p),
            "  per rank: bytes sent per step by axis, predicted / measured; memory (bytes) predicted / measured",
        ]
        for row in self.per_rank:
            axes = sorted(set(row["predicted"]) | set(row["measured"]))
            cells = ", ".join(
                f"{ax} {row['predicted'].get(ax, 0):,.0f} / {row['measured'].get(ax, 0):,.0f}" for ax in axes
            )
            lines.append(f"    rank {row['rank']} {_where(row['coords'])}: {cells or 'no communication'}")
            mem = row["memory"]
            lines.append(
                "      "
                + ", ".join(
                    f"{k} {_num(mem['predicted'].get(k))} / {_num(mem['measured'].get(k))}"
                    for k in ("params", "grads", "optimizer", "activations")
                )
            )
        if self.steps:
            lines += report_lines(self.steps)
        if self.native:
            lines.append(summary_line(self.native))
        if self.checkpoint:
            from playbook.parallel.hybrid.resume import checkpoint_lines

            lines += checkpoint_lines(self.checkpoint)
        return "\n".join(lines)


def _where(coords: dict) -> str:
    return "(" + " ".join(f"{a}{coords[a]}" for a in ("tp", "cp", "dp", "pp")) + ")"


def _num(x) -> str:
    return "—" if x is None else f"{x:,.0f}"


def run_layout(
    setup: TrainSetup,
    plan: Plan,
    backend: str = "auto",
    native: bool = False,
    launch=launch,
    conditions: life.Conditions | None = None,
    checkpoint=None,
) -> HybridReport:
    """Check ``plan``, run it on ``plan.dims.world`` fresh ranks (``launch``) under ``conditions``,
    and compare with the single process. ``checkpoint`` (``parallel.checkpoint.CheckpointPlan``):
    resume from and save to checkpoints."""
    plan.check(setup)
    conditions = conditions or life.Conditions()
    conditions.check(plan.dims.world)
    if native:
        check_native(setup, plan.dims, sequence_parallel=plan.sequence_parallel)
    world = plan.dims.world
    backend = default_backend(world) if backend == "auto" else backend
    answers = launch(train_hybrid, world, setup, plan, conditions, checkpoint=checkpoint, backend=backend)
    ours = merge(answers, plan.dims.tp)
    single, floor = moe_reference(setup, plan)  # an MoE model in m micro-batches: the same m on one process
    ck = None
    if checkpoint is not None:
        from playbook.parallel.hybrid.resume import checkpoint_report

        ours, single, ck = checkpoint_report(answers, ours, single, setup, plan)
    ran = setup if ck is None else replace(setup, steps=setup.steps - ck["start"])  # bytes per step of the steps run
    table = comm_table(answers, ran, plan)
    mine = table[0]
    return HybridReport(
        strategy="hybrid",
        world_size=world,
        backend=backend,
        checkpoint=ck,
        parity=gated(compare(ours, single), setup, floor),
        memory=mine["memory"],
        comm={"predicted": mine["predicted"], "measured": mine["measured"]},
        setup={**setup.as_dict(), **plan.as_dict()},
        losses=ours.losses,
        layout={"name": str(plan.dims), "groups": plan.dims.describe()},
        per_rank=table,
        steps=step_report(answers),
        native=native_parity(
            setup, plan.dims, backend, sequence_parallel=plan.sequence_parallel, ours=ours, launch=launch
        )
        if native
        else None,
    )


def add_arguments(parser) -> None:
    for axis, what in (("dp", "data"), ("tp", "tensor"), ("pp", "pipeline"), ("cp", "context"), ("ep", "expert")):
        parser.add_argument(f"--{axis}", type=int, default=1, help=f"{what}-parallel degree")
    parser.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3], help="ZeRO stage over dp×cp")
    parser.add_argument("--native", action="store_true", help="with --dp/--tp: also PyTorch's FSDP2 + DTensor TP")
    parser.add_argument("--sequence-parallel", action="store_true", help="with --tp: sequence parallelism")
    parser.add_argument("--cp-variant", default="ring", choices=list(CP_VARIANTS))
    parser.add_argument("--zigzag", action="store_true", help="with --cp: zig-zag causal balance")
    parser.add_argument("--schedule", default="1f1b", choices=[*SCHEDULES, *V_SCHEDULES])
    parser.add_argument(
        "--microbatches",
        type=int,
        default=None,
        help="micro-batches per step (default: pp); at pp=1, gradient accumulation over them",
    )
    parser.add_argument(
        "--chunks",
        type=int,
        default=None,
        dest="virtual_stages",
        help="with --pp: model chunks per rank (default: 2 for interleaved, zb-v and dualpipe-v, else 1)",
    )
    parser.add_argument("--recompute", default="none", choices=list(RECOMPUTE_MODES), help="activation recomputation")
    life.add_arguments(parser)  # --slow-rank --slow-ms, --loader-workers --loader-delay-ms --prefetch
    checkpoint_options.add_arguments(parser)
    parser.set_defaults(world_size=None)  # implied by the degrees


def implied_world_size(options: dict) -> int:
    return options["dp"] * options["tp"] * options["pp"] * options["cp"]


# A flag that does nothing in this layout is refused, as --sequence-parallel without tp always was:
# (refused, the line). One rule for every variant flag, so a silent no-op never passes for a run of it.
def _idle_flags(dims: ParallelDims, options: dict) -> list[tuple[bool, str]]:
    zero, variant = options.get("zero", 0), options.get("cp_variant", "ring")
    return [
        (
            zero and dims.dp * dims.cp == 1,
            f"--zero {zero} shards over dp×cp, and dp·cp=1 here; add --dp 2 (or --cp 2) or drop --zero",
        ),
        (options.get("zigzag") and dims.cp == 1, "--zigzag balances causal work over cp, and cp=1 here; add --cp 2"),
        (
            variant != "ring" and dims.cp == 1,
            f"--cp-variant {variant} is context parallelism, and cp=1 here; add --cp 2",
        ),
        (
            options.get("schedule", "1f1b") != "1f1b" and dims.pp == 1,
            f"--schedule {options.get('schedule')} orders a pipeline's stages, and pp=1 here (one stage plays "
            "1F1B: gradient accumulation over --microbatches); add --pp 2 or drop --schedule",
        ),
        (
            options.get("virtual_stages") is not None and dims.pp == 1,
            "--chunks cuts a pipeline's stages into virtual ones, and pp=1 here; add --pp 2 or drop --chunks",
        ),
    ]


def check_options(args) -> None:
    """``playbook run hybrid``'s own constraints, before the memory check and any rank: the world size
    the degrees imply, every flag doing something, then the layout against the model."""
    conditions, o = life.split(vars(args))
    dims = ParallelDims(dp=o["dp"], tp=o["tp"], pp=o["pp"], cp=o["cp"], ep=o["ep"])
    if o.get("world_size") and o["world_size"] != dims.world:
        raise ValueError(
            f"--world-size {o['world_size']} but the degrees {dims} need {dims.world} ranks; omit --world-size"
        )
    for refused, why in _idle_flags(dims, o):
        if refused:
            raise ValueError(why)
    setup = TrainSetup(model=args.model, steps=args.steps, global_batch=args.global_batch, seq_len=args.seq_len)
    keys = (
        "zero",
        "sequence_parallel",
        "cp_variant",
        "zigzag",
        "schedule",
        "microbatches",
        "virtual_stages",
        "recompute",
    )
    Plan(dims, **{k: o.get(k) for k in keys if k in o}).check(setup)
    if o.get("native"):
        check_native(setup, dims, sequence_parallel=o["sequence_parallel"])
    conditions.check(dims.world)
    checkpoint_options.check(
        o, model=args.model, steps=args.steps, global_batch=args.global_batch, seq_len=args.seq_len
    )


def on_rank(ctx, setup: TrainSetup, *, dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, **plan):
    """Rank function in the registry's shape: ``train_hybrid`` of ``Plan(ParallelDims(dp, tp, pp, cp,
    ep), **plan)``, the layout ``playbook run hybrid``'s flags name (and its conditions: a straggler,
    a DataLoader, ``hybrid.conditions``; its checkpoint flags left out)."""
    plan = {k: v for k, v in plan.items() if k not in CHECKPOINT_FLAGS}
    conditions, plan = life.split(plan)
    return train_hybrid(ctx, setup, Plan(ParallelDims(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep), **plan), conditions)


CHECKPOINT_FLAGS = ("save", "save_every", "resume", "overwrite", "async_save")  # not the layout's: run_hybrid's


@register(
    "hybrid",
    help="every strategy at once on one mesh: --dp --tp --pp --cp --ep [--zero K]",
    arguments=add_arguments,
    world_size=implied_world_size,
    on_rank=on_rank,
    check=check_options,
)
def run_hybrid(
    setup: TrainSetup,
    *,
    world_size: int | None = None,
    backend: str = "auto",
    launch=launch,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    native: bool = False,
    **plan,
) -> HybridReport:
    dims = ParallelDims(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
    if world_size and world_size != dims.world:
        raise ValueError(f"--world-size {world_size} but the degrees {dims} need {dims.world} ranks; omit --world-size")
    flags = {k: plan.pop(k) for k in CHECKPOINT_FLAGS if k in plan}
    if under_torchrun():  # no parent checked them: every rank checks the same flags alike
        checkpoint_options.check(
            flags,
            model=setup.model,
            steps=setup.steps,
            global_batch=setup.global_batch,
            seq_len=setup.seq_len,
            torchrun=True,
        )
    else:
        checkpoint_options.prepare(flags)
    checkpoint = checkpoint_options.plan_of(flags)
    conditions, plan = life.split(plan)
    return run_layout(
        setup, Plan(dims, **plan), backend, native=native, launch=launch, conditions=conditions, checkpoint=checkpoint
    )
