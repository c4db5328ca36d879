"""Exercises: each checker passes the reference solution and names realistic wrong answers.

These run on real ranks (data, ZeRO-1, tensor, context and expert parallelism); the simulator and
arithmetic ones are in test_exercises_offline.py. The wrong answers are the mistakes learners make
(a missing 1/N, a bucket left out, ...); each test asserts on the part of the message that tells
the learner what to fix. Checks run on the session's real ranks and must answer within 10 s, hangs
included.
"""

import time

import torch
import torch.distributed as dist

from playbook import exercises
from playbook.exercises import NotYetWritten
from playbook.parallel import comm

FAST = 10.0  # seconds: the budget for one check on 2 cores


def timed_check(module, fn, ranks):
    t0 = time.perf_counter()
    verdict = module.check(fn, ranks=ranks)
    assert time.perf_counter() - t0 < FAST, f"check took {time.perf_counter() - t0:.1f} s"
    return verdict


# ---- 1. data parallel -----------------------------------------------------------------------
def dp_sum_only(buckets, group):
    for b in buckets:
        dist.all_reduce(b, group=group)


def dp_some_buckets(buckets, group):
    n = dist.get_world_size(group)
    for b in buckets[:-1]:
        dist.all_reduce(b, group=group)
        b.div_(n)


def dp_divide_twice(buckets, group):
    n = dist.get_world_size(group)
    for b in buckets:
        b.div_(n)
        dist.all_reduce(b, op=dist.ReduceOp.AVG, group=group)


def dp_only_rank0(buckets, group):
    if dist.get_rank(group) == 0:
        for b in buckets:
            dist.all_reduce(b, group=group)


def dp_blank(buckets, group):
    raise NotYetWritten("average_buckets")


def test_dp_solution_passes_with_measured_bytes(ranks2):
    v = timed_check(exercises.dp, exercises.dp.solution, ranks2)
    assert v.ok, v
    assert v.numbers["bytes sent per rank, measured"] == v.numbers["bytes sent per rank, predicted"] > 0
    assert v.numbers["all_reduce calls (rank 0)"] == v.numbers["buckets"] == 3


def test_dp_wrong_answers_are_named(ranks2):
    v = timed_check(exercises.dp, dp_sum_only, ranks2)
    assert not v.ok and "2× the average" in v.message and "missing 1/N" in v.message, v
    v = timed_check(exercises.dp, dp_some_buckets, ranks2)
    assert not v.ok and "bucket 2 (fc1.bias, fc1.weight) on rank 0" in v.message, v
    assert "never all-reduced" in v.message and "you called all_reduce 2× (656 B, 4096 B); predicted 3×" in v.message, v
    v = timed_check(exercises.dp, dp_divide_twice, ranks2)
    assert not v.ok and "divided twice" in v.message, v


def test_dp_hang_and_blank_are_one_sentence(ranks2):
    v = timed_check(exercises.dp, dp_only_rank0, ranks2)
    assert not v.ok and v.message.startswith("hang: rank 0 waits in all_reduce"), v
    assert "rank 1 already returned" in v.message, v
    v = timed_check(exercises.dp, dp_blank, ranks2)
    assert not v.ok and v.message.startswith("not yet written"), v


# ---- 2. ZeRO-1 --------------------------------------------------------------------------------
def zero_wrong_offset(params, grads, update, group):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    k = params.numel() // n
    g = torch.empty(k)
    dist.reduce_scatter_single(g, grads, group=group)
    g.div_(n)
    mine = params[((r + 1) % n) * k : ((r + 1) % n + 1) * k]  # the neighbour's shard
    update(mine, g)
    dist.all_gather_single(params, mine.clone(), group=group)


def zero_no_all_gather(params, grads, update, group):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    k = params.numel() // n
    g = torch.empty(k)
    dist.reduce_scatter_single(g, grads, group=group)
    update(params[r * k : (r + 1) * k], g.div_(n))


def zero_no_averaging(params, grads, update, group):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    k = params.numel() // n
    g = torch.empty(k)
    dist.reduce_scatter_single(g, grads, group=group)
    mine = params[r * k : (r + 1) * k]
    update(mine, g)
    dist.all_gather_single(params, mine.clone(), group=group)


def zero_all_reduce_whole(params, grads, update, group):
    dist.all_reduce(grads, group=group)
    update(params, grads.div_(dist.get_world_size(group)))


def test_zero_solution_passes_with_measured_bytes(ranks2):
    v = timed_check(exercises.zero, exercises.zero.solution, ranks2)
    assert v.ok, v
    assert v.numbers["bytes sent per rank, measured"] == v.numbers["bytes sent per rank, predicted"] == 2 * 48 * 4 / 2


def test_zero_wrong_answers_are_named(ranks2):
    v = timed_check(exercises.zero, zero_wrong_offset, ranks2)
    assert not v.ok and "wrong shard offset" in v.message, v
    assert "on rank 0, elements [0:24) (shard 0) hold shard 1's parameters updated with shard 0's gradient" in v.message
    v = timed_check(exercises.zero, zero_no_all_gather, ranks2)
    assert not v.ok and "on rank 0, elements [24:48) (shard 1) still hold the old parameters" in v.message, v
    assert "the all-gather is missing" in v.message and "you called all_gather 0×" in v.message, v
    v = timed_check(exercises.zero, zero_no_averaging, ranks2)
    assert not v.ok and "moved 2× too far" in v.message and "no averaging" in v.message, v
    v = timed_check(exercises.zero, zero_all_reduce_whole, ranks2)
    assert not v.ok and "update() was given [48] element(s) on rank 0" in v.message, v
    assert "you called all_reduce 1× (192 B); predicted 0×" in v.message, v


# ---- 3. tensor parallel ---------------------------------------------------------------------
def _tp_pieces(x, w1, w2, group):
    t, r = dist.get_world_size(group), dist.get_rank(group)
    k = w1.shape[1] // t
    return w1[:, r * k : (r + 1) * k], w2[r * k : (r + 1) * k, :]


def tp_swapped(x, w1, w2, group):
    a, b = _tp_pieces(x, w1, w2, group)
    x = exercises.tp.g(x, group, "mlp")
    return comm.f(torch.nn.functional.gelu(x @ a) @ b, group, "mlp")


def tp_no_g(x, w1, w2, group):
    a, b = _tp_pieces(x, w1, w2, group)
    return torch.nn.functional.gelu(comm.f(x, group, "mlp") @ a) @ b


def tp_no_f(x, w1, w2, group):
    a, b = _tp_pieces(x, w1, w2, group)
    return exercises.tp.g(torch.nn.functional.gelu(x @ a) @ b, group, "mlp")


def tp_wrong_split_dim(x, w1, w2, group):
    t, r = dist.get_world_size(group), dist.get_rank(group)
    x = comm.f(x, group, "mlp")
    h = torch.nn.functional.gelu(x @ w1.chunk(t, dim=0)[r])  # rows of w1: the wrong dim
    return exercises.tp.g(h @ w2.chunk(t, dim=1)[r], group, "mlp")


def test_tp_solution_passes_with_measured_bytes(ranks2):
    v = timed_check(exercises.tp, exercises.tp.solution, ranks2)
    assert v.ok, v
    assert v.numbers["bytes sent per rank, measured"] == v.numbers["bytes sent per rank, predicted"] == 2 * 4 * 8 * 4
    assert v.numbers["max |error| vs one process"] < 1e-5


def test_tp_wrong_answers_are_named(ranks2):
    v = timed_check(exercises.tp, tp_swapped, ranks2)
    assert not v.ok and v.message.startswith("y on rank 0") and "f and g are swapped" in v.message, v
    v = timed_check(exercises.tp, tp_no_g, ranks2)
    assert not v.ok and "y on rank 0 is only this rank's partial sum" in v.message, v
    assert "forward: you called all_reduce 0×" in v.message, v
    v = timed_check(exercises.tp, tp_no_f, ranks2)
    assert not v.ok and "x.grad on rank 0 is only this rank's share" in v.message, v
    assert "f's backward all-reduce is missing" in v.message, v
    v = timed_check(exercises.tp, tp_wrong_split_dim, ranks2)
    assert not v.ok and "raised RuntimeError: mat1 and mat2 shapes cannot be multiplied" in v.message, v
    assert "`h = torch.nn.functional.gelu(x @ w1.chunk(t, dim=0)[r])" in v.message, v
    assert "a split along the wrong dim?" in v.message and "Traceback" not in v.message, v


# ---- 5. context parallel ----------------------------------------------------------------------
def cp_no_max(o1, lse1, o2, lse2):
    total = torch.exp(lse1) + torch.exp(lse2)  # overflows at scores near 1e3
    return (torch.exp(lse1)[:, None] * o1 + torch.exp(lse2)[:, None] * o2) / total[:, None], torch.log(total)


def cp_equal_weights(o1, lse1, o2, lse2):
    return (o1 + o2) / 2, torch.logaddexp(lse1, lse2)


def cp_lse_is_max(o1, lse1, o2, lse2):
    lse = torch.maximum(lse1, lse2)
    return torch.exp(lse1 - lse)[:, None] * o1 + torch.exp(lse2 - lse)[:, None] * o2, lse


def cp_weights_unnormalized(o1, lse1, o2, lse2):
    m = torch.maximum(lse1, lse2)
    return torch.exp(lse1 - m)[:, None] * o1 + torch.exp(lse2 - m)[:, None] * o2, torch.logaddexp(lse1, lse2)


def test_cp_solution_passes_at_both_scales(ranks2):
    v = timed_check(exercises.cp, exercises.cp.solution, ranks2)
    assert v.ok, v
    assert all(err < 1e-5 for err in v.numbers.values()), v


def test_cp_wrong_answers_are_named(ranks2):
    v = timed_check(exercises.cp, cp_no_max, ranks2)
    assert not v.ok and "with scores near 1e3" in v.message and "is inf/NaN" in v.message, v
    assert "subtract the max" in v.message, v
    v = timed_check(exercises.cp, cp_equal_weights, ranks2)
    assert (
        not v.ok and "with ordinary scores" in v.message and "you averaged the blocks with equal weights" in v.message
    )
    v = timed_check(exercises.cp, cp_lse_is_max, ranks2)
    assert not v.ok and "lse differs" in v.message and "the largest block's lse" in v.message, v
    v = timed_check(exercises.cp, cp_weights_unnormalized, ranks2)
    assert not v.ok and "o differs from one process" in v.message and "exp(lse_i − lse)" in v.message, v


# ---- 6. expert parallel -----------------------------------------------------------------------
def ep_counts_per_expert(expert_of_token, n_ranks, experts_per_rank):
    order = torch.argsort(expert_of_token, stable=True)
    return order, torch.bincount(expert_of_token, minlength=n_ranks * experts_per_rank)


def ep_unsorted(expert_of_token, n_ranks, experts_per_rank):
    order = torch.arange(len(expert_of_token))  # tokens in their own order: not contiguous per rank
    return order, torch.bincount(expert_of_token // experts_per_rank, minlength=n_ranks)


def ep_no_inverse(y_sorted, order):
    return y_sorted


def ep_permute_again(y_sorted, order):
    return y_sorted[order]


def test_ep_solution_passes_with_measured_bytes(ranks2):
    v = exercises.ep.check(*exercises.ep.solution, ranks=ranks2)
    assert v.ok, v
    measured = v.numbers["all-to-all bytes sent by rank 0, measured"]
    assert measured == v.numbers["all-to-all bytes sent by rank 0, from your counts"] > 0, v


def test_ep_wrong_answers_are_named(ranks2):
    plan, restore = exercises.ep.solution
    v = exercises.ep.check(ep_counts_per_expert, restore, ranks=ranks2)
    assert not v.ok and "send_counts has 4 entries; the all-to-all needs one per rank (2)" in v.message, v
    v = exercises.ep.check(ep_unsorted, restore, ranks=ranks2)
    assert not v.ok and "all_to_all_single sends contiguous pieces, so sort by destination rank" in v.message, v
    v = exercises.ep.check(plan, ep_no_inverse, ranks=ranks2)
    assert not v.ok and "the inverse permutation is missing" in v.message, v
    v = exercises.ep.check(plan, ep_permute_again, ranks=ranks2)
    assert not v.ok and "you applied the permutation again" in v.message, v
