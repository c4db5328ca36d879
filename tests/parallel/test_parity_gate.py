"""The parity gate (``playbook.parallel.parity``): bounds that follow this machine's float32, and
still catch real bugs by a wide margin on any machine."""

import pytest
import torch
import torch.distributed as dist

from playbook.model.gpt import GPT
from playbook.parallel.parity import MARGIN, PARAM_MARGIN, RELATIVE, bounds, bounds_from, float_floor, gated, reference
from playbook.parallel.report import GATED, RunReport, compare, failures
from playbook.parallel.training import TrainSetup, train

SETUP = TrainSetup()  # gpt-tiny, 3 AdamW steps, global batch 8, sequence 32: the hybrid's setup
WIDE = 10  # a bug must sit this many bounds away, so that no CPU's rounding can hide it


def test_the_bound_is_1e5_or_three_floors_ten_for_parameters_whichever_is_larger():
    small = {"max_abs_loss_diff": 1e-7, "max_rel_grad_diff": 1e-8, "max_rel_l2_param_diff": 5e-7, "loss_scale": 4.0}
    assert bounds_from(small) == {"max_abs_loss_diff": 4e-5, "max_rel_grad_diff": 1e-5, "max_rel_l2_param_diff": 1e-5}
    large = small | {"max_abs_loss_diff": 2e-5, "max_rel_grad_diff": 7e-6, "max_rel_l2_param_diff": 3e-5}
    got = bounds_from(large)
    assert got == pytest.approx({"max_abs_loss_diff": 6e-5, "max_rel_grad_diff": 2.1e-5, "max_rel_l2_param_diff": 3e-4})


def test_the_floor_is_measured_here_and_the_bounds_follow_it():
    floor = float_floor(SETUP)
    assert floor["finite"] and 0 < floor["max_rel_l2_param_diff"]  # float32 is never exact after AdamW
    for k in GATED:
        margin = PARAM_MARGIN if "param" in k else MARGIN
        assert bounds(SETUP)[k] == max(RELATIVE * (floor["loss_scale"] if "loss" in k else 1), margin * floor[k])


def test_a_correct_rerun_passes_and_a_nan_fails():
    again = train(SETUP)
    assert failures(compare(again, reference(SETUP)), bounds(SETUP)) == []
    nan = dict.fromkeys(GATED, float("nan"))
    assert len(failures(nan, bounds(SETUP))) == 3


def test_a_three_per_mille_learning_rate_error_is_far_outside_the_bound():
    """lr 0.3% too large: after 3 AdamW steps (steps of ~lr whatever the gradient's size) every
    parameter tensor is off by ~0.3% of its update. The gate must see it with a wide margin."""
    wrong = train(TrainSetup(lr=SETUP.lr * 1.003))
    parity = compare(wrong, reference(SETUP))
    limit = bounds(SETUP)["max_rel_l2_param_diff"]
    assert any(line.startswith("max_rel_l2_param_diff") for line in failures(parity, bounds(SETUP)))
    assert parity["max_rel_l2_param_diff"] > WIDE * limit, (parity, limit)


def _dp_missing_one_reduction(ctx, setup, skipped):
    """Data parallelism whose gradient all-reduce forgets one tensor (``skipped``)."""

    def sync(model):
        for name, p in model.named_parameters():
            if name != skipped:
                dist.all_reduce(p.grad, group=ctx.group)
                p.grad /= ctx.world_size

    def loss(local):
        total = local.clone()
        dist.all_reduce(total, group=ctx.group)
        return total / ctx.world_size

    return train(setup, rank=ctx.rank, world_size=ctx.world_size, sync_grads=sync, sync_loss=loss, measure=False)


def test_one_missing_gradient_reduction_is_far_outside_the_bound(ranks2):
    results = ranks2.run(_dp_missing_one_reduction, SETUP, "blocks.0.mlp.down_proj.weight", progress=False)
    limits = bounds(SETUP)
    for r in results:
        parity = compare(r, reference(SETUP))
        assert {line.split(" =")[0] for line in failures(parity, limits)} >= {"max_rel_grad_diff"}
        assert parity["max_rel_grad_diff"] > WIDE * limits["max_rel_grad_diff"], parity


def test_a_run_report_outside_its_bounds_is_a_parity_failure():
    parity = gated(compare(train(TrainSetup(lr=SETUP.lr * 1.003)), reference(SETUP)), SETUP)
    assert parity["within_bounds"] is False
    report = RunReport("x", 1, "gloo", parity, losses=[1.0])
    assert "outside the float32 bounds" in report.problem() and "max_rel_l2_param_diff" in report.problem()
    assert "PARITY FAILED" in report.summary() and "bounds, max(1e-5, 3 x" in report.summary()
    fine = gated(compare(train(SETUP), reference(SETUP)), SETUP)
    assert fine["within_bounds"] is True and RunReport("x", 1, "gloo", fine).problem() is None


def test_the_float64_reference_is_the_exact_answer_the_floor_needs():
    exact = reference(SETUP, torch.float64)
    assert all(t.dtype == torch.float64 for t in exact.params.values())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the reference runs: the same sums in the same order
    try:
        again = train(SETUP, model=GPT(SETUP.config(), seed=SETUP.seed).double(), measure=False)  # not the cached one
    finally:
        torch.set_num_threads(threads)
    assert compare(exact, again)["max_rel_l2_param_diff"] == 0.0  # deterministic


def test_the_parameter_and_gradient_errors_are_the_worst_tensor_not_the_mean():
    """Issue 48, near-miss 2: one tensor wrong among many right ones (a single missing reduction)
    must set the figure; a mean over the 10 tensors would report a tenth of it and pass the gate.
    Hand arithmetic: the bad tensor is ``w + 1e-3·w``, so ‖g − w‖/‖w‖ = max|g − w|/max|w| = 1e-3."""
    from playbook.parallel.report import max_rel_diff, rel_l2_diff

    want = {f"t{i}": torch.arange(1.0, 9.0, dtype=torch.float64) * (i + 1) for i in range(10)}
    got = {k: v.clone() for k, v in want.items()}
    got["t7"] = want["t7"] * (1 + 1e-3)
    assert rel_l2_diff(got, want) == pytest.approx(1e-3, rel=1e-9)
    assert max_rel_diff(got, want) == pytest.approx(1e-3, rel=1e-9)
