"""Predict: what each pipeline rank holds, from the layout alone (no run needed).

Our GPT in pieces: piece 0 is the embedding, pieces 1..L the blocks, piece L+1 the final norm,
head and loss. A virtual stage is a contiguous range of pieces; rank r holds the ranges of its
stages ``schedule.stage(r, c)`` (``playbook.theory.pp.schedules``). From the ranges follow, exactly:
the activation bytes autograd saves for one micro-batch of a chunk (``chunk_activation_bytes``,
built on ``playbook.theory.inventory.activations``), and a rank's memory by category in fp32 with AdamW
(``predicted_memory``: its parameters, ``theory.pp.rank_params``, gradients, optimizer state, and
the schedule's peak of held activations, ``held_bytes``), and with a split backward (ZB-H1) the
smaller part one micro-batch keeps from B until W (``chunk_w_bytes``). ``playbook.measure.held`` measures the same bytes on real ranks.
"""

from __future__ import annotations

from playbook.dims import ParallelDims
from playbook.theory.inventory.activations import block_activation_bytes
from playbook.theory.inventory.inventory import INDEX_BYTES, local, ours_ends
from playbook.theory.pp.layer_partition import equal_partition
from playbook.theory.pp.rank_params import rank_units
from playbook.theory.pp.simulator import held_bytes
from playbook.theory.pp.types import Schedule


def stage_ranges(cfg, n_stages: int, partition=None) -> list[tuple[int, int]]:
    """Pieces per virtual stage: ``partition`` if given (e.g. ``balanced_partition`` of measured
    costs), else equal block counts with the embedding on the first stage and the head on the last."""
    if n_stages > cfg.n_layers + 2:
        raise ValueError(
            f"{n_stages} stages but {cfg.n_layers} layers plus embedding and head; use stages <= {cfg.n_layers + 2}"
        )
    ranges = list(partition) if partition is not None else equal_partition(cfg.n_layers, n_stages)
    if len(ranges) != n_stages or ranges[0][0] != 0 or ranges[-1][1] != cfg.n_layers + 2:
        raise ValueError(
            f"partition must be {n_stages} contiguous ranges covering pieces 0..{cfg.n_layers + 1}; got {ranges}"
        )
    return ranges


def chunk_activation_bytes(cfg, start: int, end: int, micro_batch: int, seq_len: int, dtype_bytes: int = 4) -> int:
    """Predicted bytes autograd saves for one micro-batch on pieces [start, end): its blocks
    (``playbook.theory.inventory.activations``) and, on the end pieces, what the one inventory keeps outside
    the blocks (``theory.inventory.inventory.ours_ends``: tokens; final norm, log-probabilities, targets)."""
    L = cfg.n_layers
    n_blocks = max(0, min(end, L + 1) - max(start, 1))
    total = n_blocks * block_activation_bytes(cfg, seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes)
    first, last = ours_ends(cfg, local(cfg, seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes))
    return total + (start == 0) * sum(first.values()) + (end == L + 2) * sum(last.values())


def chunk_w_bytes(cfg, start: int, end: int, micro_batch: int, seq_len: int, dtype_bytes: int = 4) -> int:
    """Predicted bytes one micro-batch keeps on pieces [start, end) from its B until its W, when the
    backward is split (ZB-H1, Qi et al. 2023, arXiv:2401.10241, §2: W needs each linear's input and
    the gradient of its output, not the rest of the graph). Our executor keeps, for every module that
    owns parameters, its input and its output gradient, once per storage (elements; × B unless noted):

        a block      inputs   x, norm outputs 2·h, attention output a·d, residual sum h, gate·up f
                     grads    norm outputs 2·h, q a·d, k and v 2·g·d, o_proj and down_proj 2·h, gate and up 2·f
                     together b·s·(8h + 2ad + 2gd + 3f)
        embedding    token ids b·s (int64) and the gradient of its output b·s·h
        head         the final norm's input h and output gradient h, lm_head's input h, logits' gradient V
    """
    if cfg.is_moe or cfg.attention != "gqa":
        raise ValueError("chunk_w_bytes counts dense GQA blocks only; use a dense preset such as gpt-tiny")
    b, s, h, V, B, f = micro_batch, seq_len, cfg.hidden, cfg.vocab_size, dtype_bytes, cfg.ffn_hidden
    a, g, d, L = cfg.n_heads, cfg.kv_heads, cfg.dim_head, cfg.n_layers
    n_blocks = max(0, min(end, L + 1) - max(start, 1))
    total = n_blocks * b * s * (8 * h + 2 * a * d + 2 * g * d + 3 * f) * B
    if start == 0:
        total += b * s * INDEX_BYTES + b * s * h * B
    if end == L + 2:
        total += b * s * (3 * h + V) * B
    return total


def predicted_memory(setup, schedule: Schedule, rank: int = 0, partition=None) -> dict[str, int]:
    """Bytes on ``rank`` for a ``TrainSetup`` in fp32 with AdamW: its chunks' parameters, as many
    gradient bytes, two moments plus a 4-byte step counter per tensor; activations: the schedule's
    peak (``held_bytes``)."""
    cfg = setup.config()
    ranges = stage_ranges(cfg, schedule.n_stages, partition)
    mine = [ranges[schedule.stage(rank, c)] for c in range(schedule.v)]
    units = rank_units(cfg, ParallelDims(pp=schedule.p), mine)  # the one list of a rank's parameters
    n_params, n_tensors = sum(u.numel for u in units), sum(u.tensors for u in units)
    b = setup.global_batch // schedule.m
    per_chunk = [
        [chunk_activation_bytes(cfg, *ranges[schedule.stage(r, c)], b, setup.seq_len) for c in range(schedule.v)]
        for r in range(schedule.p)
    ]
    w = None
    if schedule.split_backward:
        w = [
            [chunk_w_bytes(cfg, *ranges[schedule.stage(r, c)], b, setup.seq_len) for c in range(schedule.v)]
            for r in range(schedule.p)
        ]
    return {
        "params": 4 * n_params,
        "grads": 4 * n_params,
        "optimizer": 8 * n_params + 4 * n_tensors,
        "activations": held_bytes(schedule, per_chunk, w)[rank],
    }
