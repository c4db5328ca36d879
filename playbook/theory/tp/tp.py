"""Predict tensor and sequence parallelism: weights, collectives and activations per rank (no torch).

Notation as in ``playbook.theory.inventory.activations``: b micro-batch, s sequence, h hidden, a query heads,
g key/value heads, d head dim, f ffn_hidden, V vocabulary, L layers, t tensor-parallel degree,
B bytes per element of the activations (4 in our fp32 CPU runs, 2 in bf16).

Weights (Shoeybi et al. 2019, arXiv:1909.08053, §3): q/k/v, gate/up and the output head are split
by output channels (column parallel), o and down by input channels (row parallel), the embedding by
vocabulary rows: each rank holds 1/t of them. The RMSNorm weights (2h per layer, h for the final
norm) are replicated on every rank.

Communication per layer per micro-batch (Narayanan et al. 2021, arXiv:2104.04473, §3.2): tensor
parallelism all-reduces the [b, s, h] activation twice in the forward pass (after attention, after
the MLP: Megatron's g) and twice in the backward pass (before each: f). A ring all-reduce of S bytes
sends 2S(t−1)/t per rank (``theory.cost.comm``), so with S = B·bsh

    per layer, forward  = 2 · 2·B·bsh·(t−1)/t = 4·B·bsh·(t−1)/t    (= 8bsh(t−1)/t in 16-bit)
    per layer, backward = the same.

The paper's 8bsh(t−1)/t counts *elements*, forward and backward together; that it equals the 16-bit
*bytes* of one direction is a coincidence (2 bytes per element, 2 directions).

Sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198, §4.2.2) splits each all-reduce into
its two halves: an all-gather (S(t−1)/t) where a region starts and a reduce-scatter (S(t−1)/t) where
it ends, forward and backward, so the bytes are the same. Around the layers, our model adds: the
vocabulary-parallel embedding (one all-reduce, or reduce-scatter with SP, forward; its conjugate
backward), the head's entry (f or all-gather), the vocabulary-parallel cross-entropy (two small
all-reduces: the per-token max, and [Σexp, target logit]), and with SP one all-reduce of the
replicated norm weights' gradients per step (each rank saw only s/t of the tokens).

Activations: the exact count of what autograd saves for OUR tensor-parallel model
(``playbook.parallel.tp.model``), measured to the byte in ``tests/parallel/tp/test_tp.py``. Compare with
Korthikanti et al.'s Table 2 (``theory.hybrid.memory.activation_bytes_per_layer``), which counts a GPT
block with dropout and, for sequence parallelism, Megatron's trick of saving the sequence shard of
each parallel region's input and all-gathering it again in backward. By default our model saves the
gathered input (2 tensors of B·bsh per layer) and skips that extra all-gather; ``regather=True``
does what Megatron does (2 more all-gathers per layer in backward; every saved tensor of a block but
the causal mask is then divided by t). ``recompute`` ("selective", "full") follows
``theory.inventory.activations``; "full" also repeats forward collectives in backward (:func:`step_collectives`).

Units: bytes; seconds; FLOP/s. Pure arithmetic, fast enough for every slider move.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.theory.inventory.inventory import local, ours_block, ours_ends, view
from playbook.theory.inventory.inventory import RECOMPUTE_MODES
from playbook.theory.inventory.model_state import TrainingMemory, model_state_bytes
from playbook.theory.tp.comm import layer_comm, layer_seconds, layer_summary, step_collectives, summarize
from playbook.theory.tp.layout import check_tp, matrix_shards, params_per_rank, valid_tp

__all__ = [
    "check_tp", "layer_comm", "layer_seconds", "layer_summary", "matrix_shards", "params_per_rank",
    "step_collectives", "summarize", "tp_block_activation_breakdown", "tp_model_activation_breakdown",
    "tp_model_activation_bytes", "tp_training_memory", "valid_tp",
]  # fmt: skip


# ---- activations -------------------------------------------------------------------------------
def tp_block_activation_breakdown(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool = False,
    regather: bool = False,
    recompute: str = "none",
    dtype_bytes: int = 4,
    attention: str = "eager",
) -> dict[str, int]:
    """Bytes one rank's block of our TP model saves for backward, term by term.

    Compared with the single-process block (``theory.inventory.activations``): everything between entering and
    leaving a parallel region (q, k, v, the attention core, the attention output; the four SwiGLU
    tensors) is divided by t, because each rank holds a/t heads and f/t ffn channels. The norms and
    the residual stream stay whole under plain TP; with SP they hold s/t of the sequence, and the
    input of each region (the all-gathered norm output, saved by q/k/v and by gate/up) is whole,
    unless ``regather`` saves its sequence shard instead: then every term but the causal mask is
    divided by t, the shape of Korthikanti et al.'s TP+SP row sbh(34/t + 5as/(ht)).

    Recomputation as in ``theory.inventory.activations``: "selective" keeps q, k, v (a/t, g/t, g/t heads)
    instead of the attention core's tensors; "full" keeps only the block's input ([b, s/t, h] with SP).
    ``attention="flash"`` (a fused kernel, Dao et al. 2022, arXiv:2205.14135): selective's terms
    plus the kernel's fp32 log-sum-exp over this rank's a/t heads (``theory.inventory.activations``).
    """
    check_tp(cfg, tp, seq_len=seq_len, sequence_parallel=sequence_parallel, regather=regather)
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {', '.join(map(repr, RECOMPUTE_MODES))}; got {recompute!r}")
    if attention not in ("eager", "flash"):
        raise ValueError(f"attention must be one of 'eager', 'flash'; got {attention!r}")
    sizes = dict(tp=tp, sequence_parallel=sequence_parallel, regather=regather, dtype_bytes=dtype_bytes)
    x = local(cfg, seq_len=seq_len, micro_batch=micro_batch, **sizes)
    return view(ours_block(cfg, x, core=attention), recompute)


def tp_model_activation_breakdown(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool = False,
    regather: bool = False,
    recompute: str = "none",
    dtype_bytes: int = 4,
    attention: str = "eager",
) -> dict[str, int]:
    """Bytes one rank saves for one forward of our whole TP model with its vocabulary-parallel loss:
    embedding (the local token ids, int64, and the "owned by another rank" mask), the blocks, the
    final norm (on s/t tokens with SP) and the head's input, and the loss's softmax over this rank's
    V/t vocabulary slice (fp32 whatever B: the loss is computed in fp32, as Megatron-LM does) plus the
    targets (int64). The full [b, s, V] logits never exist."""
    sizes = dict(
        seq_len=seq_len,
        micro_batch=micro_batch,
        tp=tp,
        sequence_parallel=sequence_parallel,
        regather=regather,
        dtype_bytes=dtype_bytes,
    )
    block = sum(tp_block_activation_breakdown(cfg, **sizes, recompute=recompute, attention=attention).values())
    first, last = ours_ends(cfg, local(cfg, **sizes), tp=tp)
    return first | {"blocks": cfg.n_layers * block} | last


def tp_model_activation_bytes(cfg: ModelConfig, **sizes) -> int:
    """Sum of :func:`tp_model_activation_breakdown`: the function ``training_memory(tp=...)`` calls."""
    return sum(tp_model_activation_breakdown(cfg, **sizes).values())


def tp_training_memory(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool = False,
    regather: bool = False,
    recompute: str = "none",
    precision: str = "fp32",
    n_tensors: int = 0,
) -> TrainingMemory:
    """Bytes one tensor-parallel rank holds by category: params/grads/Adam for its own parameters
    (:func:`params_per_rank`, ZeRO's per-parameter bytes), activations exactly as above (B = 4 for
    fp32, 2 for mixed). ``n_tensors``: AdamW's 4-byte step counter per tensor (every rank holds a
    slice of every tensor, so all of them)."""
    p = params_per_rank(cfg, tp)
    state = model_state_bytes(p["split"] + p["replicated"], precision=precision, n_tensors=n_tensors)
    acts = tp_model_activation_bytes(
        cfg,
        seq_len=seq_len,
        micro_batch=micro_batch,
        tp=tp,
        sequence_parallel=sequence_parallel,
        regather=regather,
        recompute=recompute,
        dtype_bytes=4 if precision == "fp32" else 2,
    )
    return TrainingMemory(params=state.params, grads=state.grads, optimizer=state.optimizer, activations=float(acts))
