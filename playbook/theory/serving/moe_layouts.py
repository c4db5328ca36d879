"""Serving a mixture of experts: tensor-parallel attention against data-parallel attention, experts
split over every GPU in both (pure arithmetic, no torch).

On n GPUs the routed experts of every MoE layer are split over all n (expert parallelism: E/n per
GPU, Lepikhin et al. 2020, GShard, arXiv:2006.16668). What differs is the attention:

- **TP attention** (vLLM ``--tensor-parallel-size n --enable-expert-parallel``): the n GPUs are one
  replica. Every attention block is split by heads (Megatron, Shoeybi et al. 2019): a rank holds
  a/n query heads and, of every sequence, ``max(g/n, 1)`` KV heads, so when n exceeds the g KV
  heads each KV head is cached on n/g ranks (vLLM replicates them); an MLA latent is shared by all
  heads and cached whole on every rank (DeepSeek-V2, arXiv:2405.04434, §2.1). Every token is on every
  rank: after attention's all-reduce each rank runs its experts on the tokens routed to them and a
  second all-reduce sums the experts' outputs.
- **DP attention** (DeepSeek-V3, arXiv:2412.19437, §3.4.2: decoding with attention DP80 × TP4 and
  the MoE over EP320; SGLang ``--enable-dp-attention``; vLLM ``--data-parallel-size n
  --enable-expert-parallel``): each rank holds the whole attention and serves its own sequences with
  their whole KV, nothing replicated; every MoE layer sends each token's k rows to its experts' ranks
  and back (dispatch and combine, two all-to-alls).

In general the attention is split over ``attention_tp`` = t ranks of n/t groups (t = n: TP attention;
t = 1: DP attention). A group's tokens are split over its t ranks for the dispatch and all-gathered
after the combine (Megatron's sequence-parallel MoE; with t = n the two all-to-alls become the one
all-reduce above). Per GPU, with dtype bytes b:

    weights  = attention (q and o heads /t; GQA k, v ×max(g/t, 1)/g; MLA down-projections whole)
               + embedding, head, dense MLPs, shared experts /t + routed experts /n + norms, routers
    KV/token = kv_cache_bytes_per_token · max(g/t, 1)/g   (MLA: the whole latent)
    replicated KV share = 1 − (whole/t) / (KV/token)

Decode at batch B (B·t/n sequences per group), a roofline (Pope et al. 2022, arXiv:2211.05102, §2):
max(FLOPs / (peak·mfu), bytes / (bandwidth·mbu)) + communication, where every rank does B/n of the
FLOPs in either layout (B·t/n rows of 1/t of the attention, B·k/n expert rows under even routing),
reads its weights (each expert's with probability 1 − (1 − k/E)^B, uniform routing) and B·t/n
sequences of its KV; communication is an all-reduce of [B·t/n, h] per layer over t (attention; and
dense MLPs) and per MoE layer either the all-reduce over n (t = n) or two all-to-alls of
k·(B/n)·h·b·(n−1)/n bytes per rank (t < n; the intra-node share at NVLink, the rest at the NIC).
Not counted: DeepSeek's FP8 dispatch, overlap of the all-to-all with compute (two micro-batches),
imbalance of real routing, and the prefill (TTFT) side.
"""

from __future__ import annotations

import math

from playbook.config import ModelConfig, divisors, require_positive
from playbook.hardware import MEM_UTIL, Hardware
from playbook.theory.cost.comm import sent_bytes
from playbook.theory.cost.flops import flops_per_token
from playbook.theory.hybrid.memory import _kv_heads_per_rank, kv_cache_bytes_per_token
from playbook.theory.inventory.model_state import _dtype_bytes
from playbook.theory.serving.profile import activation_peak
from playbook.theory.serving.serving import BLOCK_SIZE, RING_STEP, allreduce_seconds, kv_bytes_per_token

LAYOUTS = {"tp": "TP attention", "dp": "DP attention"}


def layout_name(gpus: int, attention_tp: int) -> str:
    """'TP attention' (t = n), 'DP attention' (t = 1), else 'attn tp{t}×dp{n/t}'; experts over n."""
    if attention_tp == gpus:
        return LAYOUTS["tp"]
    return LAYOUTS["dp"] if attention_tp == 1 else f"attn tp{attention_tp}×dp{gpus // attention_tp}"


def check_moe_layout(cfg: ModelConfig, *, gpus: int, attention_tp: int) -> None:
    """One ``ValueError`` naming the broken constraint and what works: a MoE model, n dividing the
    experts, t dividing n and the heads, and the KV heads splitting or replicating evenly over t."""
    require_positive(gpus=gpus, attention_tp=attention_tp)
    if not cfg.is_moe:
        raise ValueError(
            f"{cfg.name} is a dense model (no experts): MoE serving layouts need one, e.g. gpt-tiny-moe, "
            "mixtral-8x7b or deepseek-v3"
        )
    if cfg.n_experts % gpus:
        ok = [d for d in divisors(cfg.n_experts) if d > 1]
        raise ValueError(
            f"ep={gpus} does not divide the {cfg.n_experts} experts of {cfg.name}; use ep in {{{', '.join(map(str, ok))}}}"
        )
    if gpus % attention_tp or cfg.n_heads % attention_tp:
        raise ValueError(
            f"attention tp={attention_tp} must divide ep={gpus} and n_heads={cfg.n_heads}; "
            f"try {{{', '.join(str(t) for t in divisors(gpus) if cfg.n_heads % t == 0)}}}"
        )
    if cfg.attention != "mla":
        _kv_heads_per_rank(cfg, attention_tp)  # raises its own one line


def _expert_params(cfg: ModelConfig) -> int:
    return 3 * cfg.hidden * cfg.expert_ffn_hidden


def weight_params_per_gpu(cfg: ModelConfig, *, gpus: int, attention_tp: int) -> dict[str, float]:
    """Parameters one GPU holds by part: ``attention``, ``dense`` (embedding, head, dense MLPs,
    shared experts), ``experts`` (routed, /gpus), ``replicated`` (norms, routers, and attention
    weights every rank of a group keeps whole). Summed over parts at gpus = t = 1: ``num_params``."""
    check_moe_layout(cfg, gpus=gpus, attention_tp=attention_tp)
    t, h, L = attention_tp, cfg.hidden, cfg.n_layers
    attn = cfg.attention_params()
    if cfg.attention == "mla":  # q_a and kv_a down-projections (+ their norms) whole on every rank
        whole = h * cfg.q_lora_rank + cfg.q_lora_rank + h * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + cfg.kv_lora_rank
        split = attn - whole
    else:  # k and v: the rank's KV heads (replicated when t > g)
        whole = 2 * h * cfg.dim_head * _kv_heads_per_rank(cfg, t)
        split = attn - 2 * h * cfg.dim_head * cfg.kv_heads
    dense_layers = L - cfg.n_moe_layers
    dense = (
        cfg.embedding_params()
        - h
        + dense_layers * cfg.dense_mlp_params()
        + cfg.n_moe_layers * cfg.n_shared_experts * _expert_params(cfg)
    )
    return {
        "attention": L * split / t,
        "replicated": L * whole + (2 * L + 1) * h + cfg.n_moe_layers * h * cfg.n_experts,
        "dense": dense / t,
        "experts": cfg.n_moe_layers * cfg.n_experts * _expert_params(cfg) / gpus,
    }


def kv_per_token_per_gpu(cfg: ModelConfig, *, attention_tp: int, dtype: str = "bf16") -> dict[str, float]:
    """KV bytes one token of a sequence puts on each GPU of its attention group: ``held`` (GQA:
    max(g/t, 1) heads; MLA: the whole latent), ``ideal`` (the whole cache / t) and ``replicated``
    (held − ideal: bytes another rank of the group also holds)."""
    held = kv_bytes_per_token(cfg, tp=attention_tp, dtype=dtype)
    ideal = kv_cache_bytes_per_token(cfg, dtype) / attention_tp
    return {"held": held, "ideal": ideal, "replicated": held - ideal}


def alltoall_bytes_per_step(cfg: ModelConfig, *, tokens_per_rank: float, gpus: int, act_bytes: float = 2) -> float:
    """Bytes one rank sends per decode step in the MoE all-to-alls under even routing: dispatch and
    combine of k rows per token, (n−1)/n of them to other ranks, every MoE layer."""
    return cfg.n_moe_layers * 2 * cfg.top_k * tokens_per_rank * cfg.hidden * act_bytes * (gpus - 1) / gpus


def allreduce_bytes_per_step(cfg: ModelConfig, *, tokens: float, tp: int, act_bytes: float = 2) -> float:
    """Bytes one rank of a TP-attention replica (tp = ep: experts combined by all-reduce) sends per
    decode step: two all-reduces of [tokens, h] per layer (attention, then the MLP or the experts)."""
    return 2 * cfg.n_layers * sent_bytes("all_reduce", tokens * cfg.hidden * act_bytes, tp)


def _alltoall_seconds(nbytes: float, gpus: int, hw: Hardware) -> float:
    """One all-to-all sending ``nbytes`` per rank: NVLink for the peers in the node, the NIC for the rest."""
    if gpus <= hw.devices_per_node:
        return nbytes / hw.intra_node_bandwidth + hw.intra_node_latency
    off = (gpus - hw.devices_per_node) / (gpus - 1)  # share of the peers in other nodes
    return max((1 - off) * nbytes / hw.intra_node_bandwidth, off * nbytes / hw.inter_node_bandwidth) + (
        hw.inter_node_latency
    )


def decode_step(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    gpus: int,
    attention_tp: int,
    batch: int,
    context: int,
    dtype: str = "bf16",
    mfu: float = 0.5,
    mbu: float = 0.8,
    latency: float | str = RING_STEP,
) -> dict:
    """One decode step of ``batch`` sequences (all groups together) of ``context`` tokens on each
    GPU: compute, memory and communication seconds, the step, and bytes sent per rank."""
    require_positive(batch=batch, context=context)
    n, t, b = gpus, attention_tp, _dtype_bytes(dtype)
    rows = batch * t / n  # sequences of this rank's group, every one on every rank of it
    p = weight_params_per_gpu(cfg, gpus=n, attention_tp=t)
    touched = 1 - (1 - cfg.top_k / cfg.n_experts) ** batch  # chance an expert gets a row (uniform routing)
    read = (p["attention"] + p["replicated"] + p["dense"] + p["experts"] * touched) * b
    read += rows * context * kv_per_token_per_gpu(cfg, attention_tp=t, dtype=dtype)["held"]
    flops = batch * flops_per_token(cfg, context, training=False) / n
    comm, a2a, ar = 0.0, 0.0, 0.0
    dense_layers = cfg.n_layers - cfg.n_moe_layers
    if t > 1:  # attention's all-reduce every layer, the dense MLPs' too
        ar = (cfg.n_layers + dense_layers) * sent_bytes("all_reduce", rows * cfg.hidden * b, t)
        comm += (cfg.n_layers + dense_layers) * allreduce_seconds(rows * cfg.hidden * b, t, hw, latency)
    if t == n and n > 1:  # every token on every rank: the experts' partial outputs summed
        ar += cfg.n_moe_layers * sent_bytes("all_reduce", rows * cfg.hidden * b, n)
        comm += cfg.n_moe_layers * allreduce_seconds(rows * cfg.hidden * b, n, hw, latency)
    elif n > 1:  # dispatch and combine of this rank's B/n tokens, then the group's all-gather
        a2a = alltoall_bytes_per_step(cfg, tokens_per_rank=batch / n, gpus=n, act_bytes=b)
        comm += 2 * cfg.n_moe_layers * _alltoall_seconds(a2a / (2 * cfg.n_moe_layers), n, hw)
        if t > 1:
            gather = sent_bytes("all_gather", rows * cfg.hidden * b, t)
            ar += cfg.n_moe_layers * gather
            comm += cfg.n_moe_layers * (gather / hw.intra_node_bandwidth + hw.intra_node_latency)
    compute, memory = flops / (hw.peak_bf16_flops * mfu), read / (hw.memory_bandwidth * mbu)
    return {
        "compute": compute,
        "memory": memory,
        "comm": comm,
        "seconds": max(compute, memory) + comm,
        "bound": "compute" if compute >= memory else "memory",
        "alltoall_bytes": a2a,
        "tp_bytes": ar,
    }


def moe_layout(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    gpus: int,
    attention_tp: int,
    context: int,
    mem_util: float = MEM_UTIL,
    block_size: int = BLOCK_SIZE,
    dtype: str = "bf16",
    **rates,
) -> dict:
    """One row: weights, KV room (and its replicated share) per GPU, sequences of ``context``
    tokens that fit in all, the decode step at that batch and tokens/s. ``fits`` False (seqs 0)
    when the weights and a prompt's activations leave no room for one sequence."""
    n, t = gpus, attention_tp
    p = weight_params_per_gpu(cfg, gpus=n, attention_tp=t)
    weights = sum(p.values()) * _dtype_bytes(dtype)
    acts = activation_peak(cfg, tokens=context, tp=t, dtype=dtype)
    budget = mem_util * hw.capacity_bytes - weights - acts
    kv = kv_per_token_per_gpu(cfg, attention_tp=t, dtype=dtype)
    per_seq = math.ceil(context / block_size)
    blocks = max(int(budget // (block_size * kv["held"])), 0)
    seqs = (n // t) * (blocks // per_seq)
    row = {
        "layout": layout_name(n, t),
        "attention_tp": t,
        "attention_dp": n // t,
        "ep": n,
        "gpus": n,
        "weights_per_gpu": weights,
        "weights_by_part": {k: v * _dtype_bytes(dtype) for k, v in p.items()},
        "activations_per_gpu": acts,
        "kv_per_gpu": max(budget, 0.0),
        "replicated_kv_per_gpu": max(budget, 0.0) * kv["replicated"] / kv["held"],
        "kv_bytes_per_token_per_gpu": kv["held"],
        "seqs": seqs,
        "fits": seqs > 0,
    }
    if seqs:
        step = decode_step(cfg, hw, gpus=n, attention_tp=t, batch=seqs, context=context, dtype=dtype, **rates)
        one = decode_step(cfg, hw, gpus=n, attention_tp=t, batch=n // t, context=context, dtype=dtype, **rates)
        row |= {
            "tpot": step["seconds"],
            "tpot_one_per_group": one["seconds"],
            "decode_bound": step["bound"],
            "alltoall_bytes_per_step": step["alltoall_bytes"],
            "tp_bytes_per_step": step["tp_bytes"],
            "tokens_per_s": seqs / step["seconds"],
            "tokens_per_s_per_gpu": seqs / step["seconds"] / n,
        }
    return row


def compare_moe_layouts(cfg: ModelConfig, hw: Hardware, *, gpus: int, context: int, **options) -> list[dict]:
    """TP attention, DP attention and the attention tp × dp between them (t dividing n and the heads,
    t within a node), the experts over all ``gpus``; DP attention first."""
    check_moe_layout(cfg, gpus=gpus, attention_tp=1)
    rows = []
    for t in divisors(gpus):
        if t > hw.devices_per_node or cfg.n_heads % t:
            continue
        try:
            check_moe_layout(cfg, gpus=gpus, attention_tp=t)
        except ValueError:
            continue
        rows.append(moe_layout(cfg, hw, gpus=gpus, attention_tp=t, context=context, **options))
    return rows


def recommend_moe(rows: list[dict]) -> tuple[dict, str]:
    """The layout with the most tokens/s, and why: its sequences against TP attention's, and how much
    of a GPU's KV room the other layout spends on copies."""
    fit = [r for r in rows if r["fits"]]
    if not fit:
        raise ValueError("no MoE layout fits one sequence: add GPUs, shorten the context or use --dtype fp8")
    best = max(fit, key=lambda r: r["tokens_per_s"])
    why = f"{best['layout']} serves the most tokens/s ({best['tokens_per_s']:,.0f}) with {best['seqs']:,} sequences"
    for other in fit:
        if other is best:
            continue
        why += f"; {other['layout']}: {other['seqs']:,} sequences, {other['tokens_per_s']:,.0f} tokens/s"
        share = other["replicated_kv_per_gpu"] / other["kv_per_gpu"] if other["kv_per_gpu"] else 0.0
        if share > 0:
            why += f" ({share:.0%} of its KV room holds copies of other ranks' KV)"
        elif other["weights_per_gpu"] > best["weights_per_gpu"]:
            why += (
                f" (its weights take {(other['weights_per_gpu'] - best['weights_per_gpu']) / 1e9:.1f} GB more per GPU)"
            )
        elif other["tpot"] > best["tpot"]:
            why += f" ({other['tpot'] * 1e3:.1f} ms per step against {best['tpot'] * 1e3:.1f})"
    return best, why
