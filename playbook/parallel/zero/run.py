"""``playbook run zero``: our ZeRO (``parallel.zero.zero.Zero``) on real ranks, on the one training loop.

Each rank trains ``GPT(cfg, seed)`` on its rows of every global batch with ``Zero`` as the loop's
optimizer (``parallel.zero.sharded.train_sharded``); the report puts beside the single process (parity)
and beside ``theory.zero.zero`` (Rajbhandari et al. 2019, arXiv:1910.02054, §5 and §7) what rank 0 held
by category and by moment, and the bytes it sent per step by collective.
"""

from __future__ import annotations

import argparse

from playbook.cluster import default_backend, launch
from playbook.model.gpt import GPT
from playbook.parallel.mixed import PRECISIONS, check_precision, to_mixed
from playbook.parallel.registry import register
from playbook.parallel.zero.sharded import MOMENTS, ShardedReport, ShardedResult, train_sharded
from playbook.parallel.training import TrainSetup
from playbook.parallel.zero.zero import Zero
from playbook.parallel.parity import against_single
from playbook.theory.zero.sharded import padding_note, predicted_memory
from playbook.theory.zero.zero import check_stage, zero_comm_per_step, zero_memory_by_moment


def on_rank(ctx, setup: TrainSetup, *, stage: int, prefetch: bool = True, precision: str = "fp32") -> ShardedResult:
    """Rank function: ``setup.steps`` ZeRO steps on this rank's slice of each global batch, over the
    dp group of ``ctx.mesh``; gradients (first step) and parameters (last) come back whole.
    ``precision="mixed"``: the model in bf16, fp32 masters of this rank's slices (``parallel.mixed``)."""
    model = GPT(setup.config(), seed=setup.seed).to(ctx.device)
    if precision == "mixed":
        to_mixed(model)
    group = ctx.mesh.group("dp")
    zero = Zero(model, stage=stage, group=group, lr=setup.lr, prefetch=prefetch, tracer=ctx.tracer, precision=precision)
    first: list = []

    def loss(tokens, targets, global_tokens):
        zero.gathered_log.clear()  # the whole units held during this step only
        return zero.loss(tokens, targets, global_tokens)

    def sync(_):
        zero.sync()
        if not first:  # the first step's gradient slices, after the reduce-scatter
            first.extend(None if u.opt_param.grad is None else u.opt_param.grad.clone() for u in zero.units)

    result = train_sharded(
        ctx,
        setup,
        model=model,
        optimizer=zero,
        loss=loss,
        held=zero.held,
        weights=zero.unit_buffers,
        sync_grads=sync,
        compute_spans=stage < 3,
    )
    result.grads, result.params = zero.gather(first), zero.gather([u.opt_param for u in zero.units])
    result.memory["peak_gathered"] = dict(zero.peak_gathered)
    result.gathered_log = list(zero.gathered_log)
    return result


def add_arguments(parser) -> None:
    parser.add_argument("--stage", type=int, default=3, help="ZeRO stage: 1, 2 or 3 (0 = plain data parallel)")
    parser.add_argument(
        "--prefetch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ZeRO-3: gather the next unit while this one computes",
    )
    parser.add_argument(
        "--precision", choices=PRECISIONS, default="fp32", help="mixed: bf16 units and collectives, fp32 master + AdamW"
    )


def predict(setup: TrainSetup, *, world_size: int, stage: int, precision: str = "fp32") -> dict[str, float]:
    """Bytes one rank sends per step by collective (``theory.zero.zero.zero_comm_per_step``)."""
    return zero_comm_per_step(setup.config(), stage=stage, world_size=world_size, precision=precision)


@register(
    "zero",
    help="ZeRO-1/2/3 from scratch: sharded optimizer, gradients, parameters",
    arguments=add_arguments,
    on_rank=on_rank,
    predict=predict,
)
def run_zero(
    setup: TrainSetup,
    *,
    world_size: int,
    backend: str = "auto",
    launch=launch,
    stage: int = 3,
    prefetch: bool = True,
    precision: str = "fp32",
) -> ShardedReport:
    check_stage(stage)
    check_precision(precision)
    if setup.config().tie_embeddings:  # the chapter's predictions (``theory.zero.zero.zero_units``) are an untied GPT's
        raise ValueError(
            f"{setup.model}: playbook run zero predicts the units of an untied GPT; a tied embedding runs "
            f"under ZeRO in playbook run hybrid --dp {world_size} --zero {stage}, or use an untied preset such as gpt-tiny"
        )
    setup.local_batch(world_size)  # the global batch must split over the ranks (clear error otherwise)
    backend = default_backend(world_size) if backend == "auto" else backend
    options = dict(stage=stage, prefetch=prefetch, precision=precision)
    r0, cfg = launch(on_rank, world_size, setup, **options, backend=backend)[0], setup.config()
    predicted = predicted_memory(setup, world_size=world_size, **options)
    by_moment = zero_memory_by_moment(cfg, stage=stage, world_size=world_size, precision=precision)
    notes = padding_note(setup, world_size=world_size)
    if stage == 3:
        pg, mg = predicted["peak_gathered"], r0.memory["peak_gathered"]
        notes.append(
            f"ZeRO-3 transient whole units ({'with' if prefetch else 'without'} prefetch), peak bytes: "
            f"forward {mg['forward']:,} (predicted {pg['forward']:,}), "
            f"backward {mg['backward']:,} (predicted {pg['backward']:,})"
        )
    return ShardedReport(
        strategy=f"zero-{stage}",
        world_size=world_size,
        backend=backend,
        parity=against_single(r0, setup, precision),
        memory={
            "predicted": predicted,
            "measured": r0.memory,
            "by_moment": {"predicted": by_moment, "measured": {m: r0.moments[m] for m in MOMENTS}},
        },
        comm={
            "predicted": predict(setup, stage=stage, world_size=world_size, precision=precision),
            "measured": r0.comm,
        },
        setup={**setup.as_dict(), **options},
        losses=r0.losses,
        notes=notes,
    )
