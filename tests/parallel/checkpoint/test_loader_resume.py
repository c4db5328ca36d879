"""The data loader's position in the checkpoint: a run whose batches come from a real DataLoader
(``--loader-workers 1``), saved after step 2 and resumed, equals the run that never stopped, bit for
bit; every rank's loader row is in the checkpoint (next step 2, one worker), and the resumed loader's
worker starts at step 2, so the first batch the step asks for is the one in flight (no reposition)."""

import dataclasses

import torch

from playbook.dims import ParallelDims
from playbook.parallel.checkpoint import CheckpointPlan
from playbook.parallel.hybrid.conditions import Conditions
from playbook.parallel.hybrid.merge import merge
from playbook.parallel.hybrid.parallelize import train_hybrid
from playbook.parallel.training import TrainSetup
from playbook.theory.hybrid.plan import Plan

SETUP, PLAN, LOADER = TrainSetup(steps=4), Plan(ParallelDims(dp=2), zero=1), Conditions(loader_workers=1)


def test_a_loader_run_saved_and_resumed_equals_the_uninterrupted_one(ranks2, tmp_path):
    never = merge(ranks2.run(train_hybrid, SETUP, PLAN, LOADER), 1)
    first = dataclasses.replace(SETUP, steps=2)
    ranks2.run(train_hybrid, first, PLAN, LOADER, checkpoint=CheckpointPlan(save=str(tmp_path)))
    out = ranks2.run(train_hybrid, SETUP, PLAN, LOADER, checkpoint=CheckpointPlan(resume=str(tmp_path)))
    for answer in out:
        ck = answer["checkpoint"]
        load = next(x for x in ck["log"] if x["what"] == "load")
        assert load["loader"] == [2, 1, 0]  # what the saving rank's loader had: next step 2, 1 worker
        assert ck["loader"]["next_step"] == SETUP.steps and ck["loader"]["repositions"] == 0
    got = merge(out, 1)
    assert out[0]["checkpoint"]["losses"] == never.losses
    for name, p in never.params.items():
        assert torch.equal(got.params[name], p), name
