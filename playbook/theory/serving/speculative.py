"""Speculative decoding, predicted: tokens per verify, the speed-up, and where it stops paying (no torch).

Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative Decoding", ICML, §3): if each
draft token is accepted with probability α, independently, a step with k drafts emits

    E[tokens per verify] = (1 − α^{k+1}) / (1 − α)          (§3.1, eq. 1; k + 1 when α = 1)

tokens (the accepted drafts, then the target's own). A step costs k draft steps and one verify of
k + 1 tokens per sequence, so against plain decoding (one target step per token)

    speed-up = E[tokens per verify] · T_target / (k · T_draft + T_verify(k + 1))

which with T_draft = c · T_target and T_verify = T_target is §3.3's (1 − α^{k+1}) / ((1 − α)(kc + 1)).
That last equality is what speculation bets on: a decode step reads every weight for one token per
sequence (memory-bound, Pope et al. 2022, arXiv:2211.05102, §3.1), so k + 1 tokens per sequence cost
about one. It stops holding as the batch grows: the verify computes B·(k + 1) tokens, and once that
passes the critical batch (``serving.critical_batch``: FLOPs catch up with the weight bytes) the
verify is compute-bound and costs about k + 1 plain steps; the speed-up then falls below 1 (what
users of vLLM report at large batches: vLLM issues #8439, #21278). ``at_scale`` prices all three steps
on ``serving``'s roofline (the verify reads the weights and each sequence's KV once, for its k + 1
queries) and ``crossover_batch`` finds the batch above which speculation loses.

Units: seconds, tokens. Pure arithmetic.
"""

from __future__ import annotations

from playbook.config import ModelConfig, require_positive
from playbook.hardware import Hardware
from playbook.theory.serving.serving import BY_SIZE, Phase, _phase, decode


def expected_tokens(alpha: float, k: int) -> float:
    """Leviathan et al. §3.1: tokens a verify of ``k`` drafts emits when each is accepted with ``alpha``."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha is a probability, got {alpha}")
    if k < 0:
        raise ValueError(f"k={k} draft tokens must be >= 0")
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def speedup(alpha: float, k: int, *, draft_cost: float, verify_cost: float = 1.0) -> float:
    """Tokens per unit of a plain step's time: ``expected_tokens`` ÷ (k·c + v), with ``draft_cost`` c
    and ``verify_cost`` v (the verify of k + 1 tokens) in plain target steps (§3.3: v = 1)."""
    if draft_cost < 0 or verify_cost <= 0:
        raise ValueError(f"draft_cost must be >= 0 and verify_cost > 0, got {draft_cost} and {verify_cost}")
    return expected_tokens(alpha, k) / (k * draft_cost + verify_cost)


def best_k(alpha: float, *, draft_cost: float, k_max: int = 16) -> int:
    """The k in 1..k_max with the largest §3.3 speed-up (verify cost 1)."""
    return max(range(1, k_max + 1), key=lambda k: speedup(alpha, k, draft_cost=draft_cost))


def verify(
    cfg: ModelConfig, hw: Hardware, *, context: int, batch: int, k: int, tp: int = 1, dtype="bf16", **rates
) -> Phase:
    """One verify step on the roofline: ``batch`` sequences with ``context`` tokens cached each check
    k + 1 tokens: FLOPs of batch·(k + 1) tokens, the weights and each sequence's KV read once, TP's
    all-reduces of [batch·(k + 1), hidden] (``serving._phase``, the phase prefill and decode share)."""
    require_positive(context=context, batch=batch)
    tokens = batch * (k + 1)
    return _phase(
        cfg, hw, tokens=tokens, seq_len=context, kv_tokens=batch * context, tp=tp, pp=1, dtype=dtype, **_rates(rates)
    )


def _rates(rates: dict) -> dict:
    return {"mfu": rates.get("mfu", 0.5), "mbu": rates.get("mbu", 0.8), "latency": rates.get("latency", BY_SIZE)}


def at_scale(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    draft: ModelConfig,
    alpha: float,
    k: int,
    batch: int,
    context: int,
    tp: int = 1,
    draft_tp: int | None = None,
    dtype: str = "bf16",
    **rates,
) -> dict:
    """Speculative against plain decoding of ``batch`` sequences at ``context`` on the roofline: the
    plain step, the draft's step (``draft`` on ``draft_tp`` GPUs, default the target's), the verify,
    tokens per verify and the speed-up. All-reduces priced by size (one-shot below a few hundred KB,
    ``serving.allreduce_seconds``) unless ``latency`` says otherwise."""
    r = _rates(rates)
    plain = decode(cfg, hw, context=context, batch=batch, tp=tp, dtype=dtype, **r)
    step = decode(draft, hw, context=context, batch=batch, tp=draft_tp or tp, dtype=dtype, **r)
    check = verify(cfg, hw, context=context, batch=batch, k=k, tp=tp, dtype=dtype, **r)
    tokens = expected_tokens(alpha, k)
    spec = k * step.seconds + check.seconds
    return {
        "batch": batch,
        "k": k,
        "alpha": alpha,
        "plain_step": plain.seconds,
        "draft_step": step.seconds,
        "verify_step": check.seconds,
        "verify_bound": check.bound,
        "draft_cost": step.seconds / plain.seconds,
        "verify_cost": check.seconds / plain.seconds,
        "tokens_per_verify": tokens,
        "speedup": tokens * plain.seconds / spec,
        "tokens_per_s": batch * tokens / spec,
        "plain_tokens_per_s": batch / plain.seconds,
    }


def crossover_batch(cfg: ModelConfig, hw: Hardware, *, batch_max: int = 4096, **options) -> int | None:
    """The smallest batch (a power of two up to ``batch_max``, then refined by bisection) at which
    ``at_scale``'s speed-up falls to 1 or below; None if speculation still pays at ``batch_max``."""
    if at_scale(cfg, hw, batch=1, **options)["speedup"] <= 1:
        return 1
    lo = 1
    while lo < batch_max and at_scale(cfg, hw, batch=min(2 * lo, batch_max), **options)["speedup"] > 1:
        lo = min(2 * lo, batch_max)
    if lo >= batch_max:
        return None
    hi = min(2 * lo, batch_max)  # speed-up > 1 at lo, <= 1 at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at_scale(cfg, hw, batch=mid, **options)["speedup"] > 1 else (lo, mid)
    return hi


def batch_curves(cfg: ModelConfig, hw: Hardware, *, ks, batches, **options) -> tuple[list[dict], dict]:
    """``at_scale`` rows for every k and batch, and each k's ``crossover_batch``: the figure's data."""
    rows = [at_scale(cfg, hw, k=k, batch=b, **options) for k in ks for b in batches]
    return rows, {k: crossover_batch(cfg, hw, k=k, **options) for k in ks}


# ---- checking a sampler ---------------------------------------------------------------------------
def chi_square(counts, probs, *, pool_below: float = 5.0) -> tuple[float, int]:
    """Pearson's statistic of observed ``counts`` against ``probs`` (sequences of equal length), the
    cells expected fewer than ``pool_below`` times pooled into one; returns (statistic, degrees of freedom)."""
    n = sum(counts)
    obs, exp, rest_obs, rest_exp = [], [], 0.0, 0.0
    for c, p in zip(counts, probs):
        if n * p >= pool_below:
            obs.append(c)
            exp.append(n * p)
        else:
            rest_obs, rest_exp = rest_obs + c, rest_exp + n * p
    if rest_exp > 0:
        obs.append(rest_obs)
        exp.append(rest_exp)
    return sum((o - e) ** 2 / e for o, e in zip(obs, exp)), len(exp) - 1


def chi_square_threshold(df: int, z: float = 3.09) -> float:
    """The chi-square quantile at the standard normal quantile ``z`` (3.09: p = 0.001), by Wilson &
    Hilferty's (1931) cube-root approximation."""
    require_positive(df=df)
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3
