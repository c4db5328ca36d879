"""Step 4 of ``parallelize``: the one driver of every layout, a pipeline over the mesh's ``pp`` axis.

Every layout trains through this driver: pp = 1 is a pipeline of one stage, whose schedule (1F1B of
one stage: F₀ B₀ F₁ B₁ …) is gradient accumulation over its m micro-batches; there is no other loop.
The loop's ``forward_backward`` hook is the schedule executor of ``parallel.pp.run`` (``run_step``),
playing this rank's list of the schedule with its stage index ``mesh.index("pp")`` and the ``pp``
process group; peers are group-local indices, translated to global ranks where the messages are
sent. A rank holds ``plan.v`` chunks, virtual stages of pp·v equal-as-possible ones
(``theory.pp.pipeline.stage_ranges``) where the schedule places them: chunk c is stage c·pp + r for
interleaved 1F1B (Narayanan et al. 2021, §2.2.2), stages r and 2·pp − 1 − r on the V (ZB-V, Qi et
al. 2023, §6; DualPipe-V, DeepSeek-AI 2024, §3.2.1). The stage (``pp.executor.Chunk``) holds the
GPT's own modules under their own names, so parameters and gradients compare with the single
process name for name, whatever tensor parallelism did to them; under context parallelism it gives
its blocks this rank's RoPE positions, and a message holds this rank's tokens: [b/m, s/cp, h],
[b/m, s/(cp·tp), h] under sequence parallelism (Korthikanti et al. 2022, §4.2.2).

The loss, the one normalisation: each micro-batch's Σ token cross-entropy divided by the global
batch's token count (``Chunk.global_tokens``), so that the m backward passes of every rank add up to its
share of the global batch's mean gradient, and the ranks' shares are summed (``parallel.grads``).

ZeRO (Rajbhandari et al. 2020) shards the stage's units over dp×cp (``hybrid.zero``). With one
micro-batch and one stage, ZeRO-3 runs each piece through its own runner in the ``Chunk``: gather the
piece's weights, compute, free them, gather again for its backward. With more micro-batches, or
more stages, ZeRO-2 and 3 reduce on the last micro-batch and ZeRO-3 gathers its weights once,
before the step's first forward, keeping them through every micro-batch, as torchtitan does with
FSDP under PP (``parallel.zero.pipeline``).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from playbook.measure.memory import gradient_bytes, optimizer_bytes, parameter_bytes
from playbook.parallel.pp.executor import Chunk, Pieces, run_step
from playbook.measure.held import HeldActivations
from playbook.theory.pp.pipeline import stage_ranges
from playbook.theory.pp.schedules import make_schedule


def pipeline_hooks(
    model, mesh, plan, setup, rows: int, logs: list, positions=None, tracer=None, clip=None
) -> tuple[nn.Module, dict]:
    """(the stage module to train, the loop hooks that run one pipeline step on it). ``positions``:
    this rank's RoPE positions under context parallelism ([s/cp] int64); ``clip``: under ZeRO, the
    global-norm clip of its slices (``parallel.clip``), run inside its ``sync_grads``."""
    p, stage, cfg = mesh.size("pp"), mesh.index("pp"), setup.config()
    schedule = make_schedule(plan.played_schedule, p, plan.m, plan.v)
    ranges = [stage_ranges(cfg, p * plan.v)[schedule.stage(stage, c)] for c in range(plan.v)]
    tokens = setup.global_batch * setup.seq_len  # Σ token losses / global tokens
    chunks = [Chunk(model, start, end, positions, global_tokens=tokens) for start, end in ranges]  # v virtual stages
    pieces = sorted({i for start, end in ranges for i in range(start, end)})
    own = Pieces(model, pieces)  # the GPT's own modules under their names in it: what this rank trains
    zero = None
    if plan.zero:  # before the activation hooks: the weights become views of ZeRO's flat buffers
        from playbook.parallel.hybrid.zero import piece_runner, zero_optimizer

        zero, zero_hooks = zero_optimizer(model, mesh, plan, setup, tracer, pieces=pieces, clip=clip)
        zero_hooks.pop("memory")
        if not hasattr(zero, "begin_step") and zero.stage == 3:  # one micro-batch: gathered piece by piece
            for chunk in chunks:
                chunk.run = piece_runner(zero, last=cfg.n_layers + 1)
    held = HeldActivations(model)
    held.skip = _Weights(held.skip, zero)  # weight storages are not activations, however ZeRO moves them
    tokens = setup.seq_len // mesh.size("cp") // (mesh.size("tp") if plan.sequence_parallel else 1)
    shape = (rows // plan.m, tokens, cfg.hidden)  # one message: [micro_batch, s/cp (/tp under SP), hidden]

    def forward_backward(_, tokens, targets):
        if hasattr(zero, "begin_step"):  # ZeRO-3 over micro-batches: the stage's weights gathered for the step
            zero.begin_step()
        held.peak = held.now
        micro = [t.clone() for t in tokens.chunk(plan.m)], [t.clone() for t in targets.chunk(plan.m)]
        log = run_step(schedule, stage, chunks, *micro, shape, mesh.group("pp"), held)
        logs.append(log)
        return torch.tensor(log.loss, device=tokens.device)  # the last stage's share; 0 elsewhere

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


class _Weights:
    """The storages that hold weights, not activations (``HeldActivations.skip``): the parameters'
    and buffers' of the stage as built, and ZeRO's flat buffers as they are now (ZeRO-3 gathers into
    a storage that it frees and allocates again, at another address)."""

    def __init__(self, fixed: set[int], zero):
        self.fixed, self.zero = fixed, zero

    def __contains__(self, key: int) -> bool:
        if key in self.fixed:
            return True
        units = self.zero.units if self.zero is not None else []
        return any((u.full if hasattr(u, "full") else u.flat).untyped_storage().data_ptr() == key for u in units)


def _with(result, **memory):
    result.memory = {**(result.memory or {}), **memory}
    return result
