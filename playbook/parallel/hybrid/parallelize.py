"""The hybrid mesh: data, tensor, pipeline, context and expert parallelism at once. ``playbook run hybrid``.

One layout (``ParallelDims``), one runtime mesh (a process group per axis), one model and one
training loop. ``parallelize(model, mesh, plan)`` applies the strategies in a fixed order, as
torchtitan's ``parallelize_llama`` and Megatron-LM do:

    1. tensor parallelism (+ sequence parallelism): the GPT cut into Megatron shards over ``tp``;
    2. context parallelism: every attention core swapped for ring attention over ``cp``, RoPE at
       this rank's global positions;
    3. expert parallelism: every MoE layer's experts split over ``ep`` (under tp each tp rank routes
       its slice of the sequence, ``parallel.tp.moe``; in a pipeline every stage's aux loss counts,
       ``parallel.hybrid.moe``);
    3b. activation recomputation (``Plan.recompute``, ``hybrid.recompute``): none, selective or
       full on the blocks as TP, CP and EP left them, before the pipeline cuts them;
    4. pipeline parallelism: this rank's chunk of the (already parallel) model, or its v chunks
       (interleaved 1F1B's virtual stages; the V of ZB-V and DualPipe-V, rank 0 holding the first
       and the last stage), played by the schedule executor of ``parallel.pp.run`` over ``pp``: the one
       driver of every layout, pp = 1 a one-stage pipeline whose m micro-batches are gradient
       accumulation (``hybrid.pipeline``);
    5. data parallelism: every gradient summed over the mesh axes of its parameter's class, one
       table (``parallel.grads``), or ZeRO's sharded optimizer: dense units over ``dp×cp``, routed
       experts over their replicas (this stage's units, ``hybrid.zero``); a tied embedding's copies on
       the first and last stage then summed over them (``parallel.tied``).

Why this order: each step changes what the next one sees. TP changes the modules and their
shapes; CP and EP swap pieces inside them; the pipeline cuts the result into stages; only then
are the parameters a rank owns known, and data parallelism (or ZeRO) reduces exactly those.

Every rank reads rows ``dp_i`` of the global batch (split over dp), the tokens of its cp shard,
and computes its share of the global batch's loss: Σ of its token losses / the global token count,
the one division (``parallel.hybrid.pipeline``). Summing the shares' gradients over the ranks that hold a parameter
gives the gradient of the global batch's mean loss, which the single process computes on the whole batch.
"""

from __future__ import annotations


import torch
import torch.distributed as dist

from playbook.cluster.trace import tracer as trace
from playbook.model.gpt import GPT
from playbook.parallel.grads import reduce_gradients
from playbook.measure.steps import step_records
from playbook.parallel.hybrid.conditions import Conditions, batches, slowed
from playbook.parallel.hybrid.pipeline import pipeline_hooks
from playbook.parallel.hybrid.recompute import apply_recompute
from playbook.parallel.tied import tie_across_stages
from playbook.parallel.training import TrainResult, TrainSetup, train
from playbook.theory.hybrid.plan import Plan


# ---- 1-3: parallelize the one GPT --------------------------------------------------------------
def parallelize(model: GPT, mesh, plan: Plan, positions: torch.Tensor | None = None):
    """Apply TP (+SP), the CP attention core, EP and recomputation to ``model`` for this rank of
    ``mesh``, in that order; returns the model to train (a new module for TP, the same one otherwise). The pipeline
    (step 4, ``hybrid.pipeline``) and the gradient reduction (step 5, ``parallel.grads``) belong to the
    training loop: see ``train_hybrid``."""
    d = mesh.dims
    if d.tp > 1:
        from playbook.parallel.tp.model import TPGPT

        model = TPGPT(model, mesh.group("tp"), sequence_parallel=plan.sequence_parallel)
    if d.cp > 1:
        from playbook.parallel.cp.model import cp_attention_fn, use_attention

        use_attention(
            model, cp_attention_fn(plan.cp_variant, mesh.group("cp"), zigzag=plan.zigzag, positions=positions)
        )
    if d.ep > 1 or d.dp * d.cp * d.tp > 1:  # routing sees the global counts even with every expert local (ep = 1)
        from playbook.parallel.hybrid.moe import parallelize_experts

        parallelize_experts(model, mesh, plan.sequence_parallel)
    if plan.recompute != "none":
        apply_recompute(model, plan.recompute)
    return model


# ---- the reported loss --------------------------------------------------------------------------
def global_loss(loss: torch.Tensor, mesh) -> torch.Tensor:
    """The global batch's loss for reporting, outside the step's accounting (axis "report"): every
    rank holds its share (Σ of its token losses / global tokens; the last stage's, and every stage's
    aux loss), so the sum over the pipeline's stages and over dp×cp."""
    with trace.on_axis("report"):
        loss = loss.clone()
        for axis in ("pp", "dp_cp"):
            if mesh.size(axis) > 1:
                dist.all_reduce(loss, group=mesh.group(axis))
    return loss


def _clip(model, mesh, plan: Plan, cfg):
    """Clipping by the global norm over the mesh (``parallel.clip``), for this rank's ``model``."""
    from playbook.parallel.clip import GlobalClip
    from playbook.theory.hybrid.hybrid import tied_stage_ranks

    tied = tied_stage_ranks(cfg, plan.dims.pp, plan.schedule, plan.v)[0] if cfg.tie_embeddings else 0
    sp = plan.sequence_parallel
    return GlobalClip(model, mesh, plan.max_norm, sequence_parallel=sp, tied_stage=tied, sharded=bool(plan.zero))


# ---- the rank function ---------------------------------------------------------------------------
def train_hybrid(ctx, setup: TrainSetup, plan: Plan, conditions: Conditions | None = None, *, checkpoint=None) -> dict:
    """Train ``setup`` on this rank's share of ``plan``'s layout, under ``conditions`` (a straggler,
    a DataLoader; ``hybrid.conditions``); return its result, its coordinates, which of its tensors
    are tensor-parallel shards, its comm spans, its step times and (MoE) the routing.
    ``checkpoint`` (``parallel.checkpoint.CheckpointPlan``): resume from a checkpoint before the first
    step and save after every K-th (``parallel.checkpoint.session``)."""
    mesh = ctx.mesh_for(plan.dims)
    d, cfg = plan.dims, setup.config()
    positions = None
    if d.cp > 1:
        from playbook.theory.cp import shard_positions

        positions = torch.tensor(
            shard_positions(setup.seq_len, d.cp, mesh.coords["cp"], plan.zigzag), device=ctx.device
        )
    if cfg.is_moe:
        from playbook.model.gpt import build_moe as build

        model = build(cfg, setup.seed)
    else:
        model = GPT(cfg, seed=setup.seed)
    model = parallelize(model.to(ctx.device), mesh, plan, positions)
    split = {}
    if d.tp > 1:  # which tensors are tensor-parallel shards (before ZeRO-3 takes the parameters away)
        from playbook.parallel.grads import shard_dims

        split = shard_dims(model)
    clip = _clip(model, mesh, plan, cfg) if plan.max_norm is not None else None  # before ZeRO-3 takes the params
    task, rows = setup.task(), setup.global_batch // d.dp

    def rows_of(step):  # this rank's rows of the step's global batch, on CPU (a loader's worker may make them)
        return task.batch(step, setup.global_batch, setup.seq_len, mesh.coords["dp"], d.dp)

    conditions = conditions or Conditions()  # a straggler, a DataLoader (hybrid.conditions)
    source, close_loader = batches(rows_of, ctx, setup.steps, conditions)

    def batch(step):
        tokens, targets = (t.to(ctx.device) for t in source(step))
        if positions is not None:
            tokens, targets = tokens[:, positions], targets[:, positions]  # [rows, s/cp]: this rank's tokens
        return tokens, targets

    hooks = dict(batch=batch, sync_loss=lambda loss: global_loss(loss, mesh), progress=ctx.progress, device=ctx.device)
    pipeline_logs: list = []
    # one driver for every layout: pp = 1 is a one-stage pipeline, its m micro-batches gradient accumulation
    model, more = pipeline_hooks(model, mesh, plan, setup, rows, pipeline_logs, positions, ctx.tracer, clip)
    hooks.update(sync_grads=lambda m: reduce_gradients(m, mesh, plan.sequence_parallel))
    hooks.update(more)  # ZeRO's sync_grads, if any, replaces the all-reduces
    if cfg.tie_embeddings:  # the two copies of the embedding summed over their embedding group
        hooks = tie_across_stages(hooks, model, mesh, plan, cfg)
    routing: list = []
    if cfg.is_moe:  # the routing of every forward, for the predictions; every stage's aux loss
        from playbook.parallel.hybrid.moe import moe_hooks

        hooks = moe_hooks(hooks, plan, routing, mesh)
    if clip is not None and not plan.zero:  # last: after every sum (ZeRO clips its slices inside its own sync)
        hooks["sync_grads"] = clip.after(hooks["sync_grads"])
    hooks = slowed(hooks, ctx, conditions)
    finish = hooks.pop("finish", None)
    session, start = None, 0
    if checkpoint is not None:  # after every hook: the pieces are where the optimizer keeps them
        from playbook.parallel.checkpoint.session import Session

        loader = source if hasattr(source, "load_state_dict") else None  # a RankLoader: its position is saved
        session = Session(checkpoint, ctx, setup, plan, hooks["model"], hooks["optimizer"], split, loader)
        start = session.resume()
        hooks.update(progress=session.after_step(hooks["progress"]), sync_loss=session.wrap_loss(hooks["sync_loss"]))
    first = len(ctx.tracer.spans)
    try:
        result: TrainResult = train(setup, start=start, **hooks)
    finally:
        close_loader()
    if finish is not None:
        result = finish(result)
    if clip is not None:
        result.grad_norms = clip.norms
    spans = [s.as_dict() for s in ctx.tracer.spans[first:] if s.kind == "comm"]
    out = {"rank": ctx.rank, "coords": mesh.coords, "result": result, "spans": spans, "shard_dims": split}
    out["steps"] = step_records(ctx.tracer.spans[first:])  # per step: iteration, input wait, own work
    if routing:
        out["routing"] = routing
    if session is not None:
        out["checkpoint"] = session.report()
    return out
