"""Exercise 3 — tensor parallelism: a column-parallel then a row-parallel linear, with f and g.

Megatron-LM's MLP (Shoeybi et al. 2019, arXiv:1909.08053, §3): ``y = gelu(x·W1)·W2`` with W1
split by columns (its output dim: each rank computes F/t of the hidden units, and GELU applies to
each unit alone) and W2 split by rows (its input dim: each rank's product is a partial sum of y).
Two conjugate operators make it exact forward and backward:

    f = identity forward, all-reduce backward   (before the column-parallel linear)
    g = all-reduce forward, identity backward   (after the row-parallel linear)

Write ``tp_mlp(x, w1, w2, group)`` with ``f(x, group, label)`` and ``g(x, group, label)`` (from
``playbook.parallel.tp.model``, re-exported here); ``w1`` [H, F] and ``w2``
[F, H] are the full weights (the same on every rank): slice your shard. One all-reduce of [B, H]
forward, one backward, each 2·B·H·4·(t−1)/t bytes per rank.
"""

from __future__ import annotations

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
from playbook.parallel.comm import f, g  # f(x, group, label), g(x, group, label): Megatron's pair
from playbook.theory.cost.comm import sent_bytes

NAME = "tensor parallel: column- and row-parallel linear with f and g"
B, H, F = 4, 8, 16  # rows, model width, hidden width (F divisible by 2 and 4 ranks)


def solution(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, group) -> torch.Tensor:
    """The reference answer."""
    t, r = dist.get_world_size(group), dist.get_rank(group)
    k = w1.shape[1] // t  # hidden units per rank
    x = f(x, group, "mlp")  # [B, H], identity forward
    h = torch.nn.functional.gelu(x @ w1[:, r * k : (r + 1) * k])  # column-parallel: [B, F/t]
    y = h @ w2[r * k : (r + 1) * k, :]  # row-parallel: [B, H], a partial sum
    return g(y, group, "mlp")  # [B, H], the sum over ranks


def _inputs():
    gen = torch.Generator().manual_seed(3)
    x, w1, w2, dy = (torch.randn(*s, generator=gen) for s in [(B, H), (H, F), (F, H), (B, H)])
    return [t.requires_grad_(i < 3) for i, t in enumerate((x, w1, w2, dy))]


def _on_rank(ctx, learner):
    t, r = ctx.world_size, ctx.rank
    k = F // t
    x, w1, w2, dy = _inputs()
    ref = torch.nn.functional.gelu(x @ w1) @ w2  # [B, H], one process
    ref.backward(dy)
    refs = {"y": ref.detach(), "x.grad": x.grad.clone(), "w1.grad": w1.grad.clone(), "w2.grad": w2.grad.clone()}
    cols, rows = torch.zeros(H, F), torch.zeros(F, H)
    cols[:, r * k : (r + 1) * k], rows[r * k : (r + 1) * k, :] = 1, 1
    refs["w1.grad"], refs["w2.grad"] = refs["w1.grad"] * cols, refs["w2.grad"] * rows  # this rank's shard only
    with torch.no_grad():  # the partial product of this rank, from x (missing g) and from t·x (f and g swapped)
        partial = torch.nn.functional.gelu(x @ w1[:, r * k : (r + 1) * k]) @ w2[r * k : (r + 1) * k, :]
        swapped = torch.nn.functional.gelu(t * x @ w1[:, r * k : (r + 1) * k]) @ w2[r * k : (r + 1) * k, :]
    for p in (x, w1, w2):
        p.grad = None
    y, forward = traced_call(ctx, learner, x, w1, w2, ctx.group)
    _, backward = traced_call(ctx, lambda: y.backward(dy))
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in (x, w1, w2)]
    got = dict(zip(refs, [y.detach(), *grads]))
    return {
        "got": {k_: v.numpy() for k_, v in got.items()},
        "ref": {k_: v.numpy() for k_, v in refs.items()},
        "partial": partial.numpy(),
        "swapped": swapped.numpy(),
        "forward": forward,
        "backward": backward,
    }


def diagnose(results: list[dict]) -> Verdict:
    n = len(results)
    S = B * H * 4
    problems, worst = [], 0.0
    y_sum = sum(res["got"]["y"] for res in results)
    dx_sum = sum(res["got"]["x.grad"] for res in results)
    for r, res in enumerate(results):
        got, ref = res["got"], res["ref"]
        for name in ("y", "x.grad", "w1.grad", "w2.grad"):
            worst = max(worst, max_err(got[name], ref[name]))
            if close(got[name], ref[name], 1e-4):
                continue
            if name == "y" and close(got["y"], res["swapped"], 1e-4):
                what = (
                    f"y on rank {r} is this rank's partial output computed from {n}·x: f and g are swapped — "
                    "f (identity forward) goes before the column-parallel linear, g (all-reduce forward) after the row-parallel one"
                )
            elif name == "y" and close(got["y"], res["partial"], 1e-4) and close(y_sum, ref["y"], 1e-4):
                what = (
                    f"y on rank {r} is only this rank's partial sum (summed over ranks it is right): "
                    "the all-reduce g after the row-parallel linear is missing"
                )
            elif name == "x.grad" and close(dx_sum, ref["x.grad"], 1e-4):
                what = (
                    f"x.grad on rank {r} is only this rank's share (summed over ranks it is right): "
                    "f's backward all-reduce is missing — apply f to x before the column-parallel linear"
                )
            else:
                what = f"{name} on rank {r} differs from one process by up to {max_err(got[name], ref[name]):.3g}"
            problems.append(what)
    comm = collective_diff(results[0]["forward"], [("all_reduce", S)], op_family)
    comm_b = collective_diff(results[0]["backward"], [("all_reduce", S)], op_family)
    comm = "; ".join(filter(None, [comm and f"forward: {comm}", comm_b and f"backward: {comm_b}"]))
    calls = results[0]["forward"] + results[0]["backward"]
    numbers = {
        "all_reduce calls forward + backward": sum(op_family(c[0]) == "all_reduce" for c in calls),
        "bytes sent per rank, measured": sum(c[2] for c in calls),
        "bytes sent per rank, predicted": 2 * sent_bytes("all_reduce", S, n),
        "max |error| vs one process": worst,
    }
    if problems or comm:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        message = "; ".join(filter(None, [problems[0] + more if problems else "", comm]))
        return Verdict(NAME, False, message, numbers)
    return Verdict(
        NAME, True, f"y, x.grad and each rank's w1/w2 gradient shards match one process on all {n} ranks", numbers
    )


def check(fn, ranks=None) -> Verdict:
    """Run ``fn(x, w1, w2, group)`` on real ranks, forward and backward, and say what is wrong."""
    ranks = shared_ranks(ranks)
    results, failure = run_checked(ranks, _on_rank, fn)
    if failure:
        if "cannot be multiplied" in failure or "size of tensor" in failure:
            failure += (
                " — a split along the wrong dim? column-parallel splits w1's output dim (w1[:, cols]), "
                "row-parallel splits w2's input dim (w2[rows, :])"
            )
        return Verdict(NAME, False, failure)
    return diagnose(results)
