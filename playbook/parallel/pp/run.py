"""Pipeline parallelism on real ranks: the model cut into stages, micro-batches passed along.

The idea (GPipe, Huang et al. 2019; PipeDream-Flush/1F1B and interleaving, Narayanan et al. 2021
§2.2; zero bubble, Qi et al. 2023): give each of p ranks a contiguous slice of the layers (or v
slices, interleaved), split the global batch into m micro-batches, and let rank r send the
activation of each micro-batch to rank r+1 after its forward, and the gradient to rank r−1 after
its backward. While micro-batch i is on rank 1, micro-batch i+1 can be on rank 0: the ranks work
at the same time except at the start and the end (the *bubble*, (p−1)/m of the ideal time for
GPipe and 1F1B, ``playbook.theory.pp.schedules``). The V-shaped schedules (ZB-V, DualPipe-V,
``playbook.theory.pp.v``) give rank r stages r and 2p − 1 − r; the same executor plays them.

Read in this order:

- ``parallel.pp.executor``: the GPT in pieces (``Chunk``) and ``run_step``, which plays one rank's
  list of a schedule, the same lists the simulator plays;
- this module: ``on_rank``, the one training loop (``parallel.training.train``) with one pipeline
  step as its ``forward_backward`` hook; ``merge``; and ``playbook run pp``;
- ``parallel.pp.native``: the same chunks driven by ``torch.distributed.pipelining``;
- ``theory.pp.pipeline`` (stage ranges, activation and memory bytes predicted) and
  ``measure.held`` / ``measure.pipeline`` (the same bytes measured, the timeline and its bubble).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from playbook.cluster import default_backend, launch
from playbook.dims import ParallelDims
from playbook.measure.held import HeldActivations
from playbook.measure.memory import gradient_bytes, optimizer_bytes, parameter_bytes
from playbook.measure.pipeline import activation_report, compare_bubble
from playbook.model.gpt import GPT
from playbook.parallel.tied import single_process_names, sum_with_peer
from playbook.parallel.pp.executor import Chunk, Pieces, StepLog, check_microbatches, microbatches, run_step
from playbook.parallel.pp.native import NATIVE, native_limits, native_on_rank
from playbook.parallel.registry import register
from playbook.parallel.report import RunReport, compare
from playbook.parallel.training import TrainResult, TrainSetup, train
from playbook.parallel.parity import against_single
from playbook.parallel.parity import reference as single_process
from playbook.theory.pp.pipeline import predicted_memory, stage_ranges
from playbook.theory.pp.types import Schedule
from playbook.theory.pp.schedules import (
    SCHEDULES,
    V_SCHEDULES,
    DEFINITIONS,
    check_pipeline,
    chunks_per_rank,
    make_schedule,
)

__all__ = [
    "Chunk",
    "HeldActivations",
    "PipelineReport",
    "PipelineSetup",
    "Pieces",
    "StepLog",
    "merge",
    "native_on_rank",
    "on_rank",
    "run_pp",
    "run_step",
    "stage_ranges",
]


@dataclass(frozen=True)
class PipelineSetup(TrainSetup):
    """``TrainSetup`` with the preset's depth changed (``n_layers``, 0 keeps it), so that 4 ranks ×
    2 chunks have 8 layers to share. ``train(setup)`` builds the same deeper model: still the reference."""

    n_layers: int = 0

    def config(self):
        cfg = super().config()
        return cfg.replace(n_layers=self.n_layers) if self.n_layers else cfg


# ---- a whole training run on one rank: the one loop, a pipeline step as its forward_backward ----
def on_rank(
    ctx, setup: TrainSetup, *, schedule: str, m: int, v: int = 1, partition=None, group=None, prepost: bool = True
) -> dict:
    """Rank function: train ``setup`` with schedule ``schedule`` (m micro-batches, v chunks per rank)
    on this rank's chunks; returns its losses (last rank), first-step gradients and final parameters
    (GPT names), per-step logs and times, memory by category. ``group``: the ranks of the pipeline
    (default: every rank, the ``pp`` axis of ``ParallelDims(pp=world)``); ``partition``: pieces per
    virtual stage (default ``equal_partition``); ``prepost``: see ``run_step``."""
    group = group if group is not None else ctx.mesh_for(ParallelDims(pp=ctx.world_size)).group("pp")
    p, rank, cfg = dist.get_world_size(group), dist.get_rank(group), setup.config()
    check_pipeline(p, m, v, name=schedule, n_layers=cfg.n_layers)
    plan = make_schedule(schedule, p, m, v)
    peer = tied_peer(plan, rank, cfg)  # a tied embedding: the rank holding its other copy
    ranges = [stage_ranges(cfg, p * v, partition)[plan.stage(rank, c)] for c in range(v)]
    model = GPT(cfg, seed=setup.seed).to(ctx.device)
    chunks = [Chunk(model, *rg, global_tokens=setup.global_batch * setup.seq_len) for rg in ranges]
    share = Pieces(model, [i for start, end in ranges for i in range(start, end)])  # what this rank trains
    optimizer = torch.optim.AdamW(share.parameters(), lr=setup.lr)
    held = HeldActivations(model)
    shape = (setup.global_batch // m, setup.seq_len, cfg.hidden)  # one message: [micro_batch, seq, hidden]
    logs: list[StepLog] = []
    times: list[float] = []

    def forward_backward(_, tokens, targets):  # tokens, targets: m micro-batches, [global_batch / m, s] each
        held.peak = held.now
        t0 = time.perf_counter()
        logs.append(
            run_step(plan, rank, chunks, tokens, targets, shape, group, held, tracer=ctx.tracer, prepost=prepost)
        )
        if peer is not None:  # the lookup's gradient + the projection's, on both copies (``hybrid_tied``)
            sum_with_peer((share.tok_emb if hasattr(share, "tok_emb") else share.lm_head).weight.grad, peer, group)
        times.append(time.perf_counter() - t0)
        return torch.tensor(logs[-1].loss, dtype=torch.float64)  # the last stage's loss, exactly; 0 elsewhere

    result = train(
        setup,
        model=share,
        optimizer=optimizer,
        batch=lambda step: microbatches(setup, step, m, ctx.device),
        forward_backward=forward_backward,
        progress=ctx.progress,
    )
    result = single_process_names(result) if cfg.tie_embeddings else result
    # by category; parameters, gradients and AdamW state keep the sizes they had after the first step
    memory = {
        "params": parameter_bytes(share),
        "grads": gradient_bytes(share),
        "optimizer": optimizer_bytes(optimizer),
        "activations": logs[0].peak_bytes,
    }
    return {
        "rank": rank,
        "losses": result.losses,
        "grads": result.grads,
        "params": result.params,
        "logs": logs,
        "step_s": times,
        "memory": memory,
        "ranges": ranges,
    }


def tied_peer(plan: Schedule, rank: int, cfg) -> int | None:
    """With a tied embedding, the pipeline rank holding its other copy (the embedding is on the first
    stage, the head on the last; Narayanan et al. 2021's embedding group); None if untied, or if this
    rank holds both (the V of ZB-V and DualPipe-V) or neither."""
    holder = {plan.stage(r, c): r for r in range(plan.p) for c in range(plan.v)}
    first, last = holder[0], holder[plan.n_stages - 1]
    return {first: last, last: first}.get(rank) if cfg.tie_embeddings and first != last else None


def merge(answers: list[dict]) -> TrainResult:
    """One TrainResult from every rank's share (the loss lives on the rank of the last stage)."""
    grads, params = {}, {}
    for a in answers:
        grads |= a["grads"]
        params |= a["params"]
    last = max(answers, key=lambda a: sum(abs(x) for x in a["losses"]))
    return TrainResult(last["losses"], grads, params)


# ---- playbook run pp ---------------------------------------------------------------------------
@dataclass
class PipelineReport(RunReport):
    """``RunReport`` plus a ``schedule`` block: name, bubble predicted and measured (both
    definitions, which is which spelled out), peak activations, step time."""

    schedule: dict = field(default_factory=dict)

    def summary(self) -> str:
        s, native = self.schedule, self.native
        skipped = (native or {}).get("skipped")
        self.native = None if skipped else native  # the shared summary expects parity numbers
        try:
            lines = [super().summary()]
        finally:
            self.native = native
        if skipped:
            lines.append(f"  native: skipped, {skipped}")
        lines.append(f"  schedule {s['name']} (p={s['p']}, m={s['m']}, v={s['v']})")
        for k in DEFINITIONS:
            lines.append(
                f"    bubble {k:<18} predicted {s['bubble_predicted'][k]:.3f}  measured {s['bubble_measured'][k]:.3f}"
            )
        lines.append(
            f"    peak activations per rank (bytes): predicted {s['activations']['predicted_bytes']}, "
            f"measured {s['activations']['measured_bytes']}"
        )
        return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--schedule", default="1f1b", choices=[*SCHEDULES, *V_SCHEDULES])
    parser.add_argument(
        "--microbatches", type=int, default=4, help="m: micro-batches per step (divides --global-batch)"
    )
    parser.add_argument(
        "--chunks",
        type=int,
        default=None,
        help="v: model chunks per rank (default: 2 for interleaved, zb-v and dualpipe-v, else 1)",
    )
    parser.add_argument("--layers", type=int, default=0, help="override the preset's number of layers (0: keep)")
    parser.add_argument("--no-native", action="store_true", help="skip torch.distributed.pipelining")


def _on_rank_counting(ctx, setup, **options) -> dict:
    """``on_rank``, plus the bytes this rank sent by op (from the tracer), for the report."""
    out = on_rank(ctx, setup, **options)
    out["sent_bytes"] = ctx.tracer.bytes_by_op()
    return out


def predicted_p2p_bytes(plan: Schedule, setup: TrainSetup, rank: int = 0) -> float:
    """Bytes ``rank`` sends point-to-point per step: one activation (forward) or gradient
    (backward) of [global_batch/m, seq, hidden] fp32 per send action to another rank, and with a
    tied embedding its copy's [vocab, hidden] gradient to the other end (``tied_peer``)."""
    cfg = setup.config()
    message = setup.global_batch // plan.m * setup.seq_len * cfg.hidden * 4
    tied = 4 * cfg.vocab_size * cfg.hidden if tied_peer(plan, rank, cfg) is not None else 0  # the copy's gradient
    return float(sum(message for a in plan.actions[rank] if a.kind.startswith("send") and a.peer != rank) + tied)


def predict(setup: TrainSetup, *, world_size: int, schedule: str, m: int, v: int = 1) -> dict[str, float]:
    """Bytes rank 0 sends per step: ``predicted_p2p_bytes`` of the schedule's send actions."""
    return {"isend": predicted_p2p_bytes(make_schedule(schedule, world_size, m, v), setup)}


@register(
    "pp",
    help="pipeline parallel: GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-V, DualPipe-V on real stages",
    arguments=add_arguments,
    on_rank=on_rank,
    predict=predict,
)
def run_pp(
    setup: TrainSetup,
    *,
    world_size: int = 2,
    backend: str = "auto",
    launch=launch,
    schedule: str = "1f1b",
    microbatches: int = 4,
    chunks: int | None = None,
    layers: int = 0,
    no_native: bool = False,
) -> PipelineReport:
    setup = PipelineSetup(**setup.as_dict(), n_layers=layers) if not isinstance(setup, PipelineSetup) else setup
    if chunks is None:  # a V holds two by itself, as the planner labels it (0 stays 0: refused below)
        chunks = chunks_per_rank(schedule, 2)
    check_pipeline(world_size, microbatches, chunks, name=schedule, n_layers=setup.config().n_layers)
    check_microbatches(setup, microbatches)
    backend = default_backend(world_size) if backend == "auto" else backend
    plan = make_schedule(schedule, world_size, microbatches, chunks)
    results = launch(_on_rank_counting, world_size, setup, schedule=schedule, m=microbatches, v=chunks, backend=backend)
    reference = single_process(setup)
    native = None
    if setup.config().tie_embeddings:
        native = {"skipped": "torch.distributed.pipelining's stages do not sum a tied embedding's two copies"}
    elif native_limits(schedule, world_size, microbatches):
        native = {"skipped": native_limits(schedule, world_size, microbatches)}
    elif not no_native:
        nat = launch(native_on_rank, world_size, setup, schedule=schedule, m=microbatches, v=chunks, backend=backend)
        native = compare(merge(nat), reference, name="single process, same global batch") | {
            "implementation": f"torch.distributed.pipelining.{NATIVE[schedule]}",
            "step_s": sum(r["step_s"][-1] for r in nat) / len(nat),
        }
    ours = merge(results)
    bubble = compare_bubble(results, plan)
    bubble["activations"] = activation_report(results, plan, setup)
    return PipelineReport(
        strategy="pp",
        world_size=world_size,
        backend=backend,
        parity=against_single(ours, setup, single=reference),
        native=native,
        memory={"predicted": predicted_memory(setup, plan), "measured": results[0]["memory"]},
        comm={
            "predicted": predict(setup, world_size=world_size, schedule=schedule, m=microbatches, v=chunks),
            "measured": {op: b / setup.steps for op, b in results[0]["sent_bytes"].items() if b},
        },
        setup=setup.as_dict(),
        losses=ours.losses,
        schedule=bubble,
    )
