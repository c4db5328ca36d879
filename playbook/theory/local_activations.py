"""Activations from a rank's local shapes: one micro-batch's saved bytes by piece (embedding,
block, head) as a rank of any layout sees them (s/cp tokens, s/(cp·tp) outside the parallel
regions under sequence parallelism, a/tp query and g/tp key/value heads, CP's attention core),
and the bytes a pipeline stage holds at the step's peak when the schedule keeps several
micro-batches of them (``theory.schedules.held_bytes``). ``theory.hybrid.memory_per_rank`` reads
it for every layout of the composition matrix, without a case per pair of axes.

Counts per piece: ``theory.tp`` (Megatron's block, Korthikanti et al. 2022, arXiv:2205.05198),
``theory.cp`` (ring, all-gather and Ulysses cores), ``theory.activations`` (the plain block), put
together by ``theory.stages._block_activations``; under recomputation with CP,
``theory.hybrid_recompute``; TP with CP is :func:`tp_cp_block_bytes`. fp32.
No torch.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.schedules import make_schedule

FP32 = 4


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
    inputs), "block" (one block), "last" (final norm, head, loss), from the shapes the rank sees:
    s/cp tokens (s/(cp·tp) outside the parallel regions under SP), a/tp query and g/tp key/value
    heads, CP's attention core (``theory.stages._block_activations``, ``end_activations``). Every
    layout reads these: a stage is its pieces, a pipeline holds the schedule's micro-batches of them."""
    from playbook.theory.stages import _block_activations, end_activations  # lazily: stages imports this module too

    sizes = dict(micro_batch=micro_batch, tp=dims.tp, sequence_parallel=sequence_parallel)
    first, last = end_activations(cfg, seq_len=seq_len // dims.cp, **sizes)
    kept = "none" if dims.cp > 1 else recompute  # CP's core under recomputation: ``theory.hybrid_recompute``
    block = _block_activations(
        cfg, 0, seq_len=seq_len, cp=dims.cp, dtype_bytes=FP32, recompute=kept, variant=cp_variant, **sizes
    )
    if dims.cp > 1 and recompute != "none":
        from playbook.theory.hybrid_recompute import cp_block_bytes

        block = cp_block_bytes(
            cfg,
            dims,
            seq_len=seq_len,
            micro_batch=micro_batch,
            recompute=recompute,
            none_bytes=block,
            sequence_parallel=sequence_parallel,
            variant=cp_variant,
        )
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
    (``theory.pipeline.stage_ranges``), held as the schedule holds them on this rank's chunks
    (``theory.schedules.held_bytes``; pp = 1: one micro-batch's forward, 1F1B of one stage). A split backward (ZB-H1,
    ZB-V, DualPipe-V) without TP keeps only W's part from B to W (``chunk_w_bytes``, at s/cp tokens);
    with TP layers, the graph."""
    from playbook.theory.schedules import equal_partition, held_bytes

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
    from playbook.theory.hybrid_recompute import positions_bytes

    once = positions_bytes(dims, seq_len, recompute)  # full recomputation under CP: one storage per rank
    if pp == 1:
        return per_stage[0] + once
    plan = make_schedule(schedule, pp, microbatches, v)
    w = None
    if plan.split_backward and dims.tp == 1:
        from playbook.theory.pipeline import chunk_w_bytes

        w_stage = [chunk_w_bytes(cfg, *rg, b, seq_len // dims.cp) for rg in ranges]
        w = [[w_stage[plan.stage(r, c)] for c in range(v)] for r in range(pp)]
    chunks = [[per_stage[plan.stage(r, c)] for c in range(v)] for r in range(pp)]
    holds_blocks = any(n_blocks[plan.stage(stage, c)] for c in range(v))
    return held_bytes(plan, chunks, w)[stage] + once * holds_blocks


def tp_cp_block_bytes(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int,
    cp: int,
    variant: str = "ring",
    sequence_parallel: bool = False,
    dtype_bytes: int = 4,
) -> int:
    """Bytes one block saves on a rank of a tp × cp layout: tensor parallelism's block at s/cp tokens
    (``theory.tp``: norms, region inputs, the MLP's f/t channels, the o_proj input of a/t heads) with
    its attention core (q, repeated k and v, mask, probabilities) replaced by context parallelism's
    core (``theory.cp``: RoPE at this shard's positions, q, the own K/V shard, the ring output and
    its fp32 log-sum-exp) for this rank's a/t query and g/t key/value heads."""
    from playbook.theory.cp import cp_block_activation_breakdown
    from playbook.theory.hybrid_recompute import OUTSIDE_CORE
    from playbook.theory.tp import tp_block_activation_breakdown

    tp_parts = tp_block_activation_breakdown(
        cfg,
        seq_len=seq_len // cp,
        micro_batch=micro_batch,
        tp=tp,
        sequence_parallel=sequence_parallel,
        dtype_bytes=dtype_bytes,
    )
    local = cfg.replace(n_heads=cfg.n_heads // tp, n_kv_heads=cfg.kv_heads // tp, head_dim=cfg.dim_head)
    cp_parts = cp_block_activation_breakdown(
        local, seq_len=seq_len, micro_batch=micro_batch, cp=cp, variant=variant, dtype_bytes=dtype_bytes
    )
    outside = sum(v for k, v in tp_parts.items() if k.startswith(OUTSIDE_CORE))
    core = sum(v for k, v in cp_parts.items() if not k.startswith(OUTSIDE_CORE))
    return outside + core
