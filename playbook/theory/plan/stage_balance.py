"""The pipeline's slowest rank. A pipeline runs at the pace of its busiest rank: in 1F1B's steady
state every rank waits for the slowest (Narayanan et al. 2021, arXiv:2104.04473, §2.2), so a step
lasts m micro-batches of the busiest rank's work, not of the average. The planner's compute is the
average (the step's FLOPs over every GPU); :func:`stage_imbalance` is the busiest rank's FLOPs over
that average, and :func:`pipeline_idle` counts the difference as idle time beside the bubble.

What makes ranks unequal: the output head (6·h·V FLOPs per token for training, a fifth of a layer of
Megatron-LM's 1.7B GPT with a 51,200 vocabulary and more than one whole layer of it when a stage holds few)
sits on the rank of the last virtual stage, and layers that do not divide evenly. Llama 3 moves a layer
off its first and last stages for this (Dubey et al. 2024, arXiv:2407.21783, §3.3.2; ``ends="light"``).
Every layer counts the same FLOPs (PaLM's count, ``theory.cost.flops``, less the head, over L): exact for
a dense model, and for DeepSeek-V3, whose dense layers' MLP (18,432 wide) matches its MoE layers'
nine active experts (9 × 2,048), to within the router. The embedding is a lookup. Pure arithmetic.
"""

from __future__ import annotations

import functools

from playbook.config import ModelConfig
from playbook.theory.cost.flops import flops_per_token
from playbook.theory.plan.memory import rank_chunks


def head_flops_per_token(cfg: ModelConfig) -> float:
    """The output projection's training FLOPs per token: 2·h·V forward, twice that backward."""
    return 6.0 * cfg.hidden * cfg.vocab_size


@functools.lru_cache(maxsize=4096)
def rank_flops_per_token(
    cfg: ModelConfig, seq_len: int, pp: int, schedule: str = "1f1b", v: int = 1, ends: str = "even"
) -> tuple[float, ...]:
    """Training FLOPs per token of each pipeline rank: its chunks' layers (``theory.plan.memory.rank_chunks``:
    Megatron's loop, the V, or Llama 3's light ends), and the head on the rank that holds it."""
    head = head_flops_per_token(cfg)
    layer = (flops_per_token(cfg, seq_len) - head) / cfg.n_layers
    return tuple(
        sum(n * layer + holds_head * head for _, n, _, holds_head in rank_chunks(cfg, pp, r, schedule, v, ends))
        for r in range(pp)
    )


@functools.lru_cache(maxsize=4096)
def stage_imbalance(
    cfg: ModelConfig, seq_len: int, pp: int, schedule: str = "1f1b", v: int = 1, ends: str = "even"
) -> float:
    """The busiest pipeline rank's FLOPs over the average rank's (1.0 without a pipeline)."""
    if pp == 1:
        return 1.0
    return max(rank_flops_per_token(cfg, seq_len, pp, schedule, v, ends)) * pp / flops_per_token(cfg, seq_len)


def pipeline_idle(compute: float, exposed: float, fraction: float, imbalance: float) -> float:
    """Seconds the average rank idles in a pipeline: the busiest rank's extra work (``imbalance``, its
    FLOPs over the average's, ``theory.plan.stage_balance``), and the bubble, ``fraction`` of the busiest
    rank's pipelined time (its compute and the exposed tp, cp, ep and pp time of the m micro-batches)."""
    return compute * (imbalance - 1) + (compute * imbalance + exposed) * fraction
