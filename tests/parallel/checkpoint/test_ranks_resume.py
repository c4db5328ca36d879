"""Resume after a failed call from a notebook's ``Ranks``: a call whose rank 1 dies (``os._exit``, as a
lost node) after step 3 fails with a ``RankError`` naming it; the next call restarts the set, resumes
from the last checkpoint (step 2) and ends with the parameters of a run that never failed, bit for bit."""

import os

import pytest
import torch

from playbook.cluster import RankError
from playbook.dims import ParallelDims
from playbook.parallel.checkpoint import CheckpointPlan
from playbook.parallel.hybrid.merge import merge
from playbook.parallel.hybrid.parallelize import train_hybrid
from playbook.parallel.training import TrainSetup
from playbook.theory.hybrid.plan import Plan

SETUP, PLAN = TrainSetup(steps=5), Plan(ParallelDims(dp=2), zero=2)


def dies_after(ctx, setup, plan, ck, step):
    """``train_hybrid``, but rank 1's process ends once ``step`` steps are done."""
    from playbook.parallel.checkpoint import session

    if ctx.rank == 1:
        wrap = session.Session.after_step

        def after_step(self, progress):
            inner = wrap(self, progress)

            def hook(done, total):
                inner(done, total)
                if done == step:
                    os._exit(3)

            return hook

        session.Session.after_step = after_step
    return train_hybrid(ctx, setup, plan, checkpoint=ck)


def test_a_failed_call_resumes_from_the_last_checkpoint(ranks2, tmp_path):
    ck = CheckpointPlan(save=str(tmp_path), every=2, resume=None)
    with pytest.raises(RankError, match="rank 1"):
        ranks2.run(dies_after, SETUP, PLAN, ck, 3)
    resumed = ranks2.run(
        train_hybrid, SETUP, PLAN, checkpoint=CheckpointPlan(save=str(tmp_path), every=2, resume=str(tmp_path))
    )
    assert resumed[0]["checkpoint"]["start"] == 2
    never = merge(ranks2.run(train_hybrid, SETUP, PLAN), 1)
    got = merge(resumed, 1)
    assert resumed[0]["checkpoint"]["losses"] == never.losses
    for k, v in never.params.items():
        assert torch.equal(got.params[k], v), k
