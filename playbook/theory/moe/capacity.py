"""A mixture of experts' routing arithmetic: the validation of its settings, expert capacity and the
load-balancing loss (Fedus, Zoph & Shazeer 2021, *Switch Transformers*, arXiv:2101.03961, §2.2 and
eq. 4-6), which slots survive a global capacity, the rows each expert-parallel rank receives
(Lepikhin et al. 2020, *GShard*, arXiv:2006.16668), and a stand-in router for the widget.
The lowest layer of ``theory.moe.moe``, which re-exports it. Pure arithmetic, no torch.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from playbook.config import divisors, require_positive


# ---- validation --------------------------------------------------------------------------------
def check_capacity_factor(capacity_factor) -> None:
    """``None`` means no dropping; otherwise a positive number."""
    if capacity_factor is None:
        return
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, (int, float)) or not capacity_factor > 0:
        raise ValueError(
            f"capacity_factor must be > 0 (1.0: each expert takes its even share of tokens; 1.25 is the "
            f"Switch Transformer's choice), or None for no dropping; got {capacity_factor!r}"
        )


def check_routing(n_experts: int, top_k: int) -> None:
    require_positive(n_experts=n_experts, top_k=top_k)
    if top_k > n_experts:
        raise ValueError(
            f"top_k={top_k} exceeds n_experts={n_experts}: a token cannot pick more experts than there are; "
            f"try top_k in 1..{n_experts}"
        )


def check_ep(n_experts: int, ep: int, dp: int | None = None) -> None:
    """ep must divide the experts (every rank holds the same number) and, when given, the dp degree."""
    require_positive(ep=ep)
    if n_experts % ep:
        raise ValueError(
            f"ep={ep} does not divide n_experts={n_experts}: every expert-parallel rank must hold the same "
            f"number of experts; try ep in {{{', '.join(map(str, divisors(n_experts)))}}}"
        )
    if dp is not None and dp % ep:
        good = [d for d in divisors(dp) if n_experts % d == 0]
        raise ValueError(
            f"ep={ep} does not divide dp={dp}: the expert-parallel group is carved out of the data-parallel "
            f"ranks; try ep in {{{', '.join(map(str, good))}}}"
        )


# ---- capacity and the aux loss -----------------------------------------------------------------
def expert_capacity(tokens: int, n_experts: int, top_k: int, capacity_factor: float | None) -> int | None:
    """Slots per expert: ceil(k · T / E · capacity_factor) (Switch §2.2 for k=1; GShard for k=2).

    ``None`` (no capacity factor) means no limit: nothing is dropped."""
    check_capacity_factor(capacity_factor)
    if capacity_factor is None:
        return None
    exact = top_k * tokens * capacity_factor / n_experts
    return max(1, math.ceil(round(exact, 9)))  # round first: 1.1 · 40 must be 44, not 45


def aux_loss_value(counts: list[int], mean_probs: list[float], top_k: int, alpha: float) -> float:
    """The Switch load-balancing loss α · E · Σᵢ fᵢ · Pᵢ (Switch eq. 4), fᵢ = counts/(k·T) the
    fraction of routing slots sent to expert i, Pᵢ the mean router probability of expert i.
    Perfectly uniform routing (fᵢ = Pᵢ = 1/E) gives exactly α."""
    E = len(counts)
    total = sum(counts)
    return alpha * E * sum(c / total * p for c, p in zip(counts, mean_probs))


def kept_counts(counts_by_rank: list[list[int]], capacity: int | None) -> list[list[int]]:
    """Slots each data rank keeps per expert under a global capacity, first come first served in
    global-batch order (rank 0's tokens first): keep = clamp(C − offset, 0, count), offset = the
    slots earlier ranks sent to the same expert."""
    if capacity is None:
        return [list(row) for row in counts_by_rank]
    out, offset = [], [0] * len(counts_by_rank[0])
    for row in counts_by_rank:
        out.append([max(0, min(c, capacity - o)) for c, o in zip(row, offset)])
        offset = [o + c for o, c in zip(offset, row)]
    return out


def rank_rows(counts_by_rank: list[list[int]], capacity: int | None, rank: int, ep: int) -> tuple[int, int]:
    """(S, R) for ``rank``: slots its tokens keep, rows its experts receive (EP groups of ep)."""
    kept = kept_counts(counts_by_rank, capacity)
    E = len(kept[0])
    per, g0, me = E // ep, rank - rank % ep, rank % ep
    S = sum(kept[rank])
    R = sum(kept[s][e] for s in range(g0, g0 + ep) for e in range(me * per, (me + 1) * per))
    return S, R


# ---- a routing model for the widget ------------------------------------------------------------
@dataclass(frozen=True)
class SimulatedRouting:
    counts: list[list[int]]  # [step][expert] slots routed (before drops)
    kept: list[list[int]]  # [step][expert] slots kept
    capacity: int | None
    tokens: int


def simulate_routing(
    *,
    n_experts: int,
    top_k: int,
    tokens: int,
    capacity_factor: float | None,
    skew: float = 0.0,
    steps: int = 10,
    seed: int = 0,
) -> SimulatedRouting:
    """Route ``tokens`` random tokens for ``steps`` steps: router logits ~ N(0, 1) plus a bias of
    ``skew`` · (E−1−i)/(E−1) for expert i (skew 0: even on average; larger: expert 0 popular),
    top-k of the logits, then capacity in token order. A stand-in for a router, for intuition."""
    check_routing(n_experts, top_k)
    check_capacity_factor(capacity_factor)
    require_positive(tokens=tokens, steps=steps)
    rng = random.Random(seed)
    bias = [skew * (n_experts - 1 - i) / max(n_experts - 1, 1) for i in range(n_experts)]
    cap = expert_capacity(tokens, n_experts, top_k, capacity_factor)
    counts, kept = [], []
    for _ in range(steps):
        c, kc = [0] * n_experts, [0] * n_experts
        for _t in range(tokens):
            logits = [rng.gauss(0.0, 1.0) + b for b in bias]
            for e in sorted(range(n_experts), key=lambda i: -logits[i])[:top_k]:
                c[e] += 1
                if cap is None or kc[e] < cap:
                    kc[e] += 1
        counts.append(c)
        kept.append(kc)
    return SimulatedRouting(counts, kept, cap, tokens)


def imbalance(counts: list[int]) -> float:
    """max load / mean load (1.0 = perfectly balanced): the slowest expert sets the step time."""
    mean = sum(counts) / len(counts)
    return max(counts) / mean if mean else 1.0


def load_entropy(counts: list[int]) -> float:
    """Entropy of the load distribution over experts, normalised by log E (1.0 = even)."""
    total = sum(counts)
    if total == 0 or len(counts) < 2:
        return 1.0
    h = -sum(c / total * math.log(c / total) for c in counts if c)
    return h / math.log(len(counts))
