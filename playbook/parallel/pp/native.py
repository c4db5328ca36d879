"""The native counterpart of our pipeline: ``torch.distributed.pipelining`` on the same chunks.

``PipelineStage`` wraps each of this rank's ``Chunk``s (the GPT's own modules, cut where ours are
cut, ``playbook.theory.pp.pipeline.stage_ranges``), and one of torch's schedules plays them:
ScheduleGPipe (Huang et al. 2019), Schedule1F1B and ScheduleInterleaved1F1B (Narayanan et al.
2021 §2.2), ScheduleInterleavedZeroBubble and ScheduleZBVZeroBubble (Qi et al. 2023),
ScheduleDualPipeV (DeepSeek-AI 2024, arXiv:2412.19437 §3.2.1). Its ``step`` is one pipeline step:
the ``forward_backward`` hook of the one training loop, as ``run_step`` is for ours.
``native_orders``: the compute order torch's V schedules build for each rank, read without ranks,
to put beside ours (``playbook.theory.pp.v``).

Every stage is built in torch's static mode: the shapes it receives and sends are known from the
config (``stage_shapes``), so no stage asks its neighbours for them. Left to infer them, torch
sends each stage's metadata with ``send_object_list``, i.e. pickle over the ranks' sockets.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from playbook.dims import ParallelDims
from playbook.model.gpt import GPT, lm_loss
from playbook.parallel.pp.executor import Chunk, Pieces, check_microbatches
from playbook.parallel.training import TrainSetup, train
from playbook.theory.pp.pipeline import stage_ranges
from playbook.theory.pp.schedules import check_pipeline

NATIVE = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "zb-h1": "ScheduleInterleavedZeroBubble",
    "zb-v": "ScheduleZBVZeroBubble",
    "dualpipe-v": "ScheduleDualPipeV",
}
NO_TIED = (
    "{model} ties its head to its embedding, and torch.distributed.pipelining's stages do not sum the "
    "two copies; run ours (parallel.pp.pipeline.on_rank) for a tied preset"
)
V_PLACED = ("zb-v", "dualpipe-v")  # torch places their stages in a V too: rank r holds r and 2p − 1 − r


def native_orders(name: str, p: int, m: int) -> list[list[tuple[str, int, int]]]:
    """Per-rank compute orders ``[(kind, mb, chunk), ...]`` that torch's ``NATIVE[name]`` (a V
    schedule) builds, in our notation: its I (input gradient) is our B, its full backward B is our
    B then W, an overlapped F&B pair is its two parts in order; chunk 0 is stage r, chunk 1 stage
    2p − 1 − r. Read from the class's own per-rank planner on an instance that has only the
    numbers it needs (p, m, 2p stages): no process group, no ranks."""
    import torch.distributed.pipelining.schedules as sched

    if name not in V_PLACED:
        raise ValueError(f"native_orders reads the V schedules {V_PLACED}; got {name!r}")
    cls = getattr(sched, NATIVE[name])
    plan = object.__new__(cls)
    plan.pp_group_size, plan.num_stages, plan._num_stages, plan._n_microbatches = p, 2 * p, 2 * p, m

    def ours(a, rank) -> list[tuple[str, int, int]]:
        if a.sub_actions:
            return [x for sub in a.sub_actions for x in ours(sub, rank)]
        chunk = 0 if a.stage_index == rank else 1
        kind = a.computation_type.value
        if kind == "B":  # a full backward: input and weight gradients at once
            return [("B", a.microbatch_index, chunk), ("W", a.microbatch_index, chunk)]
        return [({"F": "F", "I": "B", "W": "W"}[kind], a.microbatch_index, chunk)]

    return [
        [x for a in plan._calculate_single_rank_operations(r) if a is not None for x in ours(a, r)] for r in range(p)
    ]


def native_pairs(name: str, p: int, m: int) -> list[list[int]]:
    """Per rank, where in :func:`native_orders`' order each of torch's ``OVERLAP_F_B`` actions opens
    (the position of its F): what ``theory.pp.v.v_pairs`` must give."""
    import torch.distributed.pipelining.schedules as sched

    cls = getattr(sched, NATIVE[name])
    plan = object.__new__(cls)
    plan.pp_group_size, plan.num_stages, plan._num_stages, plan._n_microbatches = p, 2 * p, 2 * p, m
    out = []
    for r in range(p):
        at, opens = 0, []
        for a in plan._calculate_single_rank_operations(r):
            if a is None:
                continue
            if a.sub_actions:
                opens.append(at)
            parts = a.sub_actions or (a,)
            at += sum(2 if x.computation_type.value == "B" else 1 for x in parts)  # a full B is our B and W
        out.append(opens)
    return out


def native_limits(name: str, p: int, m: int) -> str | None:
    """Why torch's counterpart cannot run this case (None if it can): its 1F1B-style schedules
    need at least as many micro-batches as stages."""
    if name != "gpipe" and m < p:
        return f"torch.distributed.pipelining.{NATIVE[name]} needs m >= p micro-batches (m={m}, p={p})"
    if name == "dualpipe-v" and m < 2 * p:
        return f"torch.distributed.pipelining.{NATIVE[name]} needs m >= 2p micro-batches (m={m}, p={p})"
    return None


def stage_shapes(setup: TrainSetup, m: int, first: bool, last: bool, dtype: torch.dtype) -> tuple:
    """(example input, example output) of one stage for one micro-batch, on the meta device: token
    ids [b, s] into the first, hidden states [b, s, hidden] between stages, logits [b, s, vocab] out
    of the last (b = global_batch / m, the rows torch cuts each micro-batch to). Those that carry a
    gradient back say so (``requires_grad``): torch sizes the gradients it receives from them."""
    cfg, b, s = setup.config(), setup.global_batch // m, setup.seq_len
    hidden = torch.empty(b, s, cfg.hidden, dtype=dtype, device="meta", requires_grad=True)
    x = torch.empty(b, s, dtype=torch.int64, device="meta") if first else hidden
    y = torch.empty(b, s, cfg.vocab_size, dtype=dtype, device="meta", requires_grad=True) if last else hidden
    return x, y


def native_on_rank(ctx, setup: TrainSetup, *, schedule: str, m: int, v: int = 1, group=None) -> dict:
    """Rank function: the same chunks driven by ``torch.distributed.pipelining`` over ``group``
    (default: every rank in one pipeline). Its zero-bubble schedule (ScheduleInterleavedZeroBubble)
    is a multi-stage one: v chunks per rank (v >= 1)."""
    import torch.distributed.pipelining as pipelining

    if setup.config().tie_embeddings:
        raise ValueError(NO_TIED.format(model=setup.model))
    group = group if group is not None else ctx.mesh_for(ParallelDims(pp=ctx.world_size)).group("pp")
    p, rank, cfg = dist.get_world_size(group), dist.get_rank(group), setup.config()
    check_pipeline(p, m, v if schedule in ("interleaved", *V_PLACED) else 1, name=schedule, n_layers=cfg.n_layers)
    if native_limits(schedule, p, m):
        raise ValueError(native_limits(schedule, p, m))
    check_microbatches(setup, m)  # static stage shapes: each micro-batch is global_batch / m rows
    n = p * v
    ranges = stage_ranges(cfg, n)
    model = GPT(cfg, seed=setup.seed).to(ctx.device)
    where = (lambda c: rank if c == 0 else n - 1 - rank) if schedule in V_PLACED else (lambda c: c * p + rank)
    chunks = [Chunk(model, *ranges[where(c)], global_tokens=setup.global_batch * setup.seq_len) for c in range(v)]
    dtype = next(model.parameters()).dtype
    stages = []
    for c, ch in enumerate(chunks):
        x, y = stage_shapes(setup, m, ch.first, ch.last, dtype)  # static: no shapes pickled between ranks
        stages.append(pipelining.PipelineStage(ch, where(c), n, ctx.device, input_args=x, output_args=y, group=group))
    multi = schedule in ("interleaved", "zb-h1", *V_PLACED)
    runner = getattr(pipelining, NATIVE[schedule])(stages if multi else stages[0], m, loss_fn=lm_loss)
    times: list[float] = []

    def forward_backward(_, tokens, targets):  # tokens, targets: [global_batch, s]; torch cuts the micro-batches
        out: list = []
        args = (tokens,) if any(ch.first for ch in chunks) else ()
        kwargs = {"target": targets, "losses": out} if any(ch.last for ch in chunks) else {}
        t0 = time.perf_counter()
        runner.step(*args, **kwargs)
        times.append(time.perf_counter() - t0)
        return torch.stack(out).mean() if out else torch.tensor(0.0)  # the mean of the micro-batch losses

    share = Pieces(model, [i for ch in chunks for i in range(ch.start, ch.end)])
    result = train(setup, model=share, device=ctx.device, forward_backward=forward_backward, progress=ctx.progress)
    return {"rank": rank, "losses": result.losses, "grads": result.grads, "params": result.params, "step_s": times}
