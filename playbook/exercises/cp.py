"""Exercise 5 — context parallelism: merge two attention blocks with their log-sum-exp.

Ring attention (Liu et al. 2023, arXiv:2310.01889) and FlashAttention's online softmax (Dao et al.
2022, arXiv:2205.14135, §3.1) compute attention over one block of keys at a time. Block i gives,
per query, its normalized output ``o_i`` [T, D] and the log-sum-exp of its scores ``lse_i`` [T].
Two blocks merge exactly:

    lse = log(exp(lse_1) + exp(lse_2)) = m + log(exp(lse_1 − m) + exp(lse_2 − m)),  m = max(lse_1, lse_2)
    o   = exp(lse_1 − lse)·o_1 + exp(lse_2 − lse)·o_2

(the weights are each block's share of the softmax mass). Subtracting m matters: a score of 1e3
makes exp overflow float32 (largest ≈ 3.4e38 = e^88.7).

Write ``merge(o1, lse1, o2, lse2) -> (o, lse)``. ``check`` gives each real rank one block of keys
and values, all-gathers every block's (o, lse), folds them with your ``merge`` and compares with
attention over all keys on one process, once with ordinary scores and once with scores near 1e3.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist

from playbook.exercises._common import Verdict, close, max_err, run_checked, shared_ranks, traced_call

NAME = "context parallel: merge attention blocks with their log-sum-exp"
T, D, KEYS = 8, 4, 4  # queries, head dim, keys per rank
SCALES = {"ordinary scores (|s| < 10)": 1.0, "scores near 1e3": 400.0}


def solution(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor):
    """The reference answer: [T, D], [T] twice -> [T, D], [T]."""
    m = torch.maximum(lse1, lse2)  # [T]
    lse = m + torch.log(torch.exp(lse1 - m) + torch.exp(lse2 - m))  # [T], no exp of a large number
    o = torch.exp(lse1 - lse)[:, None] * o1 + torch.exp(lse2 - lse)[:, None] * o2  # [T, D]
    return o, lse


def _block(q, k, v):
    s = q @ k.T / math.sqrt(D)  # [T, keys]
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1), s.abs().max().item()  # [T, D], [T]


def _on_rank(ctx, learner):
    n, r = ctx.world_size, ctx.rank
    out = {}
    for case, scale in SCALES.items():
        gen = torch.Generator().manual_seed(5)
        q = torch.randn(T, D, generator=gen) * scale  # [T, D]
        k, v = torch.randn(n * KEYS, D, generator=gen), torch.randn(n * KEYS, D, generator=gen)  # [n*keys, D]
        ref_o, ref_lse, biggest = _block(q, k, v)  # all keys, one process
        mine = slice(r * KEYS, (r + 1) * KEYS)
        o, lse, _ = _block(q, k[mine], v[mine])
        os, lses = torch.empty(n * T, D), torch.empty(n * T)  # every rank's block, stacked
        dist.all_gather_single(os, o.contiguous(), group=ctx.group)
        dist.all_gather_single(lses, lse.contiguous(), group=ctx.group)
        os, lses = os.view(n, T, D), lses.view(n, T)
        acc_o, acc_lse = os[0], lses[0]
        for i in range(1, n):
            (acc_o, acc_lse), _ = traced_call(ctx, learner, acc_o, acc_lse, os[i], lses[i])
        out[case] = {
            "o": np.asarray(acc_o.detach(), dtype=np.float64),
            "lse": np.asarray(acc_lse.detach(), dtype=np.float64),
            "ref_o": ref_o.numpy(),
            "ref_lse": ref_lse.numpy(),
            "equal": os.mean(0).numpy(),
            "lse_max": lses.max(0).values.numpy(),
            "biggest": biggest,
        }
    return out


def diagnose(results: list[dict]) -> Verdict:
    numbers = {}
    for case in SCALES:
        for r, res in enumerate(results):
            c = res[case]
            where = f"on rank {r}, with {case} (largest |score| {c['biggest']:.0f})"
            for name in ("lse", "o"):
                bad = ~np.isfinite(c[name])
                if bad.any():
                    rows = sorted({int(i) for i in np.argwhere(bad)[:, 0]})
                    return Verdict(
                        NAME,
                        False,
                        f"{where}, your {name} is inf/NaN at query row(s) {rows[:4]}: exp of a score near 1e3 "
                        "overflows float32 (largest e^88.7) — subtract the max lse before exp (or use torch.logaddexp)",
                    )
            if not close(c["lse"], c["ref_lse"], 1e-5):
                hint = (
                    ": it is the largest block's lse, not the log-sum-exp — add log(exp(lse_1 − m) + exp(lse_2 − m))"
                    if close(c["lse"], c["lse_max"], 1e-6)
                    else ""
                )
                return Verdict(
                    NAME,
                    False,
                    f"{where}, lse differs from one process by up to {max_err(c['lse'], c['ref_lse']):.3g}{hint}",
                )
            if not close(c["o"], c["ref_o"], 1e-4):
                hint = ": you averaged the blocks with equal weights" if close(c["o"], c["equal"], 1e-5) else ""
                row = int(np.argmax(np.abs(c["o"] - c["ref_o"]).max(1)))
                return Verdict(
                    NAME,
                    False,
                    f"{where}, o differs from one process by up to {max_err(c['o'], c['ref_o']):.3g} (query row {row}){hint}"
                    " — block i's weight is exp(lse_i − lse), its share of the softmax mass",
                )
            numbers[f"max |error| in o, {case}"] = max(
                numbers.get(f"max |error| in o, {case}", 0.0), max_err(c["o"], c["ref_o"])
            )
    n = len(results)
    return Verdict(NAME, True, f"{n} blocks merged on {n} ranks equal attention over all keys, at both scales", numbers)


def check(fn, ranks=None) -> Verdict:
    """Fold every rank's block with ``fn(o1, lse1, o2, lse2)`` on real ranks and compare."""
    ranks = shared_ranks(ranks)
    results, failure = run_checked(ranks, _on_rank, fn)
    if failure:
        return Verdict(NAME, False, failure)
    return diagnose(results)
