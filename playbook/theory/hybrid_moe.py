"""A mixture of experts in a hybrid layout: what one rank of one pipeline stage holds and sends.

A rank of stage ``s`` holds the embedding (s = 0), the blocks of its stage (in an MoE block: norms,
attention, the router, the shared experts, and E/ep routed experts), the final norm and head (last
stage). Each MoE forward all-gathers the routing counts over the data ranks (8-byte counts, E per
rank), so a step sends them m times per MoE layer of the stage; the dense gradients are
all-reduced over dp×cp and the experts' over their replicas, with one "had a gradient" flag per
expert tensor (``parallel.hybrid_grads``). The activations depend on the routing of
each micro-batch (``theory.moe.model_activation_bytes_moe``), so the stage's peak is played from
the schedule with each micro-batch's own bytes. fp32, no torch.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.comm import sent_bytes
from playbook.theory.moe import expert_params, moe_mlp_activation_terms, rank_rows
from playbook.theory.schedules import make_schedule

FP32 = 4


def stage_blocks(cfg: ModelConfig, pp: int, stage: int) -> range:
    from playbook.theory.stages import stage_layers  # lazily: stages imports the activation models

    return stage_layers(cfg.n_layers, pp)[stage]


def stage_params(cfg: ModelConfig, dims: ParallelDims, stage: int) -> dict[str, int]:
    """Elements and tensors of stage ``stage`` on one rank: ``dense`` (replicated over dp×cp),
    ``experts`` (its E/ep routed experts), ``tensors`` (all of them, AdamW's steps) and
    ``expert_tensors``."""
    h, E, per, t = cfg.hidden, cfg.n_experts, cfg.n_experts // dims.ep, dims.tp
    dense = experts = tensors = expert_tensors = moe_mlp = moe_tensors = 0
    if stage == 0:
        dense, tensors = cfg.vocab_size * h // t, 1
    for i in stage_blocks(cfg, dims.pp, stage):
        moe = i >= cfg.n_dense_layers
        mlp = h * E + cfg.n_shared_experts * expert_params(cfg) if moe else cfg.dense_mlp_params() // t
        dense += 2 * h + cfg.attention_params() // t + mlp
        tensors += 2 + 4 + (1 + 3 * cfg.n_shared_experts + 3 * per if moe else 3)
        if moe:
            experts += per * expert_params(cfg)
            expert_tensors += 3 * per
            moe_mlp += mlp + per * expert_params(cfg)
            moe_tensors += 1 + 3 * cfg.n_shared_experts + 3 * per
    if stage == dims.pp - 1:
        dense += h + (0 if cfg.tie_embeddings else cfg.vocab_size * h // t)
        tensors += 2 if not cfg.tie_embeddings else 1
    return {
        "dense": dense,
        "experts": experts,
        "tensors": tensors,
        "expert_tensors": expert_tensors,
        "moe": moe_mlp,  # router, shared and routed experts: replicated over tp
        "moe_tensors": moe_tensors,
    }


def moe_layers_in_stage(cfg: ModelConfig, pp: int, stage: int) -> int:
    return sum(i >= cfg.n_dense_layers for i in stage_blocks(cfg, pp, stage))


def data_axis_bytes(
    cfg: ModelConfig, dims: ParallelDims, stage: int, microbatches: int, *, dense: bool = True
) -> dict[str, float]:
    """Bytes a rank of ``stage`` sends per step without ZeRO on the data axis (its routing counts and
    its dense gradients, over dp×cp) and on the experts' replicas (``ep_replica``; the data axis
    itself when ep = 1). ``dense=False``: the routing counts only (under ZeRO the gradients travel
    in its flat units, ``theory.hybrid_zero``)."""
    n, p = dims.dp * dims.cp, stage_params(cfg, dims, stage)
    out = {"data": 0.0, "replica": 0.0}
    if n > 1:
        forwards = microbatches * moe_layers_in_stage(cfg, dims.pp, stage)
        out["data"] = forwards * sent_bytes("all_gather", 8 * cfg.n_experts * dims.tp * n, n)
        out["data"] += sent_bytes("all_reduce", FP32 * p["dense"], n) if dense else 0.0
    if n > dims.ep:
        out["replica"] = sent_bytes("all_reduce", FP32 * (p["experts"] + p["expert_tensors"]), n // dims.ep)
    return out


def tp_axis_bytes(
    cfg: ModelConfig,
    dims: ParallelDims,
    stage: int,
    *,
    rows: int,
    seq_len: int,
    sequence_parallel: bool,
    microbatches: int,
    flags: bool = True,
) -> float:
    """Bytes a rank of ``stage`` sends per step on tp for its MoE layers (``parallel.tp_moe``): the
    routing counts of every forward, the MoE gradients summed (with their "had a gradient" flags;
    ``flags=False`` under ZeRO, whose flat gradients always exist), and without SP the tokens'
    all-gather forward and its gradient's backward ([rows, s/cp, h] over the step)."""
    if dims.tp == 1:
        return 0.0
    t, p = dims.tp, stage_params(cfg, dims, stage)
    layers = moe_layers_in_stage(cfg, dims.pp, stage)
    out = microbatches * layers * sent_bytes("all_gather", 8 * cfg.n_experts * t, t)
    out += sent_bytes("all_reduce", FP32 * (p["moe"] + (p["moe_tensors"] if flags else 0)), t) if layers else 0
    if not sequence_parallel:
        out += layers * 2 * sent_bytes("all_gather", FP32 * rows * seq_len // dims.cp * cfg.hidden, t)
    return out


def for_tp_rank(forwards: list[dict], dims: ParallelDims, rank: int) -> list[dict]:
    """The routing as the ep ranks of ``rank``'s tp index see it: ``counts_by_rank`` rows are data
    rank major, tp minor (``parallel.tp_moe``); keep this tp index's rows, one per data rank."""
    if dims.tp == 1:
        return forwards
    t = dims.coords(rank)["tp"]
    return [f | {"counts_by_rank": f["counts_by_rank"][t :: dims.tp]} for f in forwards]


def replica_axis(dims: ParallelDims, rank: int, data_axis: str) -> str:
    """The name the experts' replica group of ``rank`` is measured under: as the mesh names a group
    that several axes share (``parallel.mesh``), the first axis with the same ranks (in dp2×cp2
    with ep2 the replicas are the dp group); ``data_axis``: the name of dp×cp."""
    mine = dims.ranks_along("ep_replica", rank)
    for axis in ("tp", "cp", "dp", "pp", "dp_cp"):
        if dims.size(axis) > 1 and dims.ranks_along(axis, rank) == mine:
            return data_axis if axis == "dp_cp" else axis
    return "ep_replica"


def stage_state_bytes(cfg: ModelConfig, dims: ParallelDims, stage: int) -> dict[str, int]:
    """Weights, gradients and AdamW state (two moments and a 4-byte step per tensor) of a rank of ``stage``."""
    p = stage_params(cfg, dims, stage)
    numel = p["dense"] + p["experts"]
    return {"params": FP32 * numel, "grads": FP32 * numel, "optimizer": 2 * FP32 * numel + 4 * p["tensors"]}


def moe_block_bytes(
    cfg: ModelConfig, dims: ParallelDims, *, rank: int, micro_batch: int, seq_len: int, layer: dict, **layout
) -> int:
    """Bytes one MoE block saves on ``rank`` for one micro-batch with the routing ``layer``: the
    dense block this layout runs (its attention under cp, ``theory.local_activations``) without
    the SwiGLU's four [b, s/cp, f] tensors, plus the MoE layer's own terms at the b·s/cp tokens
    this rank routes (``theory.moe.moe_mlp_activation_terms``, the slots S it sends and the rows R
    its experts receive)."""
    from playbook.theory.local_activations import activation_pieces

    dense = cfg.replace(n_experts=0, top_k=0, n_shared_experts=0, n_dense_layers=0)
    region = micro_batch * seq_len // dims.cp  # tokens of the dense MLP's region (whole sequence under TP)
    tokens = region // dims.tp  # tokens this rank routes
    block = activation_pieces(dense, dims, seq_len=seq_len, micro_batch=micro_batch, **layout)["block"]
    block -= 4 * region * (cfg.ffn_hidden // dims.tp) * FP32  # the SwiGLU's four tensors
    if dims.tp > 1:  # TP's region input [b, s/cp, h] is not saved; the router saves its own slice
        block += (tokens - region) * cfg.hidden * FP32
    S, R = rank_rows(layer["counts_by_rank"], layer["capacity"], dims.data_index(rank), dims.ep)
    return block + sum(moe_mlp_activation_terms(cfg, tokens=tokens, slots=S, rows=R).values())


def stage_activation_bytes(
    cfg: ModelConfig,
    dims: ParallelDims,
    stage: int,
    *,
    rank: int,
    rows: int,
    seq_len: int,
    forwards: list[dict],
    schedule: str = "1f1b",
    microbatches: int = 1,
    **layout,
) -> int | None:
    """Activation bytes at the step's peak on ``rank`` of stage ``stage``: each F of the schedule
    adds its micro-batch's bytes (the embedding, the stage's blocks with the routing of that
    micro-batch, the head), each B frees them (pp = 1: 1F1B of one stage). ``forwards``: the first
    step's routing of this rank's MoE layers, in the order they ran (``RoutingStats.as_dict``:
    ``counts_by_rank``, ``capacity``). ``layout``: ``sequence_parallel``, ``cp_variant``. A split
    backward (ZB-H1): None, not modelled for MoE layers."""
    from playbook.theory.local_activations import activation_pieces

    m = microbatches  # pp = 1: gradient accumulation, 1F1B of one stage
    b = rows // m
    piece = activation_pieces(cfg.replace(n_experts=0, top_k=0), dims, seq_len=seq_len, micro_batch=b, **layout)
    blocks = stage_blocks(cfg, dims.pp, stage)
    fixed = (stage == 0) * piece["first"] + (stage == dims.pp - 1) * piece["last"]
    fixed += sum(i < cfg.n_dense_layers for i in blocks) * piece["block"]
    per_f = moe_layers_in_stage(cfg, dims.pp, stage)
    forwards = for_tp_rank(forwards, dims, rank)
    sizes = dict(rank=rank, micro_batch=b, seq_len=seq_len, **layout)
    plan = make_schedule(schedule if dims.pp > 1 else "1f1b", dims.pp, m)
    if plan.split_backward:  # what W keeps of an MoE layer from B until W is not counted here
        return None
    now = peak = 0
    held: dict[int, int] = {}
    for a in plan.compute(stage):
        if a.kind == "F":
            layers, forwards = forwards[:per_f], forwards[per_f:]
            held[a.mb] = fixed + sum(moe_block_bytes(cfg, dims, layer=f, **sizes) for f in layers)
            now += held[a.mb]
        else:
            now -= held.pop(a.mb)
        peak = max(peak, now)
    return peak
