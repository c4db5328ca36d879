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
  :func:`playbook.theory.memory.model_state_bytes`.

Notation: T tokens routed in one MoE layer call over the whole global batch, E experts, k experts
per token, h hidden, f_e an expert's SwiGLU width, ep the expert-parallel degree, dp the
data-parallel degree of the dense parts (the expert-parallel group lives inside it: ep | dp).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from playbook.config import ModelConfig, divisors, require_positive
from playbook.theory.memory import TrainingMemory, model_state_bytes


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
    split ideally over tp·pp (as ``theory.memory.inference_memory`` does): the extra dimension
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


# ---- communication -----------------------------------------------------------------------------
def alltoall_rows(kept: list[list[int]], ep: int) -> list[dict[str, int]]:
    """Rows (tokens) each rank sends in the dispatch and in the combine all-to-all of one MoE layer.

    ``kept[r][e]``: slots data-rank r keeps for expert e. Ranks form EP groups of ``ep``
    consecutive ranks; member i of a group owns experts [i·E/ep, (i+1)·E/ep). Dispatch: rank r
    sends every kept slot whose expert lives on another member of its group; combine: it sends
    back every row it received from another member."""
    n, E = len(kept), len(kept[0])
    per = E // ep
    out = []
    for r in range(n):
        group0, me = r - r % ep, r % ep
        mine = range(me * per, (me + 1) * per)
        dispatch = sum(c for e, c in enumerate(kept[r]) if e not in mine)
        combine = sum(kept[s][e] for s in range(group0, group0 + ep) if s != r for e in mine)
        out.append({"dispatch": dispatch, "combine": combine})
    return out


def alltoall_bytes_per_step(kept: list[list[int]], ep: int, hidden: int, dtype_bytes: int = 4) -> list[float]:
    """Bytes each rank sends through all-to-all in one training step of one MoE layer: forward
    dispatch + forward combine, and backward, where each all-to-all runs again with its splits
    swapped (the gradient of the combine goes out as the dispatch came in, and vice versa):
    2 · (dispatch + combine) · h · bytes."""
    return [2.0 * (r["dispatch"] + r["combine"]) * hidden * dtype_bytes for r in alltoall_rows(kept, ep)]


def uniform_alltoall_bytes(tokens_per_rank: int, top_k: int, ep: int, hidden: int, dtype_bytes: int = 4) -> float:
    """Expected bytes per rank per all-to-all under perfectly even routing and no drops:
    k · T_local · h · bytes · (ep − 1)/ep (each slot leaves the rank unless its expert is local)."""
    return top_k * tokens_per_rank * hidden * dtype_bytes * (ep - 1) / ep


def tp_experts_bytes_per_step(tokens_per_rank: int, tp: int, hidden: int, dtype_bytes: int = 4) -> float:
    """Tensor parallelism inside each expert (the contrast): tokens are all-gathered over the tp
    ranks and the partial outputs reduce-scattered back; backward swaps the two. Each is a ring
    collective of T_local · tp · h elements: 4 · T_local · tp · h · bytes · (tp − 1)/tp per step.
    Against EP's 4 · k · T_local · h · bytes · (ep − 1)/ep under even routing: a ratio of k / tp."""
    return 4 * tokens_per_rank * tp * hidden * dtype_bytes * (tp - 1) / tp


def alltoall_bytes_from_routing(
    routing: list[list[dict]], ep: int, hidden: int, dtype_bytes: int = 4
) -> list[list[float]]:
    """[step][rank] bytes sent through all-to-all by every MoE layer together, from the routing
    counts alone (``routing[step][layer]`` with ``counts_by_rank`` and ``capacity``)."""
    out = []
    for layers in routing:
        per_rank = [0.0] * len(layers[0]["counts_by_rank"])
        for layer in layers:
            kept = kept_counts(layer["counts_by_rank"], layer["capacity"])
            for r, b in enumerate(alltoall_bytes_per_step(kept, ep, hidden, dtype_bytes)):
                per_rank[r] += b
        out.append(per_rank)
    return out


def step_comm_bytes(cfg: ModelConfig, n: int, ep: int, mode: str, tokens_per_rank: int) -> dict[str, float]:
    """Bytes per rank per training step of ``playbook.parallel.ep.model`` that do not depend on the
    routing, by collective (fp32): the counts all-gather (int64, forward only), the one-bucket
    all-reduce of the dense gradients over n ranks, of the expert gradients (+ one flag per tensor)
    over the n/ep replicas, and of (loss, aux) for reporting. ``mode="tp"``: tensor-parallel
    experts' all-gathers and reduce-scatters of T_local·n·h rows instead (forward and backward)."""
    from playbook.theory.comm import sent_bytes

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


def routing_report(
    routing: list[list[dict]],
    ce: list[float],
    ep: int,
    hidden: int,
    measured_bytes: list[list[float]],
    seconds: list[list[float]],
) -> dict:
    """The ``routing`` block of ``playbook run ep --json``: per step and MoE layer, tokens per
    expert, kept, dropped, imbalance, entropies, aux loss, load per EP rank; per step the
    all-to-all bytes per rank predicted from the counts beside those measured, and the time."""
    per = len(routing[0][0]["counts"]) // ep
    predicted = alltoall_bytes_from_routing(routing, ep, hidden)
    steps = []
    for s, layers in enumerate(routing):
        rows = [
            {
                "tokens_per_expert": L["counts"],
                "kept_per_expert": L["kept"],
                "capacity": L["capacity"],
                "dropped": L["dropped"],
                "imbalance": imbalance(L["counts"]),
                "load_entropy": load_entropy(L["counts"]),
                "router_entropy": L["router_entropy"],
                "aux": L["aux"],
                "load_per_rank": [sum(L["kept"][i * per : (i + 1) * per]) for i in range(ep)],
            }
            for L in layers
        ]
        steps.append(
            {
                "layers": rows,
                "ce": ce[s],
                "alltoall_bytes_per_rank": {"predicted": predicted[s], "measured": measured_bytes[s]},
                "alltoall_seconds_per_rank": seconds[s],
            }
        )
    return {"ep": ep, "steps": steps}


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


# ---- activations: the exact count for our MoE layer, given its routing ------------------------
def moe_mlp_activation_terms(
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
    """Bytes ``playbook.moe.MoEMLP`` (and its parallel versions) saves for backward in one layer,
    read from its code. It depends on the routing, so it takes the counts:

    - ``tokens`` T routed here (all gathered tokens for tensor-parallel experts),
    - ``slots`` S kept slots this rank's tokens send out (their gates and results come back here),
    - ``rows`` R rows this rank's experts process (= S on one process; what arrives under EP),
    - ``expert_split``: tp when each expert's width is split, ``gathered``: the router input is a
      gathered copy (tensor-parallel experts) rather than the MLP norm's output (counted in the block).

    The estimate in ``playbook.theory.activations._moe_mlp_terms`` assumes S = R = k·T and no
    index tensors; the difference is the int64 ids, the gate bookkeeping and the gated copy.
    """
    T, S, R, E, k, h, B = tokens, slots, rows, cfg.n_experts, cfg.top_k, cfg.hidden, dtype_bytes
    fe = cfg.expert_ffn_hidden
    terms = {
        "router probabilities (softmax output)": T * E * B,
        "top-k expert ids (int64)": T * k * 8,
        "aux loss: expert fractions f": E * B,
        "kept slots: token ids (int64)": S * 8,
        "kept slots: order by expert (int64)": S * 8,
        "kept slots: gates": S * B,
        "expert outputs back home (scaled by gate)": S * h * B,
        "gated outputs (index_add source)": S * h * B,
        "expert inputs": R * h * B,
        "expert SwiGLU tensors (4 per row)": 4 * R * (fe // expert_split) * B,
    }
    if k > 1:
        terms |= {"top-k probabilities (renormalised)": T * k * B, "their sum": T * B}
    if gathered:
        terms["gathered tokens (router input)"] = T * h * B
    if cfg.n_shared_experts:
        terms["shared experts' SwiGLU tensors"] = (
            4 * (T if shared_tokens is None else shared_tokens) * fe * cfg.n_shared_experts * B
        )
    return terms


def moe_block_activation_bytes(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    dtype_bytes: int = 4,
    recompute: str = "none",
    attention: str = "eager",
) -> int:
    """Exact bytes one MoE block of our model saves for backward on one rank when routing is even
    and nothing is dropped: the block's attention and norms (``theory.activations``) plus
    :func:`moe_mlp_activation_terms` with T = b·s tokens, S = k·T slots sent and R = k·T rows
    received. R = k·T holds at any ep: each of the ep ranks of a group sends k·T/E slots to each
    expert, and a rank's E/ep experts receive ep · (E/ep) · k·T/E = k·T rows. ``training_memory``
    uses this for every MoE layer, at every pp and ep; a real router's uneven counts move R (and,
    with a capacity factor, S) around it: see :func:`model_activation_bytes_moe`.

    ``recompute="full"`` keeps the block input only, as for a dense block; ``"selective"``
    recomputes attention and leaves the MLP terms as they are. ``attention="flash"``: a fused
    kernel's attention core (``theory.activations``, Dao et al. 2022)."""
    from playbook.theory.activations import block_activation_breakdown

    sizes = dict(seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes, recompute=recompute)
    block = block_activation_breakdown(cfg, **sizes, moe=True, attention=attention)
    if recompute == "full":
        return sum(block.values())
    rest = sum(v for k, v in block.items() if "(estimate)" not in k)
    T = micro_batch * seq_len
    slots = cfg.top_k * T
    return rest + sum(
        moe_mlp_activation_terms(cfg, tokens=T, slots=slots, rows=slots, dtype_bytes=dtype_bytes).values()
    )


def rank_rows(counts_by_rank: list[list[int]], capacity: int | None, rank: int, ep: int) -> tuple[int, int]:
    """(S, R) for ``rank``: slots its tokens keep, rows its experts receive (EP groups of ep)."""
    kept = kept_counts(counts_by_rank, capacity)
    E = len(kept[0])
    per, g0, me = E // ep, rank - rank % ep, rank % ep
    S = sum(kept[rank])
    R = sum(kept[s][e] for s in range(g0, g0 + ep) for e in range(me * per, (me + 1) * per))
    return S, R


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
    from playbook.theory.activations import block_activation_breakdown, model_activation_breakdown

    sizes = dict(seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes)
    parts = model_activation_breakdown(cfg, **sizes)
    dense_block = sum(block_activation_breakdown(cfg, **sizes).values())
    moe_rest = sum(v for k, v in block_activation_breakdown(cfg, **sizes, moe=True).items() if "(estimate)" not in k)
    total = sum(v for k, v in parts.items() if k != "blocks") + (cfg.n_layers - cfg.n_moe_layers) * dense_block
    local = micro_batch * seq_len
    for layer in layers:
        if mode == "tp":
            S = sum(sum(r) for r in kept_counts(layer["counts_by_rank"], layer["capacity"]))
            terms = moe_mlp_activation_terms(
                cfg,
                tokens=layer["tokens"],
                slots=S,
                rows=S,
                shared_tokens=local,
                dtype_bytes=dtype_bytes,
                expert_split=tp,
                gathered=tp > 1,
            )
            if tp > 1 and not cfg.n_shared_experts:  # the norm output feeds only the gather: nobody saves it
                terms["mlp norm output (not saved: only gathered)"] = -local * cfg.hidden * dtype_bytes
        else:
            S, R = rank_rows(layer["counts_by_rank"], layer["capacity"], rank, ep)
            terms = moe_mlp_activation_terms(cfg, tokens=local, slots=S, rows=R, dtype_bytes=dtype_bytes)
        total += moe_rest + sum(terms.values())
    return total
