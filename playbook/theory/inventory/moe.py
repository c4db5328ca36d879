"""The tensors a mixture of experts' MLP saves for backward, the MoE part of the one inventory
(``theory.inventory.inventory.ours_block`` takes them in place of SwiGLU's four): exactly, from the routing
counts (what ``playbook.model.moe.MoEMLP`` and its expert- and tensor-parallel versions keep, read from
their code; Lepikhin et al. 2020, *GShard*, arXiv:2006.16668, for top-k dispatch and combine), or
as an estimate when no routing is known. Pure arithmetic, no torch.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.theory.inventory.inventory import INDEX_BYTES, Local


def moe_estimate(cfg: ModelConfig, x: Local) -> dict[str, int]:
    """An ESTIMATE for an MoE MLP without routing: router probabilities, k copies of each token, the
    SwiGLU tensors of k routed and the shared experts, k combine weights per token."""
    b, s, B, k = x.b, x.s, x.B, cfg.top_k
    return {
        "router probabilities (estimate)": b * s * cfg.n_experts * B,
        "tokens dispatched to experts (estimate)": b * s * k * x.h * B,
        "expert SwiGLU tensors (estimate)": 4 * b * s * (k + cfg.n_shared_experts) * cfg.expert_ffn_hidden * B,
        "combine weights (estimate)": b * s * k * B,
    }


def moe_mlp_terms(
    cfg: ModelConfig,
    *,
    tokens: int,
    slots: int,
    rows: int,
    shared_tokens: int | None = None,
    dtype_bytes: int = 4,
    expert_split: int = 1,
    gathered: bool = False,
) -> dict[str, int]:
    """Bytes ``playbook.model.moe.MoEMLP`` (and its parallel versions) saves for backward in one layer,
    read from its code. It depends on the routing, so it takes the counts: ``tokens`` T routed here
    (all gathered tokens for tensor-parallel experts), ``slots`` S kept slots this rank's tokens send
    out (their gates and results come back here), ``rows`` R rows this rank's experts process (= S
    on one process; what arrives under EP), ``expert_split`` (tp when each expert's width is split),
    ``gathered`` (the router input is a gathered copy, for tensor-parallel experts). The estimate
    (:func:`moe_estimate`) assumes S = R = k·T and no index tensors."""
    T, S, R, E, k, h, B = tokens, slots, rows, cfg.n_experts, cfg.top_k, cfg.hidden, dtype_bytes
    terms = {
        "router probabilities (softmax output)": T * E * B,
        "top-k expert ids (int64)": T * k * INDEX_BYTES,
        "aux loss: expert fractions f": E * B,
        "kept slots: token ids (int64)": S * INDEX_BYTES,
        "kept slots: order by expert (int64)": S * INDEX_BYTES,
        "kept slots: gates": S * B,
        "expert outputs back home (scaled by gate)": S * h * B,
        "gated outputs (index_add source)": S * h * B,
        "expert inputs": R * h * B,
        "expert SwiGLU tensors (4 per row)": 4 * R * (cfg.expert_ffn_hidden // expert_split) * B,
    }
    if k > 1:
        terms |= {"top-k probabilities (renormalised)": T * k * B, "their sum": T * B}
    if gathered:
        terms["gathered tokens (router input)"] = T * h * B
    if cfg.n_shared_experts:
        shared = T if shared_tokens is None else shared_tokens
        terms["shared experts' SwiGLU tensors"] = 4 * shared * cfg.expert_ffn_hidden * cfg.n_shared_experts * B
    return terms
