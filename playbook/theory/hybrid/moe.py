"""A mixture of experts in a hybrid layout: what one rank of one pipeline stage holds and sends.

A rank holds the pieces of its pipeline chunks (``theory.pp.rank_params``: one or v virtual stages,
equal or not): the embedding, the blocks (in an MoE block: norms, attention, the router, the shared
experts, and E/ep routed experts), the final norm and head. Each MoE forward all-gathers the routing counts over the data ranks (8-byte counts, E per
rank), so a step sends them m times per MoE layer of the stage; the dense gradients are
all-reduced over dp×cp and the experts' over their replicas, with one "had a gradient" flag per
expert tensor (``parallel.grads``). The activations depend on the routing of
each micro-batch (``theory.moe.moe.model_activation_bytes_moe``), so the stage's peak is played from
the schedule with each micro-batch's own bytes, chunk by chunk; a block's are a view of the one
inventory (``theory.inventory.inventory.ours_block``) at the rank's local shapes. fp32, no torch.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.cost.comm import sent_bytes
from playbook.theory.hybrid.recompute import attention_w_bytes, positions_bytes, tp_block_w_bytes
from playbook.theory.inventory.inventory import local, ours_block, view
from playbook.theory.hybrid.local_activations import activation_pieces
from playbook.theory.inventory.moe import moe_mlp_terms as moe_mlp_activation_terms
from playbook.theory.moe.capacity import rank_rows
from playbook.theory.pp.pipeline import chunk_w_bytes
from playbook.theory.pp.rank_params import blocks_in, chunk_ranges, is_moe_block, rank_units
from playbook.theory.pp.schedules import make_schedule

FP32 = 4


def stage_params(cfg: ModelConfig, dims: ParallelDims, stage: int, ranges=None) -> dict[str, int]:
    """Elements and tensors a rank of pipeline stage ``stage`` holds (its chunks ``ranges``; default
    one equal stage), summed from its units (``theory.pp.rank_params.rank_units``): ``dense``
    (replicated over dp×cp), ``experts`` (its E/ep routed experts) and their ``expert_tensors``,
    and ``moe``/``moe_tensors`` (router, shared and routed experts: whole on every tp rank, their
    gradients summed over tp)."""
    units = rank_units(cfg, dims, ranges if ranges is not None else chunk_ranges(cfg, dims.pp, stage))
    experts = [u for u in units if u.experts]
    return {
        "dense": sum(u.numel for u in units if not u.experts),
        "experts": sum(u.numel for u in experts),
        "expert_tensors": sum(u.tensors for u in experts),
        "moe": sum(u.moe for u in units),
        "moe_tensors": sum(u.moe_tensors for u in units),
    }


def moe_layers_in(cfg: ModelConfig, ranges: list[tuple[int, int]]) -> int:
    """How many MoE blocks the pieces of ``ranges`` hold."""
    return sum(is_moe_block(cfg, i) for i in blocks_in(cfg, ranges))


def data_axis_bytes(
    cfg: ModelConfig, dims: ParallelDims, stage: int, microbatches: int, *, dense: bool = True, ranges=None
) -> dict[str, float]:
    """Bytes a rank of ``stage`` (its chunks ``ranges``) sends per step without ZeRO on the data axis
    (its routing counts and its dense gradients, over dp×cp) and on the experts' replicas
    (``ep_replica``; the data axis itself when ep = 1). ``dense=False``: the routing counts only
    (under ZeRO the gradients travel in its flat units, ``theory.hybrid.zero``)."""
    ranges = ranges if ranges is not None else chunk_ranges(cfg, dims.pp, stage)
    n, p = dims.dp * dims.cp, stage_params(cfg, dims, stage, ranges)
    out = {"data": 0.0, "replica": 0.0}
    if n > 1:
        forwards = microbatches * moe_layers_in(cfg, ranges)
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
    ranges=None,
) -> float:
    """Bytes a rank of ``stage`` (its chunks ``ranges``) sends per step on tp for its MoE layers
    (``parallel.tp.moe``): the routing counts of every forward, the MoE gradients summed (with their
    "had a gradient" flags; ``flags=False`` under ZeRO, whose flat gradients always exist), and
    without SP the tokens' all-gather forward and its gradient's backward ([rows, s/cp, h] over the step)."""
    if dims.tp == 1:
        return 0.0
    ranges = ranges if ranges is not None else chunk_ranges(cfg, dims.pp, stage)
    t, p = dims.tp, stage_params(cfg, dims, stage, ranges)
    layers = moe_layers_in(cfg, ranges)
    out = microbatches * layers * sent_bytes("all_gather", 8 * cfg.n_experts * t, t)
    out += sent_bytes("all_reduce", FP32 * (p["moe"] + (p["moe_tensors"] if flags else 0)), t) if layers else 0
    if not sequence_parallel:
        out += layers * 2 * sent_bytes("all_gather", FP32 * rows * seq_len // dims.cp * cfg.hidden, t)
    return out


def for_tp_rank(forwards: list[dict], dims: ParallelDims, rank: int) -> list[dict]:
    """The routing as the ep ranks of ``rank``'s tp index see it: ``counts_by_rank`` rows are data
    rank major, tp minor (``parallel.tp.moe``); keep this tp index's rows, one per data rank."""
    if dims.tp == 1:
        return forwards
    t = dims.coords(rank)["tp"]
    return [f | {"counts_by_rank": f["counts_by_rank"][t :: dims.tp]} for f in forwards]


def replica_axis(dims: ParallelDims, rank: int, data_axis: str) -> str:
    """The name the experts' replica group of ``rank`` is measured under: as the mesh names a group
    that several axes share (``cluster.mesh``), the first axis with the same ranks (in dp2×cp2
    with ep2 the replicas are the dp group); ``data_axis``: the name of dp×cp."""
    mine = dims.ranks_along("ep_replica", rank)
    for axis in ("tp", "cp", "dp", "pp", "dp_cp"):
        if dims.size(axis) > 1 and dims.ranks_along(axis, rank) == mine:
            return data_axis if axis == "dp_cp" else axis
    return "ep_replica"


def moe_block_bytes(
    cfg: ModelConfig,
    dims: ParallelDims,
    *,
    rank: int,
    micro_batch: int,
    seq_len: int,
    layer: dict,
    sequence_parallel: bool = False,
    cp_variant: str = "ring",
    recompute: str = "none",
) -> int:
    """Bytes one MoE block saves on ``rank`` for one micro-batch with the routing ``layer``: the
    inventory's block at this layout's local shapes (its attention under cp) with the MoE layer's
    terms in place of the SwiGLU's (``theory.moe.moe.moe_mlp_activation_terms``) at the b·s/(cp·tp)
    tokens this rank routes, the slots S it sends and the rows R its experts receive. Under TP the
    region's gathered input is not saved: the router saves its own slice of the tokens. Viewed under
    ``recompute`` ("full": the block keeps its input alone, ``theory.hybrid.recompute``)."""
    tokens = micro_batch * seq_len // dims.cp // dims.tp  # tokens this rank routes
    S, R = rank_rows(layer["counts_by_rank"], layer["capacity"], dims.data_index(rank), dims.ep)
    terms = moe_mlp_activation_terms(cfg, tokens=tokens, slots=S, rows=R)
    x = local(cfg, seq_len=seq_len, micro_batch=micro_batch, tp=dims.tp, cp=dims.cp,
              sequence_parallel=sequence_parallel, dtype_bytes=FP32)  # fmt: skip
    core = cp_variant if dims.cp > 1 else "eager"
    block = ours_block(cfg, x, core=core, moe=terms, routed=tokens if dims.tp > 1 else None)
    return sum(view(block, recompute).values())


def moe_block_w_bytes(
    cfg: ModelConfig,
    dims: ParallelDims,
    *,
    rank: int,
    micro_batch: int,
    seq_len: int,
    layer: dict,
    sequence_parallel: bool = False,
    block_input: bool = True,
) -> int:
    """Bytes one MoE block keeps from B until W under a split backward (ZB-H1, ZB-V, DualPipe-V; Qi
    et al. 2023, arXiv:2401.10241, §2), as ``parallel.pp.executor`` keeps them: each layer's input
    and output gradient, once per storage, from F or, under full recomputation, from B's rerun of
    the block (the same tensors, the same bytes). The attention half
    (``theory.hybrid.recompute.attention_w_bytes``) and the block's input ([b, s/cp, h]; left out
    with ``block_input=False``, where the kept graph holds it: TP under "full"); the MoE layer at
    the T = b·s/(cp·tp) tokens this rank routes: the router's input T·h and its logits' gradient
    T·E, the R rows its experts received and their gradient (R·h each), their down-projections'
    inputs and the gate's and up's output gradients (3·R·f_e); each shared expert (Dai et al. 2024,
    arXiv:2401.06066) takes the router's input and adds 3·T·f_e, and all of them the gradient of
    the layer's output, T·h once (every shared output is a term of one sum)."""
    T, h, fe, n_s = micro_batch * seq_len // dims.cp // dims.tp, cfg.hidden, cfg.expert_ffn_hidden, cfg.n_shared_experts
    _, R = rank_rows(layer["counts_by_rank"], layer["capacity"], dims.data_index(rank), dims.ep)
    x = block_input * micro_batch * (seq_len // dims.cp // (dims.tp if sequence_parallel else 1)) * h
    moe = T * h + T * cfg.n_experts + 2 * R * h + 3 * R * fe + (n_s > 0) * T * h + 3 * n_s * T * fe
    sizes = dict(seq_len=seq_len, micro_batch=micro_batch, sequence_parallel=sequence_parallel)
    return attention_w_bytes(cfg, dims, **sizes) + FP32 * (x + moe)


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
    virtual_stages: int = 1,
    **layout,
) -> int:
    """Activation bytes at the step's peak on ``rank`` of pipeline stage ``stage``: each F of the
    schedule adds its micro-batch's bytes on that chunk (the embedding, the chunk's blocks with the
    routing of that forward, the head), each B frees them (pp = 1: 1F1B of one stage, gradient
    accumulation). ``forwards``: the first step's routing of this rank's MoE layers, in the order
    they ran (``RoutingStats.as_dict``: ``counts_by_rank``, ``capacity``). ``layout``:
    ``sequence_parallel``, ``cp_variant``, ``recompute``. A split backward (ZB-H1, ZB-V, DualPipe-V)
    keeps, from B until W, what W needs: without TP each layer's input and output gradient
    (:func:`moe_block_w_bytes`, ``theory.pp.pipeline.chunk_w_bytes``), with TP layers the whole graph
    and, under "full", the tensors W takes from B's recomputation
    (``theory.hybrid.recompute.tp_block_w_bytes``). Under "full" with CP the RoPE positions, one
    storage, are held while any forward graph of blocks is (``theory.hybrid.recompute.positions_bytes``)."""
    pp, L = dims.pp, cfg.n_layers
    m, v = microbatches, virtual_stages if pp > 1 else 1  # pp = 1: gradient accumulation
    schedule = schedule if pp > 1 else "1f1b"
    b, recompute, sp = rows // m, layout.get("recompute", "none"), layout.get("sequence_parallel", False)
    piece = activation_pieces(cfg.replace(n_experts=0, top_k=0), dims, seq_len=seq_len, micro_batch=b, **layout)
    ranges = chunk_ranges(cfg, pp, stage, schedule, v)
    dense_blocks = [sum(not is_moe_block(cfg, i) for i in blocks_in(cfg, [rg])) for rg in ranges]
    fixed = [
        (start == 0) * piece["first"] + (end == L + 2) * piece["last"] + n * piece["block"]
        for (start, end), n in zip(ranges, dense_blocks)
    ]
    per_f = [moe_layers_in(cfg, [rg]) for rg in ranges]  # MoE forwards of one F on each chunk
    holds_blocks = [bool(blocks_in(cfg, [rg])) for rg in ranges]
    forwards = for_tp_rank(forwards, dims, rank)
    sizes = dict(rank=rank, micro_batch=b, seq_len=seq_len)
    once = positions_bytes(dims, seq_len, recompute)  # "full" under CP: one storage
    plan = make_schedule(schedule, pp, m, v)
    split, lean = plan.split_backward, dims.tp == 1  # lean: W from inputs and output gradients alone
    dense, s_local = cfg.replace(n_experts=0, top_k=0, n_dense_layers=0), seq_len // dims.cp
    w_block = chunk_w_bytes(dense, 1, 2, b, s_local)  # one dense block's W part
    w_fixed = [
        chunk_w_bytes(dense, start, end, b, s_local) - moe_layers_in(cfg, [(start, end)]) * w_block
        for start, end in ranges
    ]
    tp_more = tp_block_w_bytes(cfg, dims, seq_len=seq_len, micro_batch=b, sequence_parallel=sp)
    now = peak = live = 0  # live: forward graphs of chunks with blocks (the positions' holders)
    held: dict[tuple[int, int], tuple[int, int]] = {}  # (micro-batch, chunk) -> (its bytes, its W part)
    for a in plan.compute(stage):
        key = a.mb, a.chunk
        if a.kind == "F":
            layers, forwards = forwards[: per_f[a.chunk]], forwards[per_f[a.chunk] :]
            whole = fixed[a.chunk] + sum(moe_block_bytes(cfg, dims, layer=f, **sizes, **layout) for f in layers)
            w = 0
            if split and lean:
                w = w_fixed[a.chunk] + sum(moe_block_w_bytes(cfg, dims, layer=f, **sizes) for f in layers)
            elif split:  # TP layers: W runs on the kept graph; under "full" with B's recomputed tensors too
                w = whole
                if recompute == "full":
                    more = [moe_block_w_bytes(cfg, dims, layer=f, sequence_parallel=sp, block_input=False, **sizes)
                            for f in layers]  # fmt: skip
                    w += dense_blocks[a.chunk] * tp_more + sum(more)
            held[key] = (whole, w)
            now += whole
            live += holds_blocks[a.chunk]
        elif a.kind == "B":
            whole, w = held[key] if split else held.pop(key)
            now += w - whole
            live -= holds_blocks[a.chunk] * (not split or lean)  # the graph goes at B, or at W (TP)
        else:
            now -= held.pop(key)[1]
            live -= holds_blocks[a.chunk] * (not lean)
        peak = max(peak, now + once * (live > 0))
    return peak
