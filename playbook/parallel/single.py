"""The reference itself, on one real rank: ``playbook run single``.

It exercises the report's shape end to end: a rank process trains, measures its memory by
category, and sends back loss, gradients and parameters; the parent trains the same setup in its
own process and compares. Parity here is a test of determinism across processes (it should be
exactly zero), and the memory rows compare the exact prediction with the measurement.
"""

from __future__ import annotations

from playbook.cluster import default_backend, launch
from playbook.parallel.registry import register
from playbook.parallel.report import RunReport
from playbook.parallel.training import TrainSetup, train
from playbook.parallel.parity import against_single


def on_rank(ctx, setup: TrainSetup):
    return train(setup, device=ctx.device, progress=ctx.progress)


@register(
    "single",
    help="one rank, no parallelism: the reference every chapter compares against",
    on_rank=on_rank,
)
def run_single(setup: TrainSetup, *, world_size: int = 1, backend: str = "auto", launch=launch) -> RunReport:
    if world_size != 1:
        raise ValueError(f"the single strategy runs on one rank; got --world-size {world_size}, use --world-size 1")
    backend = default_backend(1) if backend == "auto" else backend
    result = launch(on_rank, 1, setup, backend=backend)[0]
    measured = {k: result.memory[k] for k in ("params", "grads", "optimizer", "activations")}
    return RunReport(
        strategy="single",
        world_size=1,
        backend=backend,
        parity=against_single(result, setup),
        memory={"predicted": setup.predicted_memory(1).as_dict(), "measured": measured},
        setup=setup.as_dict(),
        losses=result.losses,
    )
