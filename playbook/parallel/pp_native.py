"""The native counterpart of our pipeline: ``torch.distributed.pipelining`` on the same chunks.

``PipelineStage`` wraps each of this rank's ``Chunk``s (the GPT's own modules, cut where ours are
cut, ``playbook.theory.pipeline.stage_ranges``), and one of torch's schedules plays them:
ScheduleGPipe (Huang et al. 2019), Schedule1F1B and ScheduleInterleaved1F1B (Narayanan et al.
2021 §2.2), ScheduleInterleavedZeroBubble (Qi et al. 2023). Its ``step`` is one pipeline step: the
``forward_backward`` hook of the one training loop, as ``run_step`` is for ours.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from playbook.dims import ParallelDims
from playbook.model import GPT, lm_loss
from playbook.parallel.pp_executor import Chunk, Pieces
from playbook.parallel.training import TrainSetup, train
from playbook.theory.pipeline import stage_ranges
from playbook.theory.schedules import check_pipeline

NATIVE = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "zb-h1": "ScheduleInterleavedZeroBubble",
}


def native_limits(name: str, p: int, m: int) -> str | None:
    """Why torch's counterpart cannot run this case (None if it can): its 1F1B-style schedules
    need at least as many micro-batches as stages."""
    if name != "gpipe" and m < p:
        return f"torch.distributed.pipelining.{NATIVE[name]} needs m >= p micro-batches (m={m}, p={p})"
    return None


def native_on_rank(ctx, setup: TrainSetup, *, schedule: str, m: int, v: int = 1, group=None) -> dict:
    """Rank function: the same chunks driven by ``torch.distributed.pipelining`` over ``group``
    (default: every rank in one pipeline). Its zero-bubble schedule (ScheduleInterleavedZeroBubble)
    is a multi-stage one: v chunks per rank (v >= 1)."""
    import torch.distributed.pipelining as pipelining

    group = group if group is not None else ctx.mesh_for(ParallelDims(pp=ctx.world_size)).group("pp")
    p, rank, cfg = dist.get_world_size(group), dist.get_rank(group), setup.config()
    check_pipeline(p, m, v if schedule == "interleaved" else 1, name=schedule, n_layers=cfg.n_layers)
    if native_limits(schedule, p, m):
        raise ValueError(native_limits(schedule, p, m))
    n = p * v
    ranges = stage_ranges(cfg, n)
    model = GPT(cfg, seed=setup.seed).to(ctx.device)
    chunks = [Chunk(model, *ranges[c * p + rank]) for c in range(v)]
    stages = [pipelining.PipelineStage(ch, c * p + rank, n, ctx.device, group=group) for c, ch in enumerate(chunks)]
    multi = schedule in ("interleaved", "zb-h1")
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
