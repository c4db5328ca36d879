"""Predict a mixture of experts: capacity, parameters per rank, model state with ``ep``, all-to-all bytes.

Pure arithmetic (no torch), so a widget can call it on every slider move.

Sources
-------
- Capacity and the load-balancing loss: Fedus, Zoph & Shazeer 2021, *Switch Transformers*,
  arXiv:2101.03961, §2.2 (expert capacity = tokens/experts × capacity factor) and eq. 4-6.
- Top-k routing with capacity and all-to-all dispatch: Lepikhin et al. 2020, *GShard*, arXiv:2006.16668.
- Expert parallelism inside data parallelism (experts split across ranks, each replicated dp/ep
  times): DeepSpeed-MoE, Rajbhandari et al. 2022, arXiv:2201.05596, §5.
- Model state per rank: ZeRO (Rajbhandari et al. 2019, arXiv:1910.02054), see
  :func:`playbook.theory.hybrid.memory.model_state_bytes`.

Notation: T tokens routed in one MoE layer call over the whole global batch, E experts, k experts
per token, h hidden, f_e an expert's SwiGLU width, ep the expert-parallel degree, dp the
data-parallel degree of the dense parts (the expert-parallel group lives inside it: ep | dp).
"""

from __future__ import annotations

from playbook.config import ModelConfig, divisors, require_positive
from playbook.theory.cost.comm import sent_bytes
from playbook.theory.inventory.activations import block_activation_bytes, model_activation_breakdown
from playbook.theory.inventory.inventory import local, ours_block, view
from playbook.theory.inventory.moe import moe_mlp_terms as moe_mlp_activation_terms
from playbook.theory.inventory.model_state import TrainingMemory, model_state_bytes
from playbook.theory.moe.capacity import (
    aux_loss_value,
    check_capacity_factor,
    check_ep,
    check_routing,
    expert_capacity,
    imbalance,
    kept_counts,
    load_entropy,
    rank_rows,
    simulate_routing,
)
from playbook.theory.moe.comm import (
    alltoall_bytes_from_routing,
    alltoall_bytes_per_step,
    alltoall_rows,
    routing_report,
    tp_experts_bytes_per_step,
    uniform_alltoall_bytes,
)

__all__ = [  # the routing arithmetic and the all-to-all bytes live below this module, read through it
    "aux_loss_value", "check_capacity_factor", "check_ep", "check_routing", "expert_capacity",
    "imbalance", "kept_counts", "load_entropy", "rank_rows", "simulate_routing", "alltoall_bytes_from_routing",
    "alltoall_bytes_per_step", "alltoall_rows", "routing_report", "tp_experts_bytes_per_step",
    "uniform_alltoall_bytes", "moe_mlp_activation_terms",
]  # fmt: skip


# ---- parameters and model state ----------------------------------------------------------------
def expert_params(cfg: ModelConfig) -> int:
    """One routed expert: a SwiGLU of width expert_ffn_hidden, 3 · h · f_e."""
    return 3 * cfg.hidden * cfg.expert_ffn_hidden


def params_per_rank(cfg: ModelConfig, ep: int = 1, expert_tp: int = 1) -> dict[str, int]:
    """Parameters one rank holds with experts split over ``ep`` ranks: the dense part (attention,
    norms, embeddings, routers, shared experts, dense layers) whole, and E/ep routed experts per
    MoE layer, each a 1/``expert_tp`` slice of its width when tensor parallelism splits experts."""
    check_ep(cfg.n_experts, ep) if cfg.is_moe else require_positive(ep=ep)
    require_positive(expert_tp=expert_tp)
    routed_total = cfg.n_moe_layers * cfg.n_experts * expert_params(cfg)
    dense = cfg.num_params() - routed_total
    experts = routed_total // (ep * expert_tp)
    return {"dense": dense, "experts": experts, "total": dense + experts}


def param_tensors_per_rank(cfg: ModelConfig, ep: int = 1) -> int:
    """Parameter tensors of our torch model on one rank (AdamW keeps a 4-byte ``step`` per tensor):
    embedding, final norm, head unless tied; per dense block 2 norms + q/k/v/o + gate/up/down;
    per MoE block 2 norms + q/k/v/o + router + 3 per shared expert + 3 per local routed expert.
    (``ModelConfig.num_param_tensors`` counts dense blocks only.)"""
    per_moe = 2 + 4 + 1 + 3 * cfg.n_shared_experts + 3 * (cfg.n_experts // ep if cfg.is_moe else 0)
    dense_layers = cfg.n_layers - cfg.n_moe_layers
    return 2 + (0 if cfg.tie_embeddings else 1) + 9 * dense_layers + per_moe * cfg.n_moe_layers


def moe_model_state_bytes(
    cfg: ModelConfig,
    *,
    ep: int = 1,
    dp: int = 1,
    zero: int = 0,
    precision: str = "mixed",
    n_tensors: int = 0,
    expert_tp: int = 1,
    fp32_grad_accum: bool | str = False,
) -> TrainingMemory:
    """Bytes of weights, gradients and Adam states on one rank with expert parallelism.

    The dense part Ψ_d is replicated over the dp data-parallel ranks (ZeRO shards it over dp);
    the routed experts Ψ_e are split over ep ranks, and each expert shard is replicated on the
    dp/ep ranks that hold the same experts (ZeRO shards it over those dp/ep): DeepSpeed-MoE §5.

        per rank = state(Ψ_d, dp) + state(Ψ_e / ep, dp / ep)

    ``n_tensors`` adds 4 bytes per parameter tensor (AdamW's ``step``), and ``fp32_grad_accum`` an
    fp32 gradient buffer sharded like the gradients, as in ``model_state_bytes``.
    ``expert_tp``: tensor parallelism inside each expert as well (a 1/expert_tp slice of every
    expert; the slices' replicas are dp/(ep·expert_tp) ranks). With ep = 1 and dp = 1 this is the
    plain 16Ψ (mixed) or 16Ψ (fp32: 4+4+8). This is ``training_memory(..., ep=e)``'s model state.
    """
    check_ep(cfg.n_experts if cfg.is_moe else ep, ep, dp)
    if dp % (ep * expert_tp):
        raise ValueError(
            f"ep·expert_tp={ep * expert_tp} must divide dp={dp}; try expert_tp in "
            f"{{{', '.join(str(t) for t in divisors(dp // ep))}}}"
        )
    p = params_per_rank(cfg, ep, expert_tp)
    acc = dict(zero=zero, precision=precision, fp32_grad_accum=fp32_grad_accum)
    dense = model_state_bytes(p["dense"], dp=dp, **acc)
    if p["experts"]:
        experts = model_state_bytes(p["experts"], dp=dp // (ep * expert_tp), **acc)
    else:
        experts = TrainingMemory(0.0, 0.0, 0.0)
    return TrainingMemory(
        params=dense.params + experts.params,
        grads=dense.grads + experts.grads,
        optimizer=dense.optimizer + experts.optimizer + 4 * n_tensors,
    )


def inference_weight_bytes(cfg: ModelConfig, *, ep: int = 1, tp: int = 1, pp: int = 1, dtype_bytes: float = 2) -> float:
    """Weights one serving rank holds with the routed experts split over ``ep`` ranks and the rest
    split ideally over tp·pp (as ``theory.hybrid.memory.inference_memory`` does): the extra dimension
    ``inference_memory(ep=e)`` needs. DeepSeek-V3 in bf16 over ep=64: the 256 experts of each layer
    become 4 per rank."""
    p = params_per_rank(cfg, ep)
    return (p["dense"] / (tp * pp) + p["experts"] / (tp * pp)) * dtype_bytes


def total_vs_active(cfg: ModelConfig) -> dict[str, float]:
    """Total parameters (what memory must hold) vs active ones (what one token's FLOPs touch)."""
    total, active = cfg.num_params(), cfg.active_params()
    return {
        "total": total,
        "active": active,
        "active_fraction": active / total,
        "routed_experts": cfg.n_moe_layers * cfg.n_experts * expert_params(cfg),
    }


def step_comm_bytes(cfg: ModelConfig, n: int, ep: int, mode: str, tokens_per_rank: int) -> dict[str, float]:
    """Bytes per rank per training step of ``playbook.parallel.ep.model`` that do not depend on the
    routing, by collective (fp32): the counts all-gather (int64, forward only), the one-bucket
    all-reduce of the dense gradients over n ranks, of the expert gradients (+ one flag per tensor)
    over the n/ep replicas, and of (loss, aux) for reporting. ``mode="tp"``: tensor-parallel
    experts' all-gathers and reduce-scatters of T_local·n·h rows instead (forward and backward)."""
    p = params_per_rank(cfg, ep if mode == "ep" else 1)
    reduce = sent_bytes("all_reduce", 4 * p["dense"], n) + sent_bytes("all_reduce", 8, n)
    if mode == "ep":
        out = {
            "all_gather_single": cfg.n_moe_layers * sent_bytes("all_gather", 8 * cfg.n_experts * n, n),
            "all_reduce": reduce,
        }
        if n > ep:
            tensors = 3 * cfg.n_experts // ep * cfg.n_moe_layers
            out["all_reduce"] += sent_bytes("all_reduce", 4 * (p["experts"] + tensors), n // ep)
        return out
    S = 4 * tokens_per_rank * n * cfg.hidden * cfg.n_moe_layers
    return {
        "all_gather_single": 2 * sent_bytes("all_gather", S, n),
        "reduce_scatter_single": 2 * sent_bytes("reduce_scatter", S, n),
        "all_reduce": reduce,
    }


# ---- activations: the exact count for our MoE layer, given its routing ------------------------
def model_activation_bytes_moe(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    layers: list[dict],
    rank: int = 0,
    ep: int = 1,
    mode: str = "ep",
    tp: int = 1,
    dtype_bytes: int = 4,
) -> int:
    """Exact bytes saved by one forward of our MoE GPT on ``rank``, given each MoE layer's routing
    (``layers[i]`` has ``counts_by_rank``, ``capacity`` and ``tokens``, as in ``RoutingStats``).
    ``mode="tp"``: tensor-parallel experts over ``tp`` ranks (tokens gathered, widths split)."""
    sizes = dict(seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes)
    parts = model_activation_breakdown(cfg, **sizes)
    dense_block = block_activation_bytes(cfg, **sizes)
    total = sum(v for k, v in parts.items() if k != "blocks") + (cfg.n_layers - cfg.n_moe_layers) * dense_block
    x, local_tokens = local(cfg, **sizes), micro_batch * seq_len
    for layer in layers:
        routed = None
        if mode == "tp":
            S = sum(sum(r) for r in kept_counts(layer["counts_by_rank"], layer["capacity"]))
            terms = moe_mlp_activation_terms(
                cfg,
                tokens=layer["tokens"],
                slots=S,
                rows=S,
                shared_tokens=local_tokens,
                dtype_bytes=dtype_bytes,
                expert_split=tp,
                gathered=tp > 1,
            )
            if tp > 1 and not cfg.n_shared_experts:  # the norm output feeds only the gather: nobody saves it
                routed = 0
        else:
            S, R = rank_rows(layer["counts_by_rank"], layer["capacity"], rank, ep)
            terms = moe_mlp_activation_terms(cfg, tokens=local_tokens, slots=S, rows=R, dtype_bytes=dtype_bytes)
        total += sum(view(ours_block(cfg, x, moe=terms, routed=routed)).values())
    return total
