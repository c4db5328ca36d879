"""Seeded request traces for serving: shared system prompts and multi-turn conversations (pure Python).

Prefix caching pays when requests begin alike. Two ways they do in practice: many users of one
application behind the same system prompt, and a conversation, whose every turn resends all
earlier turns (SGLang, Zheng et al. 2024, §6, and vLLM's prefix-caching benchmarks measure on
both). ``conversations`` draws such a trace: each conversation takes one of ``groups`` system
prompts, then ``turns`` turns; turn t's prompt is the system prompt, every earlier user message and
answer, and a new user message. The answers are drawn tokens standing for what the client was
shown (a trace replayed without the model cannot know the model's answer), so they are reused by
the next turn's prompt as its text, not as cached decode blocks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: its prompt ids, tokens to generate, arrival step, conversation, turn."""

    prompt: tuple[int, ...]
    max_new: int
    arrival: int
    conversation: int
    turn: int


def conversations(
    *,
    n: int,
    groups: int,
    turns: int,
    system: int,
    user: tuple[int, int],
    answer: tuple[int, int],
    new: tuple[int, int],
    vocab: int,
    seed: int = 0,
    every: int = 1,
) -> list[TraceRequest]:
    """``n`` conversations of ``turns`` turns over ``groups`` system prompts of ``system`` tokens;
    user messages, answers and tokens to generate of lengths uniform in the given [low, high].
    Requests arrive turn by turn (every first turn, then every second...), one each ``every`` steps."""
    for name, value in (("n", n), ("groups", groups), ("turns", turns), ("vocab", vocab), ("every", every)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    rng = random.Random(seed)
    ids = lambda k: tuple(rng.randrange(vocab) for _ in range(k))  # noqa: E731
    prompts = [ids(system) for _ in range(groups)]
    history = [prompts[rng.randrange(groups)] for _ in range(n)]
    out = []
    for t in range(turns):
        for c in range(n):
            prompt = history[c] + ids(rng.randint(*user))
            out.append(TraceRequest(prompt, rng.randint(*new), len(out) * every, c, t))
            history[c] = prompt + ids(rng.randint(*answer))
    return out


def poisson_trace(
    *,
    n: int,
    rate: float,
    groups: int,
    prefix: int,
    suffix: tuple[int, int],
    new: tuple[int, int],
    vocab: int,
    seed: int = 0,
) -> list[TraceRequest]:
    """``n`` requests arriving as a Poisson process of ``rate`` requests per scheduler step (request
    k at step ⌊t_k⌋, exponential gaps of mean 1/rate); each prompt is one of ``groups`` shared
    prefixes of ``prefix`` tokens and its own suffix, uniform in ``suffix`` tokens; tokens to
    generate uniform in ``new``. Drawn from ``seed`` alone (``conversation`` holds the group)."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0 requests per step, got {rate}; try rate=0.5")
    for name, value in (("n", n), ("groups", groups), ("vocab", vocab)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if suffix[0] < 1 or new[0] < 1 or suffix[0] > suffix[1] or new[0] > new[1] or prefix < 0:
        raise ValueError(f"need 1 <= low <= high for suffix {suffix} and new {new}, and prefix >= 0 (got {prefix})")
    rng = random.Random(seed)
    shared = [tuple(rng.randrange(vocab) for _ in range(prefix)) for _ in range(groups)]
    t, out = 0.0, []
    for _ in range(n):
        g = rng.randrange(groups)
        prompt = shared[g] + tuple(rng.randrange(vocab) for _ in range(rng.randint(*suffix)))
        out.append(TraceRequest(prompt, rng.randint(*new), int(t), g, 0))
        t += rng.expovariate(rate)
    return out
