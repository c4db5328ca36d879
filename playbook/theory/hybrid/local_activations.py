"""Activations from a rank's local shapes: one micro-batch's saved bytes by piece (embedding,
block, head) as a rank of any layout sees them (s/cp tokens, s/(cp·tp) outside the parallel
regions under sequence parallelism, a/tp query and g/tp key/value heads, CP's attention core),
and the bytes a pipeline stage holds at the step's peak when the schedule keeps several
micro-batches of them (``theory.pp.simulator.held_bytes``). ``theory.hybrid.hybrid.memory_per_rank`` and
``theory.hybrid.stages`` read it for every layout, without a case per pair of axes.

Every block is a view (``theory.inventory.inventory.view``) of the one inventory of our block's tensors
(``theory.inventory.inventory.ours_block``, Korthikanti et al. 2022, arXiv:2205.05198, for the counts and
the recomputation modes) at the rank's local shapes: tensor parallelism divides heads and
channels, sequence parallelism the norms' tokens, context parallelism the tokens and swaps the
attention core for its ring, all-gather or Ulysses kernel (``theory.cp``). No torch.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.inventory.activations import _check, check_attention
from playbook.theory.cp import VARIANTS as CP_CORES
from playbook.theory.hybrid.recompute import held_with_positions, positions_bytes, tp_block_w_bytes
from playbook.theory.inventory.inventory import local, ours_block, ours_ends, view
from playbook.theory.pp.layer_partition import equal_partition
from playbook.theory.inventory.moe import moe_mlp_terms
from playbook.theory.pp.pipeline import chunk_w_bytes
from playbook.theory.pp.simulator import held_bytes
from playbook.theory.pp.schedules import make_schedule
from playbook.theory.tp.layout import check_tp

FP32 = 4


def block_bytes(
    cfg: ModelConfig,
    moe: bool = False,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
    dtype_bytes: int = 4,
    recompute: str = "none",
    attention: str = "eager",
    variant: str | None = "ring",
) -> int:
    """Bytes one block saves for one micro-batch on a rank of tp × cp: the inventory at s/cp tokens,
    a/tp heads, f/tp channels. ``variant``: the CP attention core (ring, all-gather, Ulysses;
    ``theory.cp``); None: the ``attention`` kernel at s/cp tokens instead, a fused ring kernel
    (what ``training_memory`` assumes whenever it counts flash attention or recomputation).
    ``moe``: an MoE block at even routing with nothing dropped, behind the ``attention`` kernel: T
    tokens routed, S = k·T slots sent and R = k·T rows received (``theory.inventory.moe``). R = k·T
    holds at any ep: each of the ep ranks of a group sends k·T/E slots to each expert, and a rank's
    E/ep experts receive ep · (E/ep) · k·T/E = k·T rows; a real router's uneven counts move R (and,
    with a capacity factor, S) around it (``theory.moe.moe.model_activation_bytes_moe``). Under TP as
    our runtime splits it (``parallel.tp.moe``): each tp rank routes its 1/tp of the tokens through
    a whole router and whole experts, and saves no gathered region input."""
    core = variant if cp > 1 and variant is not None and not moe else attention
    if tp > 1:
        check_tp(cfg, tp, seq_len=seq_len // cp, sequence_parallel=sequence_parallel)
    if core in CP_CORES or (cp > 1 and variant is not None and not moe):
        if variant not in CP_CORES:
            raise ValueError(f"variant must be one of {', '.join(CP_CORES)}; got {variant!r}")
        if seq_len % cp:
            raise ValueError(f"seq_len={seq_len} does not split over cp={cp}; use a multiple of {cp}")
    else:
        check_attention(attention)
    _check(cfg, seq_len // cp, micro_batch, dtype_bytes, recompute)
    x = local(cfg, seq_len=seq_len, micro_batch=micro_batch, tp=tp, cp=cp, sequence_parallel=sequence_parallel,
              dtype_bytes=dtype_bytes)  # fmt: skip
    terms = routed = None
    if moe:
        routed = micro_batch * (seq_len // cp) // tp  # tokens this rank routes
        slots = cfg.top_k * routed
        terms = moe_mlp_terms(cfg, tokens=routed, slots=slots, rows=slots, dtype_bytes=dtype_bytes)
    return sum(view(ours_block(cfg, x, core=core, moe=terms, routed=routed if tp > 1 else None), recompute).values())


def end_activations(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    dtype_bytes: int = 4,
    recompute: str = "none",
) -> tuple[int, int]:
    """Bytes saved outside the blocks for one micro-batch of ``seq_len`` tokens on one rank: (the
    first stage's embedding inputs, the last stage's final norm, head and loss). Under TP, our
    vocab-parallel embedding and head (``theory.inventory.inventory.ours_ends``)."""
    if tp > 1:
        check_tp(cfg, tp, seq_len=seq_len, sequence_parallel=sequence_parallel)
    else:
        _check(cfg, seq_len, micro_batch, dtype_bytes, recompute)
    x = local(cfg, seq_len=seq_len, micro_batch=micro_batch, tp=tp, sequence_parallel=sequence_parallel,
              dtype_bytes=dtype_bytes)  # fmt: skip
    first, last = ours_ends(cfg, x, tp=tp if tp > 1 else None)
    return sum(first.values()), sum(last.values())


def activation_pieces(
    cfg: ModelConfig,
    dims: ParallelDims,
    *,
    seq_len: int,
    micro_batch: int,
    sequence_parallel: bool = False,
    cp_variant: str = "ring",
    recompute: str = "none",
) -> dict[str, int]:
    """Bytes one micro-batch of a dense model saves on one rank, by piece: "first" (the embedding's
    inputs), "block" (one block), "last" (final norm, head, loss), from the shapes the rank sees.
    Under CP with recomputation, ``parallel.hybrid.recompute`` checkpoints the CP core: "selective"
    keeps its inputs (q, k, v at this rank's heads), "full" the block's input (``theory.hybrid.recompute``).
    Every layout reads these: a stage is its pieces, a pipeline holds the schedule's micro-batches of them."""
    sizes = dict(micro_batch=micro_batch, tp=dims.tp, sequence_parallel=sequence_parallel)
    first, last = end_activations(cfg, seq_len=seq_len // dims.cp, **sizes)
    block = block_bytes(cfg, seq_len=seq_len, cp=dims.cp, dtype_bytes=FP32, recompute=recompute, variant=cp_variant,
                        **sizes)  # fmt: skip
    return {"first": first, "block": block, "last": last}


def stage_activation_bytes(
    cfg: ModelConfig,
    dims: ParallelDims,
    stage: int,
    *,
    rows: int,
    seq_len: int,
    schedule: str = "1f1b",
    microbatches: int = 1,
    sequence_parallel: bool = False,
    cp_variant: str = "ring",
    virtual_stages: int = 1,
    recompute: str = "none",
) -> int:
    """Activation bytes at the step's peak on a rank of pipeline stage ``stage`` holding ``rows``
    rows: one micro-batch's pieces (:func:`activation_pieces`) of each of the pp·v virtual stages
    (``theory.pp.pipeline.stage_ranges``), held as the schedule holds them on this rank's chunks
    (``theory.pp.simulator.held_bytes``; pp = 1: one micro-batch's forward, 1F1B of one stage). A split backward (ZB-H1,
    ZB-V, DualPipe-V) without TP keeps only W's part from B to W (``chunk_w_bytes``, at s/cp tokens);
    with TP layers, the graph (under "full", with W's tensors from B's recomputation:
    ``theory.hybrid.recompute.tp_block_w_bytes``)."""
    pp, L = dims.pp, cfg.n_layers
    b = rows // microbatches  # pp = 1 too: its m micro-batches are gradient accumulation
    piece = activation_pieces(
        cfg,
        dims,
        seq_len=seq_len,
        micro_batch=b,
        sequence_parallel=sequence_parallel,
        cp_variant=cp_variant,
        recompute=recompute,
    )
    v = virtual_stages if pp > 1 else 1
    ranges = equal_partition(L, pp * v)  # pieces [start, end) of each virtual stage
    n_blocks = [max(0, min(end, L + 1) - max(start, 1)) for start, end in ranges]
    per_stage = [
        (start == 0) * piece["first"] + n * piece["block"] + (end == L + 2) * piece["last"]
        for (start, end), n in zip(ranges, n_blocks)
    ]
    once = positions_bytes(dims, seq_len, recompute)  # full recomputation under CP: one storage per rank
    if pp == 1:
        return per_stage[0] + once
    plan = make_schedule(schedule, pp, microbatches, v)
    w = None
    if plan.split_backward and dims.tp == 1:
        w_stage = [chunk_w_bytes(cfg, *rg, b, seq_len // dims.cp) for rg in ranges]
        w = [[w_stage[plan.stage(r, c)] for c in range(v)] for r in range(pp)]
    elif plan.split_backward and recompute == "full":  # TP: the graph, and W's tensors from B's recomputation
        more = tp_block_w_bytes(cfg, dims, seq_len=seq_len, micro_batch=b, sequence_parallel=sequence_parallel)
        w = [[per_stage[plan.stage(r, c)] + n_blocks[plan.stage(r, c)] * more for c in range(v)] for r in range(pp)]
    chunks = [[per_stage[plan.stage(r, c)] for c in range(v)] for r in range(pp)]
    if once:  # one storage, held while any forward graph of blocks is (``theory.hybrid.recompute``)
        blocks = [n_blocks[plan.stage(stage, c)] > 0 for c in range(v)]
        return held_with_positions(plan, chunks, w, stage, once, blocks, graph_until_w=dims.tp > 1)
    return held_bytes(plan, chunks, w)[stage]
