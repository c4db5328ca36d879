"""Clipping by the global gradient norm across the mesh (``parallel.clip``, ``Plan.max_norm``) on real
ranks, against the single process that clips with torch's own ``clip_grad_norm_`` on the same batch.

Each layout holds (``hybrid_matrix.check``) the clipped gradients and the parameters after 3 clipped
AdamW steps to the parity gate, and every byte to its prediction (the norm's all-reduce included);
then the global norm of every step: the same float on every rank, and within max(1e-5, 3 × its own
float floor) of the single process's (the floor: the clipping single process in float32 against
float64, the parity gate's reasoning for one more scalar). ``max_norm`` sits below every step's norm,
so every step clips. Each rule of ``counted_names`` was broken once and turned these red: counting a
tp-replicated parameter on every tp rank (what Megatron's ``param_is_not_tensor_parallel_duplicate``
prevents) failed the five tp layouts, the clipped gradients 9e-5 to 3e-3 relative off against a bound
of 1e-5; counting every data rank's copy failed the four without ZeRO; counting both copies of the
tied embedding failed the tied ZeRO-1 layout (without ZeRO the last stage's copy has another name)."""

from dataclasses import replace

import pytest
import torch
from hybrid_matrix import DENSE, MOE, TIED, check

from playbook.dims import ParallelDims
from playbook.parallel.hybrid import moe as hybrid_moe
from playbook.parallel.parity import reference
from playbook.theory.hybrid.plan import Plan

MAX_NORM = 0.5  # below the norm of every step of these setups (asserted)
EIGHT = [
    # the norms without SP are replicated over tp: counted on tp rank 0 only
    ("dp2×tp2×pp2", DENSE, Plan(ParallelDims(dp=2, tp=2, pp=2))),
    # ZeRO's slices over dp, their norms' elements (SP: summed over tp first) on tp rank 0 only
    ("dp2×tp2×pp2 ZeRO-1 SP", DENSE, Plan(ParallelDims(dp=2, tp=2, pp=2), zero=1, sequence_parallel=True)),
    ("dp2×tp2×pp2 ZeRO-3", DENSE, Plan(ParallelDims(dp=2, tp=2, pp=2), zero=3)),
    # the tied embedding's two copies: the first stage's counts
    ("tied dp2×tp2×pp2", TIED, Plan(ParallelDims(dp=2, tp=2, pp=2))),
    ("tied dp2×tp2×pp2 ZeRO-1", TIED, Plan(ParallelDims(dp=2, tp=2, pp=2), zero=1)),
    # routed experts under tp: replicated over tp, their tokens split
    ("MoE dp2×tp2×pp2", MOE, Plan(ParallelDims(dp=2, tp=2, pp=2))),
]
FOUR = [  # routed experts: ep ranks hold other experts, each on 2 replicas (dp4 / ep2), counted on the first
    ("MoE dp4×ep2", MOE, Plan(ParallelDims(dp=4, ep=2))),
    ("MoE dp4×ep2 ZeRO-2", MOE, Plan(ParallelDims(dp=4, ep=2), zero=2)),
]


def single_norms(setup, plan, dtype):
    """The clipping single process's norm per step in ``dtype``: the one ``check`` compares with (an
    MoE model in m > 1 micro-batches: gradient accumulation over the same micro-batches)."""
    if setup.config().is_moe and plan.m > 1:
        return hybrid_moe._accumulated(setup, plan.dims.dp, plan.m, dtype, MAX_NORM).grad_norms
    return reference(setup, dtype, MAX_NORM).grad_norms


def norm_bound(setup, plan) -> float:
    """max(1e-5, 3 × the float floor of the norm) relative: the clipping single process's float32
    norms against its float64 ones."""
    n32, n64 = single_norms(setup, plan, torch.float32), single_norms(setup, plan, torch.float64)
    return max(1e-5, 3 * max(abs(a - b) / b for a, b in zip(n32, n64)))


@pytest.mark.parametrize("name, setup, plan", EIGHT, ids=[c[0] for c in EIGHT])
def test_global_norm_and_clipped_steps_match_one_process(ranks8, name, setup, plan):
    clips_like_one_process(ranks8, name, setup, plan)


@pytest.mark.parametrize("name, setup, plan", FOUR, ids=[c[0] for c in FOUR])
def test_global_norm_over_expert_replicas(ranks4, name, setup, plan):
    clips_like_one_process(ranks4, name, setup, plan)


def clips_like_one_process(ranks, name, setup, plan):
    plan = replace(plan, max_norm=MAX_NORM)
    answers, _ = check(ranks, setup, plan)  # clipped gradients, parameters after clipped steps, bytes
    one = single_norms(setup, plan, torch.float32)  # torch.nn.utils.clip_grad_norm_'s totals
    assert min(one) > MAX_NORM  # every step clips
    norms = [a["result"].grad_norms for a in answers]
    assert all(n == norms[0] for n in norms), "every rank must scale by the same norm"
    worst = max(abs(a - b) / b for a, b in zip(norms[0], one))
    assert worst <= norm_bound(setup, plan), f"{name}: global norm {norms[0]} vs one process {one}"


def test_max_norm_must_be_positive():
    with pytest.raises(ValueError, match="max_norm must be a positive number"):
        Plan(ParallelDims(dp=2), max_norm=0.0).check(DENSE)
