"""Exercise 6 — expert parallelism: the permutation and the send counts for the all-to-all.

With E experts over n ranks (expert e lives on rank e // (E/n)), each token goes to the rank of its
expert and comes back (GShard, Lepikhin et al. 2020, arXiv:2006.16668, §3.2; Switch Transformer,
Fedus et al. 2021, arXiv:2101.03961). ``all_to_all_single`` sends contiguous pieces, so a rank first
**permutes** its tokens so that those for rank 0 come first, then rank 1's, ... and tells the
collective how many go to each rank (**send counts**). When the outputs come back, in that same
sorted order, the **inverse permutation** puts them back in token order.

Write ``plan(expert_of_token, n_ranks, experts_per_rank) -> (order, send_counts)`` (``order`` a
permutation of the token indices, ``send_counts`` one count per rank) and ``restore(y_sorted,
order) -> y`` (token order again). ``check(plan, restore)`` dispatches real tokens over real ranks
with your plan, applies each expert there, sends them back and restores them with your function.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from playbook.exercises._common import NotYetWritten, Verdict, close, max_err, run_checked, shared_ranks, traced_call

NAME = "expert parallel: permutation and send counts for the all-to-all"
TOKENS, D, EXPERTS_PER_RANK = 12, 3, 2


def solution_plan(expert_of_token: torch.Tensor, n_ranks: int, experts_per_rank: int):
    """The reference plan: a stable sort by expert (so by destination rank), and tokens per rank."""
    order = torch.argsort(expert_of_token, stable=True)  # [T]: token indices, grouped by destination
    send_counts = torch.bincount(expert_of_token // experts_per_rank, minlength=n_ranks)  # [n_ranks]
    return order, send_counts


def solution_restore(y_sorted: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """The reference inverse: row i of ``y_sorted`` belongs to token ``order[i]``."""
    y = torch.empty_like(y_sorted)  # [T, D]
    y[order] = y_sorted
    return y


solution = (solution_plan, solution_restore)


def _experts_of(rank: int, n: int) -> torch.Tensor:
    return torch.randint(0, n * EXPERTS_PER_RANK, (TOKENS,), generator=torch.Generator().manual_seed(60 + rank))


def _expert(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    return x * (1 + e[:, None]) + e[:, None]  # a different function per expert: [T, D]


def _check_plan(plan, n: int) -> str:
    """Call the learner's plan for every rank's tokens here, before any rank sends a byte: a bad
    count would make the all-to-all fail or hang on the other ranks."""
    for r in range(n):
        experts = _experts_of(r, n)
        dest = (experts // EXPERTS_PER_RANK).tolist()
        want = np.bincount(dest, minlength=n).tolist()
        order, counts = plan(experts.clone(), n, EXPERTS_PER_RANK)
        order, counts = torch.as_tensor(order).tolist(), torch.as_tensor(counts).tolist()
        if sorted(order) != list(range(TOKENS)):
            return f"on rank {r}, order is not a permutation of the {TOKENS} token indices: {order}"
        if len(counts) != n:
            return (
                f"on rank {r}, send_counts has {len(counts)} entries; the all-to-all needs one per rank ({n}): "
                f"count tokens per destination rank, expert // experts_per_rank (yours look like counts per expert)"
            )
        if counts != want:
            return (
                f"on rank {r}, send_counts is {counts}; the tokens per destination rank are {want} "
                f"(expert e lives on rank e // {EXPERTS_PER_RANK}), summing to the rank's {TOKENS} tokens"
            )
        placed = [dest[t] for t in order]
        if placed != sorted(placed):
            i = next(i for i in range(TOKENS - 1) if placed[i] > placed[i + 1])
            return (
                f"on rank {r}, order puts token {order[i]} (for rank {placed[i]}) before token {order[i + 1]} "
                f"(for rank {placed[i + 1]}): all_to_all_single sends contiguous pieces, so sort by destination rank"
            )
    return ""


def _on_rank(ctx, plan, restore):
    n, r = ctx.world_size, ctx.rank
    experts = _experts_of(r, n)  # [T]
    x = torch.randn(TOKENS, D, generator=torch.Generator().manual_seed(r))  # [T, D]
    (order, counts), _ = traced_call(ctx, plan, experts.clone(), n, EXPERTS_PER_RANK)
    order, send = torch.as_tensor(order), torch.as_tensor(counts).tolist()
    recv_counts = torch.empty(n, dtype=torch.long)
    dist.all_to_all_single(recv_counts, torch.tensor(send), group=ctx.group)  # how many come from each rank
    recv = recv_counts.tolist()
    payload = torch.cat([x, experts[:, None].float()], 1)[order]  # [T, D+1], sorted by destination
    got = torch.empty(sum(recv), D + 1)
    dist.all_to_all_single(got, payload, recv, send, group=ctx.group)  # tokens at their experts' rank
    y_here = _expert(got[:, :D], got[:, D])  # [received, D]
    back = torch.empty(TOKENS, D)
    dist.all_to_all_single(back, y_here.contiguous(), send, recv, group=ctx.group)  # home, still sorted
    y, _ = traced_call(ctx, restore, back, order)
    return {
        "y": np.asarray(y.detach(), dtype=np.float64),
        "ref": _expert(x, experts.float()).numpy(),
        "order": order.numpy(),
        "sent": sum(c for j, c in enumerate(send) if j != r),
        "received": sum(c for j, c in enumerate(recv) if j != r),
    }


def diagnose(results: list[dict], spans: list[dict]) -> Verdict:
    worst = 0.0
    for r, res in enumerate(results):
        y, ref, order = res["y"], res["ref"], res["order"]
        worst = max(worst, max_err(y, ref) if y.shape == ref.shape else float("inf"))
        if close(y, ref):
            continue
        if close(y, ref[order]):
            return Verdict(
                NAME,
                False,
                f"on rank {r}, the outputs are still in sorted (per-expert) order: restore must undo the permutation "
                "— the inverse permutation is missing (y[order] = y_sorted)",
            )
        if close(y, ref[order][order]):
            return Verdict(
                NAME,
                False,
                f"on rank {r}, you applied the permutation again (y_sorted[order]) instead of its inverse: "
                "row i of y_sorted is token order[i], so y[order] = y_sorted (or y_sorted[argsort(order)])",
            )
        return Verdict(
            NAME, False, f"on rank {r}, the restored outputs differ from one process by up to {max_err(y, ref):.3g}"
        )
    data = [s for s in spans if s["rank"] == 0 and s["kind"] == "comm"][1:]  # the first exchanges the counts
    numbers = {
        "tokens sent to other ranks (rank 0)": results[0]["sent"],
        "all-to-all bytes sent by rank 0, measured": sum(s["sent_bytes"] for s in data),
        "all-to-all bytes sent by rank 0, from your counts": 4
        * ((D + 1) * results[0]["sent"] + D * results[0]["received"]),
        "max |error| vs one process": worst,
    }
    n = len(results)
    return Verdict(
        NAME, True, f"every token on {n} ranks went to its expert's rank and came back to its place", numbers
    )


def check(plan, restore, ranks=None) -> Verdict:
    """Dispatch and combine real tokens on real ranks with ``plan`` and ``restore``."""
    ranks = shared_ranks(ranks)
    try:
        problem = _check_plan(plan, ranks.world_size)
    except NotYetWritten:
        return Verdict(NAME, False, "not yet written — fill in the cell above, then run the check again")
    except Exception as e:  # noqa: BLE001 - the learner's error, in one line
        return Verdict(NAME, False, f"plan(...) raised {type(e).__name__}: {e}")
    if problem:
        return Verdict(NAME, False, problem)
    results, failure = run_checked(ranks, _on_rank, plan, restore)
    if failure:
        return Verdict(NAME, False, failure)
    return diagnose(results, ranks.last_trace)
