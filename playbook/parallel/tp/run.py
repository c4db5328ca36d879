"""``playbook run tp``: tensor parallelism trained on real ranks with the one loop, its collectives
attributed to layers, and the report against the single process and DTensor (``tp.native.py``).
The model itself is ``playbook.parallel.tp.model``.
"""

from __future__ import annotations


import torch

from playbook.cluster import default_backend, launch
from playbook.model.gpt import GPT
from playbook.theory.inventory.inventory import RECOMPUTE_MODES
from playbook.parallel.registry import register
from playbook.parallel.report import RunReport, compare
from playbook.parallel.training import TrainResult, TrainSetup, train
from playbook.theory.tp.layout import check_tp
from playbook.theory.tp.comm import step_collectives, summarize
from playbook.theory.tp.tp import tp_training_memory
from playbook.parallel.grads import shard_dims
from playbook.parallel.tp.model import TPGPT, sync_replicated_grads, unshard
from playbook.parallel.mixed import PRECISIONS, check_precision, optimizer_for, to_mixed
from playbook.parallel.parity import against_single, single_in


# ---- training on real ranks ---------------------------------------------------------------------
def train_loop(model, setup: TrainSetup, device, *, after_backward=None, **hooks) -> TrainResult:
    """``parallel.training.train`` on a model built elsewhere, every tensor-parallel rank seeing the
    whole global batch; ``after_backward`` is its ``sync_grads`` (kept for the chapter's calls)."""
    return train(setup, model=model, device=device, sync_grads=after_backward, **hooks)


_OP = {
    "all_gather_single": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
}


def measured_collectives(spans, step: int = 0) -> list[dict]:
    """The collectives of training step ``step`` on one rank, each attributed to the labelled
    ``tp:<region>:<phase>`` span it ran in: ``[{region, phase, op, bytes, sent_bytes}, ...]`` in order.
    ``spans``: a tracer's spans, or the dicts of ``Ranks.last_trace`` for one rank."""
    spans = [s if isinstance(s, dict) else s.as_dict() for s in spans]
    window = next(s for s in spans if s["kind"] == "compute" and s["name"] == f"step {step}")
    labels = [s for s in spans if s["kind"] == "compute" and s["name"].startswith("tp:")]
    out = []
    for c in spans:
        if c["kind"] != "comm" or not window["start"] <= c["start"] <= window["end"]:
            continue
        inside = [s for s in labels if s["start"] <= c["start"] and c["end"] <= s["end"]]
        _, region, phase = max(inside, key=lambda s: s["start"])["name"].split(":") if inside else ("", "?", "?")
        out.append(
            {
                "region": region,
                "phase": phase,
                "op": _OP.get(c["name"], c["name"]),
                "bytes": c["bytes"],
                "sent_bytes": c["sent_bytes"],
            }
        )
    return out


def tp_group(ctx):
    """The chapter's layout: every rank on one tensor-parallel axis."""
    from playbook.dims import ParallelDims

    return ctx.mesh_for(ParallelDims(tp=ctx.world_size)).group("tp")


def train_tp(
    ctx,
    setup: TrainSetup,
    *,
    sequence_parallel: bool = False,
    regather: bool = False,
    recompute: str = "none",
    precision: str = "fp32",
):
    """Rank function: build this rank's shard from the reference GPT, train, and return
    (TrainResult of this rank's slices, shard dims, the collectives of step 0). ``precision="mixed"``:
    the shard in bf16, AdamW on fp32 masters (``parallel.mixed``)."""
    group = tp_group(ctx)
    model = TPGPT(
        GPT(setup.config(), seed=setup.seed).to(ctx.device),
        group,
        sequence_parallel=sequence_parallel,
        regather=regather,
        recompute=recompute,
    )
    if precision == "mixed":
        to_mixed(model)
    sync = (lambda m: sync_replicated_grads(m, group)) if sequence_parallel else None
    optimizer = optimizer_for(model, setup, precision)
    result = train_loop(model, setup, ctx.device, after_backward=sync, optimizer=optimizer, progress=ctx.progress)
    return result, shard_dims(model), measured_collectives(ctx.tracer.spans)


def gather_result(per_rank) -> TrainResult:
    """One TrainResult with full tensors from the ranks' (result, dims, ...) answers; rank 0's memory."""
    results, dims = [r[0] for r in per_rank], per_rank[0][1]
    return TrainResult(
        results[0].losses,
        unshard([r.grads for r in results], dims),
        unshard([r.params for r in results], dims),
        results[0].memory,
    )


def on_rank(
    ctx,
    setup: TrainSetup,
    *,
    sequence_parallel: bool = False,
    native: bool = False,
    regather: bool = False,
    recompute: str = "none",
    precision: str = "fp32",
):
    """Rank function of ``playbook run tp``: ours, and (``native``) DTensor's on the same setup."""
    ours = train_tp(
        ctx, setup, sequence_parallel=sequence_parallel, regather=regather, recompute=recompute, precision=precision
    )
    if not native:
        return ours, None
    from playbook.parallel.tp.native import train_dtensor

    return ours, train_dtensor(ctx, setup, sequence_parallel=sequence_parallel)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--sequence-parallel", action="store_true", help="sequence parallelism (Korthikanti et al. 2022)"
    )
    parser.add_argument(
        "--regather",
        action="store_true",
        help="with --sequence-parallel: save sequence shards, all-gather again in backward (Megatron-LM)",
    )
    parser.add_argument(
        "--recompute",
        default="none",
        choices=list(RECOMPUTE_MODES),
        help="activation recomputation: selective (attention core) or full (each block)",
    )
    parser.add_argument("--no-native", dest="native", action="store_false", help="skip the DTensor counterpart")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="mixed: bf16 shards and gradients, fp32 master + AdamW (the DTensor counterpart stays fp32: not run)",
    )


def predict(
    setup: TrainSetup,
    *,
    world_size: int,
    sequence_parallel: bool = False,
    regather: bool = False,
    recompute: str = "none",
    precision: str = "fp32",
) -> dict[str, float]:
    """Bytes one rank sends per step by collective: ``theory.tp.comm.step_collectives``, every rank
    on the whole global batch, summed by op."""
    collectives = step_collectives(
        setup.config(),
        seq_len=setup.seq_len,
        micro_batch=setup.global_batch,
        tp=world_size,
        sequence_parallel=sequence_parallel,
        regather=regather,
        recompute=recompute,
        dtype_bytes=2 if precision == "mixed" else 4,
    )
    return {op[0]: v["sent_bytes"] for op, v in summarize(collectives, by=("op",)).items()}


@register(
    "tp",
    help="Megatron tensor parallelism (+ --sequence-parallel), from scratch and with DTensor",
    arguments=add_arguments,
    on_rank=on_rank,
    predict=predict,
)
def run_tp(
    setup: TrainSetup,
    *,
    world_size: int,
    backend: str = "auto",
    launch=launch,
    sequence_parallel: bool = False,
    regather: bool = False,
    recompute: str = "none",
    native: bool = True,
    precision: str = "fp32",
) -> RunReport:
    """t = world_size tensor-parallel ranks on the whole global batch, against the single process
    (in mixed precision for ``precision="mixed"``, where the DTensor counterpart is not run)."""
    check_precision(precision)
    native = native and precision == "fp32"
    cfg = setup.config()
    check_tp(cfg, world_size, seq_len=setup.seq_len, sequence_parallel=sequence_parallel, regather=regather)
    backend = default_backend(world_size) if backend == "auto" else backend
    # what the ranks run and what predict counts: one set of options for both
    options = dict(sequence_parallel=sequence_parallel, regather=regather, recompute=recompute, precision=precision)
    answers = launch(on_rank, world_size, setup, native=native, backend=backend, **options)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like one rank: several threads on a busy 2-core machine run 10-30x slower
    try:
        reference = single_in(setup, precision)
    finally:
        torch.set_num_threads(threads)
    ours = gather_result([a[0] for a in answers])
    sizes = dict(
        seq_len=setup.seq_len,
        micro_batch=setup.global_batch,
        tp=world_size,
        sequence_parallel=sequence_parallel,
        regather=regather,
        recompute=recompute,
    )
    measured = summarize(answers[0][0][2], by=("op",))
    return RunReport(
        strategy=("tp+sp" + ("+regather" if regather else "")) if sequence_parallel else "tp",
        world_size=world_size,
        backend=backend,
        parity=against_single(ours, setup, precision, reference),
        native=compare(answers[0][1], reference, "DTensor parallelize_module, same global batch") if native else None,
        memory={
            "predicted": tp_training_memory(
                cfg, **sizes, precision=precision, n_tensors=cfg.num_param_tensors()
            ).as_dict(),
            "measured": {k: ours.memory[k] for k in ("params", "grads", "optimizer", "activations")},
        },
        comm={
            "predicted": predict(setup, world_size=world_size, **options),
            "measured": {op[0]: v["sent_bytes"] for op, v in measured.items()},
        },
        setup={
            **setup.as_dict(),
            "sequence_parallel": sequence_parallel,
            "regather": regather,
            "recompute": recompute,
            **({"precision": precision} if precision != "fp32" else {}),
        },
        losses=ours.losses,
    )
