"""What activation recomputation sends again in a hybrid layout, and the one input it adds under CP.

What a block saves under each mode is a view of ``theory.inventory.inventory`` (each tensor tagged with the
modes that keep it); ``parallel.hybrid.recompute`` checkpoints what the rank runs:

- "selective" (Korthikanti et al. 2022, arXiv:2205.05198, §4): the core's own saved tensors (the
  ring's output and log-sum-exp, the all-gather core's repeated K/V, mask and probabilities, or
  Ulysses' full-sequence ones) are dropped; the checkpoint keeps the core's inputs instead: q at
  a/tp heads, k and v at g/tp heads, each of the rank's s/cp tokens;
- "full" (Chen et al. 2016, arXiv:1604.06174): each block keeps its input, [b, s/cp, h] ([b,
  s/(cp·tp), h] under SP); the RoPE positions ([s/cp] int64) are an input of every checkpoint too,
  one storage for the whole rank (:func:`positions_bytes`).

Either way the core reruns in backward, so its forward exchange is sent a second time
(:func:`cp_replay_bytes_per_layer`), as Megatron pays TP's collectives again under full
recomputation (Korthikanti et al. 2022, §5). A mixture of experts under "full" keeps its block's
input alone and reruns its routing and all-to-alls (:func:`moe_replay_bytes`; the saved bytes:
``theory.hybrid.moe.moe_block_bytes``); "selective" recomputes the attention core only, and the
MoE layer saves what it saves without recomputation. fp32. No torch.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.cost.comm import sent_bytes
from playbook.theory.cp import kv_shard_bytes
from playbook.theory.inventory.inventory import INDEX_BYTES

FP32 = 4


def local_heads(cfg: ModelConfig, tp: int) -> ModelConfig:
    """``cfg`` with the a/tp query and g/tp key/value heads one tp rank holds (head dim unchanged; at
    least one KV head: where tp exceeds g, a KV head is replicated over tp)."""
    return cfg.replace(n_heads=cfg.n_heads // tp, n_kv_heads=max(cfg.kv_heads // tp, 1), head_dim=cfg.dim_head)


def positions_bytes(dims: ParallelDims, seq_len: int, recompute: str) -> int:
    """Full recomputation under CP: the rank's RoPE positions, saved once as every block's input."""
    return INDEX_BYTES * (seq_len // dims.cp) if recompute == "full" and dims.cp > 1 else 0


def cp_replay_bytes_per_layer(
    cfg: ModelConfig, dims: ParallelDims, *, seq_len: int, micro_batch: int, variant: str, recompute: str
) -> float:
    """Bytes the recomputed attention core sends again in backward, per layer: the forward's part of
    ``theory.cp.comm_bytes_per_layer`` (ring: the K/V blocks, (n−1)·kv; all-gather: its all-gather,
    (n−1)·kv; Ulysses: its all-to-alls of q, k and v in, (n−1)/n·(q + kv), and under "full" also the
    output's back, (n−1)/n·q: non-reentrant checkpointing stops a recomputation once the last tensor
    backward needs exists, and under "selective" that is the core's attention, before its output leaves)."""
    if recompute == "none" or dims.cp == 1:
        return 0.0
    n, local = dims.cp, local_heads(cfg, dims.tp)
    kv = kv_shard_bytes(local, seq_len=seq_len, micro_batch=micro_batch, cp=n)
    if variant == "ulysses":
        q = FP32 * micro_batch * local.n_heads * (seq_len // n) * local.dim_head  # [b, a/tp, s/cp, d]
        return (n - 1) / n * (q + kv + (q if recompute == "full" else 0))
    return float((n - 1) * kv)


def moe_replay_bytes(
    cfg: ModelConfig, dims: ParallelDims, *, forwards: int, alltoall: float, recompute: str
) -> dict[str, float]:
    """Bytes a rank's MoE layers send again per step under "full" recomputation, by axis ("data" is
    dp×cp), given its ``forwards`` MoE forwards per step (micro-batches × the stage's MoE layers) and
    ``alltoall``, the step's all-to-all bytes without recomputation (``theory.moe.moe``: dispatch and
    combine forward, both again backward). The replay stops at the MoE layer's last saved tensor, its
    ``index_add`` of the gated rows: the routing counts are all-gathered again (int64 [E] per rank,
    over tp, then dp×cp), dispatch and combine run again (half of ``alltoall``), but the all-gather
    of the tokens under TP without SP (after the layer) does not. "selective" replays the attention
    core only: nothing of the MoE layer."""
    if recompute != "full":
        return {}
    n, t, E = dims.dp * dims.cp, dims.tp, cfg.n_experts
    out = {"ep": alltoall / 2}
    if t > 1:
        out["tp"] = forwards * sent_bytes("all_gather", 8 * E * t, t)
    if n > 1:
        out["data"] = forwards * sent_bytes("all_gather", 8 * E * t * n, n)
    return out


def held_with_positions(
    schedule, chunk_bytes, w_bytes, rank: int, once: int, blocks: list[bool], graph_until_w: bool = False
) -> int:
    """``theory.pp.simulator.held_bytes`` of ``rank``, plus ``once`` (the RoPE positions under "full"
    with CP, :func:`positions_bytes`) while the forward graph of any micro-batch on a chunk holding
    blocks (``blocks[c]``) is alive: from its F to its B, or to its W where W needs the graph
    (``w_bytes`` None, or ``graph_until_w``: TP layers). A split backward may peak after a B with no graph alive."""
    split, now, peak, live = schedule.split_backward, 0, 0, 0
    for a in schedule.compute(rank):
        whole = chunk_bytes[rank][a.chunk]
        w = (whole if w_bytes is None else w_bytes[rank][a.chunk]) if split else 0
        now += {"F": whole, "B": w - whole, "W": -w}[a.kind]
        ends = "W" if split and (w_bytes is None or graph_until_w) else "B"  # where this micro-batch's graph goes
        live += blocks[a.chunk] * (1 if a.kind == "F" else -1 if a.kind == ends else 0)
        peak = max(peak, now + once * (live > 0))
    return peak


def attention_w_bytes(
    cfg: ModelConfig, dims: ParallelDims, *, seq_len: int, micro_batch: int, sequence_parallel: bool = False
) -> int:
    """The attention half of what a block keeps from B until W under a split backward
    (``parallel.pp.executor``; Qi et al. 2023, arXiv:2401.10241, §2), each layer's input and output
    gradient once per storage, the block's input left out (:func:`tp_block_w_bytes`): inputs, q, k
    and v's (the attention norm's output, all-gathered [s, h] under SP), the attention output
    a·d/t, the residual sum h (the MLP norm's input); output gradients, the two norms' and o_proj's
    h each, q, k, v (a + 2g)·d/t. Under SP the h-wide tensors of the residual stream hold s/tp
    tokens. At s/cp tokens, a/t and g/t heads (t = tp; t = 1: the whole layer, on one rank)."""
    b, s, h, t = micro_batch, seq_len // dims.cp, cfg.hidden, dims.tp
    a, g, d = cfg.n_heads, cfg.kv_heads, cfg.dim_head
    stream = s // t if sequence_parallel else s  # tokens of the residual stream on this rank
    inputs = s * h + s * a * d // t + stream * h  # q/k/v's input (gathered), attention, residual sum
    grads = 3 * stream * h + s * (a + 2 * g) * d // t  # the two norms' and o_proj's outputs; q, k, v
    return FP32 * b * (inputs + grads)


def tp_block_w_bytes(
    cfg: ModelConfig, dims: ParallelDims, *, seq_len: int, micro_batch: int, sequence_parallel: bool
) -> int:
    """Bytes one tensor-parallel block adds from B until W under "full" recomputation with a split
    backward (``parallel.pp.executor``): its graph stays for the layers outside the blocks, and W
    takes each layer's input and output gradient from B's recomputation (Qi et al. 2023, §2), one
    storage each (the block's input is the graph's): the attention half (:func:`attention_w_bytes`)
    and the SwiGLU's, inputs gate and up's (the MLP norm's output, all-gathered under SP) h and
    gate·up f/t, output gradients down_proj's h (s/tp tokens under SP), gate and up 2·f/t. At s/cp tokens."""
    b, s, h, t, f = micro_batch, seq_len // dims.cp, cfg.hidden, dims.tp, cfg.ffn_hidden
    stream = s // t if sequence_parallel else s
    mlp = s * h + s * f // t + stream * h + 2 * s * f // t
    sizes = dict(seq_len=seq_len, micro_batch=micro_batch, sequence_parallel=sequence_parallel)
    return attention_w_bytes(cfg, dims, **sizes) + FP32 * b * mlp
