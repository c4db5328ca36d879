"""``playbook run dp``: data parallelism (``parallel.dp.ddp``) on real ranks, on the one training loop.

Each rank trains ``GPT(cfg, seed)`` on its rows of every global batch with ``training.train``; the
variant plugs in as hooks: the micro-batches of a step and their forward and backward
(``forward_backward``), then the all-reduce of every gradient or the wait for the buckets
(``sync_grads``). The report puts the run beside the single process and beside DDP (parity), and
its bytes and calls per step beside ``theory.dp.dp`` (Li et al. 2020, arXiv:2006.15704). One rank's
training is ``parallel.dp.train``; scaling over 1, 2, 4 ranks, ``parallel.dp.scaling``.
"""

from __future__ import annotations

from playbook.cluster import default_backend, launch
from playbook.cluster.trace.spans import measured_comm
from playbook.parallel.dp.ddp import VARIANTS, micro_batch
from playbook.parallel.dp.train import DPResult, median_after_first, train_dp
from playbook.parallel.mixed import PRECISIONS, check_precision
from playbook.parallel.registry import register
from playbook.parallel.report import RunReport, compare
from playbook.parallel.training import TrainSetup
from playbook.parallel.parity import against_single
from playbook.theory.dp.buckets import bucket_cap_bytes
from playbook.theory.dp.dp import predicted_comm
from playbook.theory.hybrid.memory import training_memory

DEFAULT_BUCKET_MB = 0.1  # MiB: four buckets for gpt-tiny (DDP's default, 25 MiB, would make one)


def on_rank(
    ctx,
    setup: TrainSetup,
    *,
    variant: str = "bucketed",
    bucket_mb: float = DEFAULT_BUCKET_MB,
    accumulate: int = 1,
    precision: str = "fp32",
) -> DPResult:
    """The rank function: ``ranks(n).run(on_rank, setup, variant="bucketed")``, over ``ctx.mesh``'s dp group."""
    return train_dp(
        setup,
        variant=variant,
        group=ctx.mesh.group("dp"),
        device=ctx.device,
        cap_bytes=bucket_cap_bytes(bucket_mb),
        accumulate=accumulate,
        tracer=ctx.tracer,
        progress=ctx.progress,
        precision=precision,
    )


# ---- parity -----------------------------------------------------------------------------------
parity = compare  # loss, gradients, parameters (worst element and relative L2): see report.compare


# ---- `playbook run dp` -------------------------------------------------------------------------
def with_ddp_on_rank(ctx, setup: TrainSetup, *, variant: str, bucket_mb: float, accumulate: int, precision="fp32"):
    """Our variant, then DDP on the same ranks and data (once, if the variant is DDP)."""
    options = dict(bucket_mb=bucket_mb, accumulate=accumulate, precision=precision)
    ours = on_rank(ctx, setup, variant=variant, **options)
    return ours, (ours if variant == "ddp" else on_rank(ctx, setup, variant="ddp", **options))


def add_arguments(parser) -> None:
    parser.add_argument("--variant", choices=VARIANTS, default="bucketed")
    parser.add_argument(
        "--bucket-mb", type=float, default=DEFAULT_BUCKET_MB, help="bucket cap in MiB, as DDP's bucket_cap_mb"
    )
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step, reduced once (no_sync)")
    parser.add_argument(
        "--precision", choices=PRECISIONS, default="fp32", help="mixed: bf16 model and gradients, fp32 master + AdamW"
    )


def predict(
    setup: TrainSetup,
    *,
    world_size: int,
    variant: str = "bucketed",
    bucket_mb: float = DEFAULT_BUCKET_MB,
    precision="fp32",
) -> dict[str, float]:
    """Bytes one rank sends per step (``theory.dp.dp.predicted_comm``), gradients of ``precision``'s width."""
    cap, element = bucket_cap_bytes(bucket_mb), 2 if precision == "mixed" else 4
    return predicted_comm(setup, world_size=world_size, variant=variant, cap_bytes=cap, element_bytes=element)


@register(
    "dp",
    help="data parallel: naive, bucketed with overlap, or DDP; --accumulate K micro-batches",
    arguments=add_arguments,
    on_rank=on_rank,
    predict=predict,
)
def run_dp(
    setup: TrainSetup,
    *,
    world_size: int,
    backend: str = "auto",
    launch=launch,
    variant: str = "bucketed",
    bucket_mb: float = DEFAULT_BUCKET_MB,
    accumulate: int = 1,
    precision: str = "fp32",
) -> RunReport:
    if variant not in VARIANTS:
        raise ValueError(f"--variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    check_precision(precision)
    micro = micro_batch(setup, world_size, accumulate)
    backend = default_backend(world_size) if backend == "auto" else backend
    ours, ddp = launch(
        with_ddp_on_rank,
        world_size,
        setup,
        variant=variant,
        bucket_mb=bucket_mb,
        accumulate=accumulate,
        precision=precision,
        backend=backend,
    )[0]
    cfg = setup.config()
    predicted = training_memory(
        cfg, seq_len=setup.seq_len, micro_batch=micro, precision=precision, n_tensors=cfg.num_param_tensors()
    ).as_dict()
    grad_bytes = 2 if precision == "mixed" else 4
    predicted["comm_buffers"] = grad_bytes * cfg.num_params() if variant == "bucketed" else None
    step = lambda r: median_after_first(r.step_seconds)  # noqa: E731
    native = None
    if variant != "ddp":
        native = {
            **parity(ours, ddp, "DistributedDataParallel, same ranks and data"),
            "step_seconds": step(ddp),
            "step_time_ratio": step(ours) / step(ddp),
        }
    return RunReport(
        strategy="dp",
        world_size=world_size,
        backend=backend,
        parity=against_single(ours, setup, precision),
        native=native,
        memory={"predicted": predicted, "measured": ours.memory},
        comm={
            "predicted": predict(
                setup, world_size=world_size, variant=variant, bucket_mb=bucket_mb, precision=precision
            ),
            "measured": measured_comm(ours, setup.steps),
        },
        setup={
            **setup.as_dict(),
            "variant": variant,
            "bucket_mb": bucket_mb,
            "accumulate": accumulate,
            "precision": precision,
            "micro_batch": micro,
            "step_seconds": step(ours),
            "buckets": ours.buckets,
        },
        losses=ours.losses,
    )
