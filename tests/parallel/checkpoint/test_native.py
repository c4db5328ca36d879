"""Our checkpoints and PyTorch's native FSDP2 / DTensor TP run are one format (``checkpoint.native``):
saved by our from-scratch layout after 2 of 4 steps, the native run loads it with DCP's
``set_state_dict`` and continues; saved by the native run, ours loads it and continues. Either way the
whole run's losses and final parameters equal the single process's within the parity gate."""

import dataclasses

from playbook.dims import ParallelDims as D
from playbook.parallel.checkpoint import CheckpointPlan
from playbook.parallel.hybrid.merge import merge
from playbook.parallel.hybrid.native import native_on_rank
from playbook.parallel.hybrid.parallelize import train_hybrid
from playbook.parallel.parity import assert_parity, reference
from playbook.parallel.report import compare
from playbook.parallel.training import TrainResult, TrainSetup
from playbook.theory.hybrid.plan import Plan

SETUP = TrainSetup(steps=4)
FIRST = dataclasses.replace(SETUP, steps=2)


def _gate(result: TrainResult, name: str):
    single = reference(SETUP)
    # the gradients of the run's first step belong to the part that saved: compare losses and parameters
    assert len(result.losses) == SETUP.steps
    assert_parity(
        compare(TrainResult(result.losses, {}, result.params), TrainResult(single.losses, {}, single.params)),
        SETUP,
        name,
    )


def test_ours_zero3_saved_loads_into_native_fsdp2(ranks2, tmp_path):
    ranks2.run(train_hybrid, FIRST, Plan(D(dp=2), zero=3), checkpoint=CheckpointPlan(save=str(tmp_path)))
    out = ranks2.run(native_on_rank, SETUP, dims=D(dp=2), resume=str(tmp_path))
    _gate(out[0], "ours dp2 z3 -> native FSDP2 dp2")


def test_native_dtensor_tp_saved_loads_into_ours_zero1(ranks2, tmp_path):
    ranks2.run(native_on_rank, FIRST, dims=D(tp=2), save=str(tmp_path))
    out = ranks2.run(train_hybrid, SETUP, Plan(D(dp=2), zero=1), checkpoint=CheckpointPlan(resume=str(tmp_path)))
    ck = out[0]["checkpoint"]
    assert ck["start"] == 2
    whole = merge(out, 1)
    _gate(TrainResult(ck["losses"], {}, whole.params), "native DTensor TP tp2 -> ours dp2 z1")
