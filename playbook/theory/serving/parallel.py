"""Predictions for pipeline- and expert-parallel decoding (pure arithmetic, no torch).

Pipeline parallelism at inference (GPipe's cut, Huang et al. 2019, arXiv:1811.06965; for serving,
Pope et al. 2022, arXiv:2211.05102, §3.3, and vLLM's pipeline-parallel decoding): stage i holds
layers [i·L/pp, (i+1)·L/pp) and their KV cache. A decoded token crosses every stage boundary once,
as one activation row [1, 1, h]; the last stage picks the token (argmax) and sends its id back to
the first, which embeds it for the next step. So per decoded token:

    stage i < pp − 1 sends  h · act_bytes        (the residual stream, fp32 here: 4·h)
    the last stage sends    id_bytes             (one int64 token id, 8 bytes)

Bubble of micro-batched decode: the next token of a micro-batch needs its previous token, which
comes out of the last stage, so one micro-batch alone keeps one stage busy at a time (idle
(pp−1)/pp). With m micro-batches in flight the stages work on different micro-batches at once; with
equal unit times u (one micro-batch through one stage) and free sends, N decode steps take
(N·max(m, pp) + min(m, pp) − 1)·u while each stage works N·m·u:

    idle / total = 1 − N·m / (N·max(m, pp) + min(m, pp) − 1)

(m ≥ pp: only the fill and drain, (pp−1)/(N·m + pp − 1); m < pp: a bubble every step.)

Expert parallelism at inference (DeepSpeed-MoE inference, Rajbhandari et al. 2022,
arXiv:2201.05596, §5; GShard's dispatch and combine, Lepikhin et al. 2020, arXiv:2006.16668): per
MoE layer and forward, a rank sends the rows of its tokens routed to another rank's experts
(dispatch) and returns the rows it computed for other ranks' tokens (combine); no backward, so half
of ``theory.moe.moe.alltoall_bytes_per_step``. With no capacity limit every routed slot is kept.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.theory.moe.comm import alltoall_rows

TOKEN_ID_BYTES = 8  # int64


def pp_boundary_bytes_per_token(cfg: ModelConfig, *, act_bytes: float = 4) -> float:
    """Bytes a non-last stage sends per decoded token: one activation row of ``hidden``."""
    return cfg.hidden * act_bytes


def pp_stage_bytes_per_token(cfg: ModelConfig, *, pp: int, act_bytes: float = 4) -> list[float]:
    """Bytes each of the ``pp`` stages sends per decoded token: the activation row from every stage
    but the last, the token id from the last (back to the first)."""
    if pp < 2:
        return [0.0]
    return [pp_boundary_bytes_per_token(cfg, act_bytes=act_bytes)] * (pp - 1) + [float(TOKEN_ID_BYTES)]


def pp_decode_bubble(pp: int, microbatches: int, steps: int) -> float:
    """idle / total of each stage over ``steps`` decode steps of ``microbatches`` micro-batches
    (equal unit times, free sends; see the module docstring)."""
    if min(pp, microbatches, steps) < 1:
        raise ValueError(f"pp, microbatches and steps must be >= 1, got {pp}, {microbatches}, {steps}")
    total = steps * max(microbatches, pp) + min(microbatches, pp) - 1
    return 1.0 - steps * microbatches / total


def ep_forward_alltoall_bytes(counts_by_rank: list[list[int]], ep: int, hidden: int, act_bytes: int = 4) -> list[float]:
    """Bytes each rank sends in one MoE layer's forward (dispatch + combine), no capacity limit:
    ``counts_by_rank[r][e]`` slots of rank r's tokens routed to expert e."""
    return [(r["dispatch"] + r["combine"]) * hidden * act_bytes for r in alltoall_rows(counts_by_rank, ep)]


def ep_uniform_bytes_per_token(cfg: ModelConfig, *, ep: int, act_bytes: int = 4) -> float:
    """Expected bytes per decoded token per rank over every MoE layer under perfectly even routing:
    dispatch and combine each k·h·bytes·(ep−1)/ep."""
    return cfg.n_moe_layers * 2 * cfg.top_k * cfg.hidden * act_bytes * (ep - 1) / ep


def ep_counts_bytes_per_forward(cfg: ModelConfig, *, ep: int) -> float:
    """Bytes each rank sends per forward in the all-gathers of routed counts: one int64 per expert
    per MoE layer to each of the ep − 1 others (the all-gather's (n−1)/n of n·E·8 bytes)."""
    return cfg.n_moe_layers * cfg.n_experts * TOKEN_ID_BYTES * (ep - 1)
