"""Step 4 of ``parallelize``: a pipeline over the mesh's ``pp`` axis, inside the one training loop.

The loop's ``forward_backward`` hook is replaced by the schedule executor of ``parallel.pp.pipeline``
(``run_step``), playing this rank's list of the schedule with its stage index ``mesh.index("pp")``
and the ``pp`` process group; peers are group-local indices, translated to global ranks where the
messages are sent. A rank holds ``plan.v`` chunks, virtual stages of pp·v equal-as-possible ones
(``theory.pipeline.stage_ranges``) where the schedule places them: chunk c is stage c·pp + r for
interleaved 1F1B (Narayanan et al. 2021, §2.2.2), stages r and 2·pp − 1 − r on the V (ZB-V, Qi et
al. 2023, §6; DualPipe-V, DeepSeek-AI 2024, §3.2.1). The stage (``pp_executor.Chunk``) holds the GPT's own modules under their own
names, so parameters and gradients compare with the single process name for name, whatever tensor
parallelism did to them; under context parallelism it gives its blocks this rank's RoPE positions,
and a message holds this rank's tokens: [b/m, s/cp, h], [b/m, s/(cp·tp), h] under sequence
parallelism (the residual stream is sharded over tp there, Korthikanti et al. 2022, §4.2.2).

The loss: each micro-batch's mean over this rank's tokens, divided by m (``pp_executor``), so a
step's m backward passes give the gradient of this rank's mean; every rank holds as many tokens,
so averaging over dp×cp afterwards (``hybrid.sync_gradients``) gives the global batch's mean.
With ZeRO the stage's units are sharded over dp×cp (``hybrid_zero``); ZeRO-2 and 3 reduce on the
last micro-batch, and ZeRO-3 gathers its weights once, before the step's first forward
(``parallel.zero.pipeline``).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from playbook.measure.memory import gradient_bytes, optimizer_bytes, parameter_bytes
from playbook.parallel.pp.pipeline import Chunk, HeldActivations, Pieces, run_step, stage_ranges
from playbook.theory.schedules import make_schedule


def pipeline_hooks(model, mesh, plan, setup, rows: int, logs: list, positions=None) -> tuple[nn.Module, dict]:
    """(the stage module to train, the loop hooks that run one pipeline step on it). ``positions``:
    this rank's RoPE positions under context parallelism ([s/cp] int64)."""
    p, stage, cfg = mesh.size("pp"), mesh.index("pp"), setup.config()
    schedule = make_schedule(plan.schedule, p, plan.m, plan.v)
    ranges = [stage_ranges(cfg, p * plan.v)[schedule.stage(stage, c)] for c in range(plan.v)]
    chunks = [Chunk(model, start, end, positions) for start, end in ranges]  # this rank's v virtual stages
    pieces = sorted({i for start, end in ranges for i in range(start, end)})
    own = Pieces(model, pieces)  # the GPT's own modules under their names in it: what this rank trains
    zero = None
    if plan.zero:  # before the activation hooks: the weights become views of ZeRO's flat buffers
        from playbook.parallel.hybrid.zero import zero_optimizer

        zero, zero_hooks = zero_optimizer(model, mesh, plan, setup, None, pieces=pieces)
        zero_hooks.pop("memory")
    held = HeldActivations(model)
    not_activations = set(held.skip)  # the weights' and buffers' storages
    tokens = setup.seq_len // mesh.size("cp") // (mesh.size("tp") if plan.sequence_parallel else 1)
    shape = (rows // plan.m, tokens, cfg.hidden)  # one message: [micro_batch, s/cp (/tp under SP), hidden]

    def forward_backward(_, tokens, targets):
        if hasattr(zero, "begin_step"):  # ZeRO-3: the stage's weights gathered for the whole step
            held.skip = not_activations | zero.begin_step()  # today's storages of the weights (a freed one is reused)
        held.peak = held.now
        micro = [t.clone() for t in tokens.chunk(plan.m)], [t.clone() for t in targets.chunk(plan.m)]
        log = run_step(schedule, stage, chunks, *micro, shape, mesh.group("pp"), held)
        logs.append(log)
        return torch.tensor(log.loss, device=tokens.device)  # the last stage's loss; 0 elsewhere

    hooks = {"model": own, "forward_backward": forward_backward}
    if zero is not None:
        finish = zero_hooks["finish"]
        return own, hooks | zero_hooks | {"finish": lambda r: finish(_with(r, activations=logs[0].peak_bytes))}
    optimizer = torch.optim.AdamW(own.parameters(), lr=setup.lr)

    def finish(result):
        result.memory = {
            "params": parameter_bytes(own),
            "grads": gradient_bytes(own),
            "optimizer": optimizer_bytes(optimizer),
            "activations": logs[0].peak_bytes,
        }
        return result

    return own, hooks | {"optimizer": optimizer, "finish": finish}


def _with(result, **memory):
    result.memory = {**(result.memory or {}), **memory}
    return result
