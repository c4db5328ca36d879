"""Issue 48, near-miss 1: without ZeRO, an expert no token reached must keep no gradient.

The single process's AdamW skips a parameter whose gradient is None: no weight decay, no moments, no
step counted. A zero gradient is not the same: AdamW would decay the weight. With ZeRO, ``Fed``
decides from the routing counts; without it, the gradient's being None is the only signal, so an
expert that runs on an empty batch of rows (a zero gradient) would be decayed on the ranks and left
alone by the single process. Here ep = 1 inside dp2 (every rank holds every expert, the counts are
global) and zero = 0, a layout the ZeRO tests of ``test_hybrid_zero`` do not cover.

Expected values need no reference run: a parameter AdamW never steps is its initial value, bit for bit.
"""

from __future__ import annotations

import torch

from playbook.dims import ParallelDims
from playbook.parallel.training import TrainSetup
from playbook.theory.hybrid.plan import Plan

SILENT = 1  # the expert the router never picks
SETUP = TrainSetup(model="gpt-tiny-moe", global_batch=2, seq_len=8, steps=2)
PLAN = Plan(ParallelDims(dp=2))  # ep = 1, zero = 0


def _train_with_a_silent_expert(ctx, setup, plan, silent):
    """``train_hybrid`` with every router scoring expert ``silent`` 1e4 lower: it never makes the top-k."""
    import playbook.model.gpt as gpt
    from playbook.parallel.hybrid.parallelize import train_hybrid
    from router_bias import biased_router

    with biased_router(gpt, "build_moe", silent, -1e4):
        return train_hybrid(ctx, setup, plan)


def test_an_expert_no_token_reaches_keeps_its_initial_weights_without_zero(ranks2):
    from playbook.model.gpt import build_moe

    PLAN.check(SETUP)
    answers = ranks2.run(_train_with_a_silent_expert, SETUP, PLAN, SILENT)
    initial = dict(build_moe(SETUP.config(), SETUP.seed).named_parameters())
    names = {n for n in initial if f".mlp.experts.{SILENT}." in n}
    assert len(names) == 2 * 3  # gpt-tiny-moe: 2 MoE layers, gate/up/down each
    for a in answers:
        assert all(f["counts"][SILENT] == 0 for step in a["routing"] for f in step), a["rank"]
        result = a["result"]
        assert names.isdisjoint(result.grads), a["rank"]  # None, as in the single process
        for name in names:  # AdamW never stepped it: no weight decay either
            assert torch.equal(result.params[name], initial[name].detach()), (a["rank"], name)
        fed = next(n for n in initial if ".mlp.experts.0." in n)
        assert not torch.equal(result.params[fed], initial[fed].detach())  # the others did train
