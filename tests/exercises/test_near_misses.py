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
