"""Issue 31: a checker is only as good as the wrong answers it rejects. Near-misses, each one line
away from the solution: right on rank 0 and wrong on rank 1, 0.4% off (bf16 buckets), off by one,
and a right output whose weight gradients are wrong."""

from __future__ import annotations

import torch
import torch.distributed as dist

from playbook import exercises
from playbook.parallel.comm import f, g


def dp_right_on_rank0_only(buckets, group):
    n = dist.get_world_size(group)
    works = [dist.all_reduce(b, group=group, async_op=True) for b in buckets]
    for b, work in zip(buckets, works):
        work.wait()
        if dist.get_rank(group) == 0:  # rank 1 keeps the sum
            b.div_(n)


def dp_buckets_in_bf16(buckets, group):
    n = dist.get_world_size(group)
    for b in buckets:
        low = b.to(torch.bfloat16)  # ~0.4% rounding on every element
        dist.all_reduce(low, group=group)
        b.copy_(low.float() / n)


def test_dp_rejects_an_answer_wrong_on_one_rank_only(ranks2):
    v = exercises.dp.check(dp_right_on_rank0_only, ranks=ranks2)
    assert not v.ok and "rank 1" in v.message, v


def test_dp_rejects_buckets_reduced_in_bf16(ranks2):
    v = exercises.dp.check(dp_buckets_in_bf16, ranks=ranks2)
    assert not v.ok, v


def tp_detached_slices(x, w1, w2, group):
    t, r = dist.get_world_size(group), dist.get_rank(group)
    k = w1.shape[1] // t
    x = f(x, group, "mlp")
    h = torch.nn.functional.gelu(x @ w1[:, r * k : (r + 1) * k].detach())  # right output, no w1 gradient
    return g(h @ w2[r * k : (r + 1) * k, :].detach(), group, "mlp")


def test_tp_rejects_a_right_output_with_detached_weight_shards(ranks2):
    v = exercises.tp.check(tp_detached_slices, ranks=ranks2)
    assert not v.ok, v


def _serving_off_by(delta):
    def answer(cfg, hw, context, tp):
        per_token, seqs = exercises.serving.solution(cfg, hw, context, tp)
        return per_token, seqs + delta

    return answer


def test_serving_rejects_max_seqs_off_by_one():
    for delta in (1, -1):
        v = exercises.serving.check(_serving_off_by(delta))
        assert not v.ok and "max_seqs" in v.message, v


# ---- issue 48, near-miss 12: the context-parallel merge, a hundred times closer than a wrong formula
def cp_weights_in_bf16(o1, lse1, o2, lse2):
    lse = torch.logaddexp(lse1, lse2)  # exact
    w1, w2 = torch.exp(lse1 - lse).bfloat16().float(), torch.exp(lse2 - lse).bfloat16().float()  # 2^-8 rounding
    return w1[:, None] * o1 + w2[:, None] * o2, lse


def cp_lse_in_fp16(o1, lse1, o2, lse2):
    o, lse = exercises.cp.solution(o1, lse1, o2, lse2)  # exact
    return o, lse.half().float()  # 2^-11 relative rounding


def test_cp_rejects_weights_rounded_to_bf16(ranks2):
    """bf16 keeps 8 bits of the weights, so o is off by up to ~2^-8·|o| (~1e-3 relative): outside
    the 1e-4 the checker allows, inside a tolerance 100× looser."""
    v = exercises.cp.check(cp_weights_in_bf16, ranks=ranks2)
    assert not v.ok and "o differs from one process" in v.message, v


def test_cp_rejects_an_lse_rounded_to_fp16(ranks2):
    """fp16 keeps 11 bits: the lse is off by up to 2^-11·|lse| (~4e-4 relative): outside 1e-5,
    inside a tolerance 100× looser; o itself is exact."""
    v = exercises.cp.check(cp_lse_in_fp16, ranks=ranks2)
    assert not v.ok and "lse differs from one process" in v.message, v
