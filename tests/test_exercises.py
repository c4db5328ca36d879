"""Exercises: each checker passes the reference solution and names realistic wrong answers.

The wrong answers are the mistakes learners make (a missing 1/N, a bucket left out, ...); each
test asserts on the part of the message that tells the learner what to fix. Checks run on the
session's real ranks and must answer within 10 s, hangs included.
"""

import time

import torch
import torch.distributed as dist

from playbook import exercises
from playbook.exercises import NotYetWritten

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
    return exercises.tp.f(torch.nn.functional.gelu(x @ a) @ b, group, "mlp")


def tp_no_g(x, w1, w2, group):
    a, b = _tp_pieces(x, w1, w2, group)
    return torch.nn.functional.gelu(exercises.tp.f(x, group, "mlp") @ a) @ b


def tp_no_f(x, w1, w2, group):
    a, b = _tp_pieces(x, w1, w2, group)
    return exercises.tp.g(torch.nn.functional.gelu(x @ a) @ b, group, "mlp")


def tp_wrong_split_dim(x, w1, w2, group):
    t, r = dist.get_world_size(group), dist.get_rank(group)
    x = exercises.tp.f(x, group, "mlp")
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


# ---- 4. pipelines (through the simulator) -----------------------------------------------------
def pp_warmup_off_by_one(rank, p, m):
    warm = min(p - rank, m)  # p − r, one too many
    order = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", i) for i in range(m - warm, m)]


def pp_backward_reversed(rank, p, m):
    warm = min(p - rank - 1, m)
    order = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", i) for i in reversed(range(m - warm, m))]  # last in, first out


def pp_no_cooldown(rank, p, m):
    warm = min(p - rank - 1, m)
    order = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order


def pp_blank(rank, p, m):
    raise NotYetWritten("one_f_one_b")


def test_pp_solution_passes_with_simulated_bubble():
    v = exercises.pp.check(exercises.pp.solution)
    assert v.ok, v
    for p, m in exercises.pp.CASES:
        assert abs(v.numbers[f"p={p} m={m} bubble (idle/total), simulated"] - (p - 1) / (m + p - 1)) < 1e-12
        assert v.numbers[f"p={p} m={m} peak micro-batches held per rank"] == [min(p - r, m) for r in range(p)]


def test_pp_wrong_answers_are_named():
    v = exercises.pp.check(pp_warmup_off_by_one)
    assert not v.ok and "rank 0 runs 5 forward(s) before its first backward" in v.message, v
    assert "1F1B runs min(p−r, m) = 4 there" in v.message and "warm-up off by one, too many" in v.message, v
    v = exercises.pp.check(pp_backward_reversed)
    assert not v.ok and "backwards go in the order of the forwards" in v.message, v
    assert "rank 0 runs the backward of micro-batch 5 before micro-batch 4" in v.message, v
    v = exercises.pp.check(pp_no_cooldown)
    assert not v.ok and "rank 0 never runs the backward of micro-batch(es) [3, 4, 5]" in v.message, v
    assert "the cool-down is missing" in v.message, v
    v = exercises.pp.check(pp_blank)
    assert not v.ok and v.message.startswith("not yet written"), v


def pp_warmup_too_short(rank, p, m):
    return exercises.pp.solution(rank + 1, p, m) if rank < p - 1 else exercises.pp.solution(rank, p, m)


def test_pp_a_warmup_too_short_is_named():
    v = exercises.pp.check(pp_warmup_too_short)  # rank r uses rank r+1's list: one forward too few
    assert not v.ok and "rank 0 runs 3 forward(s) before its first backward" in v.message, v
    assert "warm-up off by one, too few" in v.message, v


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


# ---- 7. hybrid mesh ---------------------------------------------------------------------------
def mesh_dp_fastest(dims, axis):
    order = ["dp", "cp", "tp", "pp"]  # dp fastest: the wrong order
    sizes = {a: getattr(dims, a) for a in order}
    stride = 1
    for a in order[: order.index(axis)]:
        stride *= sizes[a]
    return [[r + i * stride for i in range(sizes[axis])] for r in range(dims.world) if (r // stride) % sizes[axis] == 0]


def mesh_consecutive(dims, axis):
    k = getattr(dims, axis)
    return [list(range(s, s + k)) for s in range(0, dims.world, k)]  # stride 1 for every axis


def mesh_forgets_last(dims, axis):
    return exercises.mesh.solution(dims, axis)[:-1] if getattr(dims, axis) > 1 else exercises.mesh.solution(dims, axis)


def test_mesh_solution_passes():
    v = exercises.mesh.check(exercises.mesh.solution)
    assert v.ok, v


def test_mesh_wrong_answers_are_named():
    v = exercises.mesh.check(mesh_dp_fastest)
    assert not v.ok and "your tp groups are this layout's dp groups" in v.message, v
    assert "ranks go tp fastest" in v.message, v
    v = exercises.mesh.check(mesh_consecutive)
    assert not v.ok and "dp2×tp2×pp2 (8 ranks), axis dp: your dp groups are this layout's tp groups" in v.message, v
    assert "the ranks of one dp group are tp·cp apart: [[0, 2], [1, 3], [4, 6], [5, 7]]" in v.message, v
    v = exercises.mesh.check(mesh_forgets_last)
    assert not v.ok and "every rank must be in exactly one tp group; yours leave out [6, 7]" in v.message, v


# ---- 8. serving -------------------------------------------------------------------------------
def serve_no_factor_two(cfg, hw, context, tp):
    per_token = cfg.n_layers * (cfg.kv_heads // tp) * cfg.dim_head * 2  # the keys only
    budget = 0.9 * hw.memory_bytes - 2 * cfg.num_params() / tp
    return per_token, int(budget // (16 * per_token)) // -(-context // 16)


def serve_query_heads(cfg, hw, context, tp):
    per_token = 2 * cfg.n_layers * (cfg.n_heads // tp) * cfg.dim_head * 2  # MHA's heads, not GQA's
    budget = 0.9 * hw.memory_bytes - 2 * cfg.num_params() / tp
    return per_token, int(budget // (16 * per_token)) // -(-context // 16)


def serve_all_memory(cfg, hw, context, tp):
    per_token = 2 * cfg.n_layers * (cfg.kv_heads // tp) * cfg.dim_head * 2
    budget = hw.memory_bytes - 2 * cfg.num_params() / tp  # no gpu_memory_utilization
    return per_token, int(budget // (16 * per_token)) // -(-context // 16)


def serve_weights_forgotten(cfg, hw, context, tp):
    per_token = 2 * cfg.n_layers * (cfg.kv_heads // tp) * cfg.dim_head * 2
    return per_token, int(0.9 * hw.memory_bytes // (16 * per_token)) // -(-context // 16)


def test_serving_solution_passes_with_a_measured_block():
    v = exercises.serving.check(exercises.serving.solution)
    assert v.ok, v
    case = "llama-3.1-8b on h100-sxm, context 8192, tp=1"
    assert v.numbers[f"{case}: KV bytes/token, measured on a real bf16 block"] == 2 * 32 * 8 * 128 * 2
    case = "llama-3.1-70b on h100-sxm, context 32768, tp=4"  # 80 layers, 8 KV heads split over 4 GPUs
    assert v.numbers[f"{case}: KV bytes/token, measured on a real bf16 block"] == 2 * 80 * 2 * 128 * 2


def test_serving_wrong_answers_are_named():
    v = exercises.serving.check(serve_no_factor_two)
    assert not v.ok and "is half the right value" in v.message and "a key AND a value" in v.message, v
    assert "a real cache block measures 131,072" in v.message, v
    v = exercises.serving.check(serve_query_heads)
    assert not v.ok and "4× too large" in v.message and "8 KV heads, not its 32 query heads" in v.message, v
    v = exercises.serving.check(serve_all_memory)
    # (80e9 − 2·8,030,261,248) B // 2 MiB blocks = 30,489 blocks; // 512 per sequence = 59 (0.9·80e9: 52)
    assert not v.ok and "your max_seqs is 59, predicted 52" in v.message and "keeps 10% back" in v.message, v
    v = exercises.serving.check(serve_weights_forgotten)
    assert not v.ok and "subtract them before filling it with cache" in v.message, v
