"""Exercise 1 — data parallelism: average the gradient buckets across ranks.

Each rank ran backward on its own slice of the batch; its gradients are packed into flat buckets
(``playbook.theory.dp.buckets.bucket_plan``, as DDP packs them). Write ``average_buckets(buckets,
group)``: start one asynchronous all-reduce per bucket (what DDP's hook does the moment a bucket
is full), then wait for each and divide by the world size, in place. With equal slices and a mean
loss, the average is the gradient of the whole batch (Li et al. 2020, arXiv:2006.15704, §3.2).

``check(fn)`` runs ``fn`` on real ranks, compares every bucket on every rank with the gradient of
the whole batch computed on one process, and counts the all-reduces against the plan.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
import torch.distributed as dist

from playbook.exercises._common import (
    Verdict,
    close,
    collective_diff,
    max_err,
    run_checked,
    shared_ranks,
    traced_call,
)
from playbook.cluster.trace.spans import op_family
from playbook.theory.dp.buckets import bucket_plan
from playbook.theory.cost.comm import sent_bytes

NAME = "data parallel: average the gradient buckets"
ROWS = 8  # global batch; 2 or 4 ranks take equal slices
CAP_BYTES = 600  # gives three buckets for the model below


def solution(buckets: list[torch.Tensor], group) -> None:
    """The reference answer: async all-reduce per bucket, then wait and divide by n."""
    n = dist.get_world_size(group)
    works = [dist.all_reduce(b, group=group, async_op=True) for b in buckets]  # each [bucket numel]
    for b, work in zip(buckets, works):
        work.wait()
        b.div_(n)  # the sum over ranks -> the mean


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    layers = OrderedDict(fc1=torch.nn.Linear(16, 32), act=torch.nn.GELU(), fc2=torch.nn.Linear(32, 32))
    layers["head"] = torch.nn.Linear(32, 4)
    return torch.nn.Sequential(layers)  # [rows, 16] -> [rows, 4]


def _packed(model, plan) -> list[torch.Tensor]:
    params = dict(model.named_parameters())
    return [torch.cat([params[n].grad.reshape(-1) for n in b.names]) for b in plan]  # [bucket numel] each


def _on_rank(ctx, learner):
    n, r = ctx.world_size, ctx.rank
    model = _model()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(ROWS, 16, generator=g), torch.randn(ROWS, 4, generator=g)  # [rows, 16], [rows, 4]
    plan = bucket_plan([(k, p.numel()) for k, p in model.named_parameters()], CAP_BYTES)
    torch.nn.functional.mse_loss(model(x), y).backward()  # the whole batch on one process
    reference = _packed(model, plan)
    model.zero_grad()
    rows = slice(r * ROWS // n, (r + 1) * ROWS // n)
    torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()  # this rank's slice
    buckets = _packed(model, plan)
    local = [b.clone() for b in buckets]
    returned, calls = traced_call(ctx, learner, buckets, ctx.group)
    if isinstance(returned, (list, tuple)) and len(returned) == len(buckets):
        buckets = list(returned)
    return {
        "got": [b.detach().numpy() for b in buckets],
        "local": [b.numpy() for b in local],
        "reference": [b.numpy() for b in reference],
        "plan": [(b.names, b.numels) for b in plan],
        "calls": calls,
    }


def _where(plan_entry, i: int) -> str:
    names, numels = plan_entry
    for name, k in zip(names, numels):
        if i < k:
            return f"{name}[{i}]"
        i -= k
    return f"element {i}"


def _bucket_problem(got, ref, local, n) -> str:
    if close(got, ref):
        return ""
    if close(got, ref * n):
        return f"is {n}× the average: all-reduce gives the SUM over ranks; divide by the world size ({n}) — missing 1/N"
    if close(got, ref / n):
        return f"is the average divided by {n} again ({n}× too small): you divided twice (AVG, or a SUM divided twice)"
    if close(got, local):
        return "still holds this rank's own gradient: this bucket was never all-reduced"
    if close(got, local / n):
        return f"is this rank's own gradient divided by {n}: divided, but never all-reduced"
    return ""


def diagnose(results: list[dict]) -> Verdict:
    """Compare what each rank's buckets hold with the whole-batch gradient; count the all-reduces."""
    n = len(results)
    plan = results[0]["plan"]
    sizes = [4 * sum(numels) for _, numels in plan]
    predicted = [("all_reduce", s) for s in sizes]
    problems, worst = [], 0.0
    for r, res in enumerate(results):
        for b, (got, ref, local) in enumerate(zip(res["got"], res["reference"], res["local"])):
            worst = max(worst, max_err(got, ref))
            if close(got, ref):
                continue
            what = _bucket_problem(got, ref, local, n)
            label = f"bucket {b} ({', '.join(plan[b][0])}) on rank {r}"
            if not what:
                i = int(np.argmax(np.abs(got - ref)))
                what = f"differs from the average gradient by up to {max_err(got, ref):.3g} (at {_where(plan[b], i)})"
            problems.append(f"{label} {what}")
    calls = results[0]["calls"]
    comm = collective_diff(calls, predicted, op_family)
    numbers = {
        "buckets": len(plan),
        "all_reduce calls (rank 0)": sum(op_family(c[0]) == "all_reduce" for c in calls),
        "bytes sent per rank, measured": sum(c[2] for c in calls),
        "bytes sent per rank, predicted": sum(sent_bytes("all_reduce", s, n) for s in sizes),
        "max |error| vs one process": worst,
    }
    if problems or comm:
        more = f" (and {len(problems) - 1} more bucket(s)/rank(s) wrong)" if len(problems) > 1 else ""
        message = "; ".join(filter(None, [problems[0] + more if problems else "", comm]))
        return Verdict(NAME, False, message, numbers)
    return Verdict(NAME, True, f"every bucket on all {n} ranks equals the whole-batch gradient", numbers)


def check(fn, ranks=None) -> Verdict:
    """Run ``fn(buckets, group)`` on real ranks and say what is wrong, in the learner's terms."""
    ranks = shared_ranks(ranks)
    results, failure = run_checked(ranks, _on_rank, fn)
    if failure:
        return Verdict(NAME, False, failure)
    return diagnose(results)
