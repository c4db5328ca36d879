"""Exercise 2 — ZeRO-1: the optimizer step with sharded optimizer states.

Every rank holds all P parameters (flat) and its own gradients of them. ZeRO stage 1 (Rajbhandari
et al. 2020, arXiv:1910.02054, §5.1) keeps the optimizer state of only 1/n of the parameters on
each rank, so the step is: reduce-scatter the gradients (rank r receives the sum of shard r,
elements ``[r·P/n, (r+1)·P/n)``) and average them, update that shard of the parameters with
``update(param_shard, grad_shard)``, all-gather the updated shards so every rank holds all P again.
Bytes per rank: P·4·(n−1)/n for each collective, the same as one all-reduce.

Write ``zero1_step(params, grads, update, group)``, in place on ``params``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from playbook.exercises._common import Verdict, close, collective_diff, max_err, run_checked, shared_ranks, traced_call
from playbook.cluster.trace.spans import op_family
from playbook.theory.cost.comm import sent_bytes

NAME = "ZeRO-1: reduce-scatter, update the local shard, all-gather"
P = 48  # parameters; divisible by 2 and 4 ranks
LR = 0.1


def solution(params: torch.Tensor, grads: torch.Tensor, update, group) -> None:
    """The reference answer."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    k = params.numel() // n  # this rank's shard: elements [r*k, (r+1)*k)
    grad_shard = torch.empty(k)  # [P/n]
    dist.reduce_scatter_single(grad_shard, grads, group=group)  # the SUM of shard r over ranks
    grad_shard.div_(n)  # -> the mean
    mine = params[r * k : (r + 1) * k]  # [P/n], a view: updated in place
    update(mine, grad_shard)
    dist.all_gather_single(params, mine.clone(), group=group)  # [P] on every rank again


def _grads_of(rank: int) -> torch.Tensor:
    return torch.randn(P, generator=torch.Generator().manual_seed(100 + rank))  # [P]


def _on_rank(ctx, learner):
    n = ctx.world_size
    params0 = torch.randn(P, generator=torch.Generator().manual_seed(0))  # [P], the same on every rank
    params, grads = params0.clone(), _grads_of(ctx.rank)
    sizes: list[int] = []

    def update(param_shard, grad_shard):  # SGD; its state (none here, Adam's m and v) would be per shard
        sizes.append(param_shard.numel())
        param_shard.sub_(LR * grad_shard)

    _, calls = traced_call(ctx, learner, params, grads, update, ctx.group)
    mean = torch.stack([_grads_of(r) for r in range(n)]).mean(0)  # [P], on one process
    return {
        "got": params.numpy(),
        "start": params0.numpy(),
        "mean": mean.numpy(),
        "local": grads.numpy(),
        "sizes": sizes,
        "calls": calls,
    }


def _region_problem(got, start, mean, local, s: int, r: int, n: int, k: int) -> str:
    part = slice(s * k, (s + 1) * k)
    span = f"elements [{s * k}:{(s + 1) * k}) (shard {s})"
    if close(got[part], start[part]):
        if s == r:
            return f"{span} still hold the old parameters: this rank's own shard was never updated"
        return (
            f"{span} still hold the old parameters: only the rank's own shard was updated — the all-gather is missing"
        )
    if close(got[part], start[part] - LR * n * mean[part]):
        return f"{span} moved {n}× too far: the reduce-scatter gives the SUM of the gradients; divide by {n} — no averaging"
    if close(got[part], start[part] - LR * local[part]):
        return f"{span} were updated with this rank's own gradient: the gradients were never reduced"
    for a in range(n):
        for b in range(n):
            guess = start[a * k : (a + 1) * k] - LR * mean[b * k : (b + 1) * k]
            if (a, b) != (s, s) and close(got[part], guess):
                return (
                    f"{span} hold shard {a}'s parameters updated with shard {b}'s gradient — wrong shard offset: "
                    f"rank r owns elements [r·{k}, (r+1)·{k}) of the parameters and of the reduce-scatter output"
                )
    return ""


def diagnose(results: list[dict]) -> Verdict:
    n = len(results)
    k = P // n
    problems, worst = [], 0.0
    for r, res in enumerate(results):
        got, start, mean, local = res["got"], res["start"], res["mean"], res["local"]
        ref = start - LR * mean
        worst = max(worst, max_err(got, ref))
        if any(size != k for size in res["sizes"]) or not res["sizes"]:
            problems.append(
                f"update() was given {res['sizes'] or 'nothing'} element(s) on rank {r}; each rank updates only its "
                f"own shard of P/n = {P}/{n} = {k} elements, once (that is what shards the optimizer state)"
            )
        for s in range(n):
            part = slice(s * k, (s + 1) * k)
            if close(got[part], ref[part]):
                continue
            what = _region_problem(got, start, mean, local, s, r, n, k)
            if not what:
                what = f"elements [{s * k}:{(s + 1) * k}) differ from one process's step by up to {max_err(got[part], ref[part]):.3g}"
            problems.append(f"on rank {r}, {what}")
    calls = results[0]["calls"]
    comm = collective_diff(calls, [("reduce_scatter", 4 * P), ("all_gather", 4 * P)], op_family)
    numbers = {
        "shard per rank (elements)": k,
        "bytes sent per rank, measured": sum(c[2] for c in calls),
        "bytes sent per rank, predicted": sent_bytes("reduce_scatter", 4 * P, n) + sent_bytes("all_gather", 4 * P, n),
        "max |error| vs one process": worst,
    }
    if problems or comm:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        message = "; ".join(filter(None, [problems[0] + more if problems else "", comm]))
        return Verdict(NAME, False, message, numbers)
    return Verdict(NAME, True, f"all {P} parameters on all {n} ranks equal one process's SGD step", numbers)


def check(fn, ranks=None) -> Verdict:
    """Run ``fn(params, grads, update, group)`` on real ranks and say what is wrong."""
    ranks = shared_ranks(ranks)
    results, failure = run_checked(ranks, _on_rank, fn)
    if failure:
        return Verdict(NAME, False, failure)
    return diagnose(results)
