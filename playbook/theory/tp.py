"""Predict tensor and sequence parallelism: weights, collectives and activations per rank (no torch).

Notation as in ``playbook.theory.activations``: b micro-batch, s sequence, h hidden, a query heads,
g key/value heads, d head dim, f ffn_hidden, V vocabulary, L layers, t tensor-parallel degree,
B bytes per element of the activations (4 in our fp32 CPU runs, 2 in bf16).

Weights (Shoeybi et al. 2019, arXiv:1909.08053, §3): q/k/v, gate/up and the output head are split
by output channels (column parallel), o and down by input channels (row parallel), the embedding by
vocabulary rows: each rank holds 1/t of them. The RMSNorm weights (2h per layer, h for the final
norm) are replicated on every rank.

Communication per layer per micro-batch (Narayanan et al. 2021, arXiv:2104.04473, §3.2): tensor
parallelism all-reduces the [b, s, h] activation twice in the forward pass (after attention, after
the MLP: Megatron's g) and twice in the backward pass (before each: f). A ring all-reduce of S bytes
sends 2S(t−1)/t per rank (``theory.comm``), so with S = B·bsh

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
(``playbook.parallel.tp.model``), measured to the byte in ``tests/test_tp.py``. Compare with
Korthikanti et al.'s Table 2 (``theory.memory.activation_bytes_per_layer``), which counts a GPT
block with dropout and, for sequence parallelism, Megatron's trick of saving the sequence shard of
each parallel region's input and all-gathering it again in backward. By default our model saves the
gathered input (2 tensors of B·bsh per layer) and skips that extra all-gather; ``regather=True``
does what Megatron does (2 more all-gathers per layer in backward; every saved tensor of a block but
the causal mask is then divided by t). ``recompute`` ("selective", "full") follows
``theory.activations``; "full" also repeats forward collectives in backward (:func:`step_collectives`).

Units: bytes; seconds; FLOP/s. Pure arithmetic, fast enough for every slider move.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from playbook.config import Hardware, ModelConfig, divisors, require_positive
from playbook.theory.activations import attention_core, flash_lse_bytes
from playbook.theory.comm import collective_seconds, sent_bytes
from playbook.theory.memory import RECOMPUTE, TrainingMemory, model_state_bytes

INDEX_BYTES = 8  # int64 token ids and targets
MASK_BYTES = 1  # torch.bool


# ---- what t may be -----------------------------------------------------------------------------
def valid_tp(cfg: ModelConfig) -> list[int]:
    """Degrees that split every sharded dimension evenly: divisors of heads, KV heads, ffn and vocab."""
    return [t for t in divisors(cfg.n_heads) if all(n % t == 0 for n in _split_sizes(cfg).values())]


def _split_sizes(cfg: ModelConfig) -> dict[str, int]:
    return {
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.kv_heads,
        "ffn_hidden": cfg.ffn_hidden,
        "vocab_size": cfg.vocab_size,
    }


def check_tp(
    cfg: ModelConfig, tp: int, *, seq_len: int | None = None, sequence_parallel: bool = False, regather: bool = False
) -> None:
    """Raise ``ValueError`` unless ``tp`` splits heads, KV heads (no replicated KV heads here), ffn and
    vocabulary evenly, and (with sequence parallelism) the sequence; the message lists valid values."""
    require_positive(tp=tp)
    if regather and not sequence_parallel:
        raise ValueError("regather saves sequence shards, so it needs sequence_parallel=True")
    for name, size in _split_sizes(cfg).items():
        if size % tp:
            valid = ", ".join(map(str, valid_tp(cfg)))
            raise ValueError(f"tp={tp} does not divide {name}={size}; try tp in {{{valid}}}")
    if sequence_parallel and seq_len is not None and seq_len % tp:
        raise ValueError(
            f"sequence parallelism splits the sequence: tp={tp} does not divide seq_len={seq_len}; "
            f"use a seq_len that is a multiple of {tp}, or tp in {{{', '.join(map(str, divisors(seq_len)))}}}"
        )


# ---- weights -----------------------------------------------------------------------------------
def params_per_rank(cfg: ModelConfig, tp: int) -> dict[str, int]:
    """Parameters one rank holds: ``split`` (1/t of every sharded matrix) and ``replicated`` (norms).
    ``split + replicated`` with tp=1 is ``cfg.num_params()``."""
    check_tp(cfg, tp)
    replicated = (2 * cfg.n_layers + 1) * cfg.hidden
    return {"split": (cfg.num_params() - replicated) // tp, "replicated": replicated}


def matrix_shards(cfg: ModelConfig, tp: int) -> list[dict]:
    """Every weight of one layer and around the layers: its full shape [out, in], how it is split
    (``"rows"``: by output channel / vocabulary row, ``"cols"``: by input channel, ``None``:
    replicated) and the shape one rank holds. The data behind the shard diagram."""
    check_tp(cfg, tp)
    h, a, g, d, f, V = cfg.hidden, cfg.n_heads, cfg.kv_heads, cfg.dim_head, cfg.ffn_hidden, cfg.vocab_size
    mats = [
        ("tok_emb", (V, h), "rows", "vocabulary rows"),
        ("q_proj", (a * d, h), "rows", "query heads"),
        ("k_proj", (g * d, h), "rows", "key/value heads"),
        ("v_proj", (g * d, h), "rows", "key/value heads"),
        ("o_proj", (h, a * d), "cols", "query heads"),
        ("gate_proj", (f, h), "rows", "ffn channels"),
        ("up_proj", (f, h), "rows", "ffn channels"),
        ("down_proj", (h, f), "cols", "ffn channels"),
        ("lm_head", (V, h), "rows", "vocabulary rows"),
        ("norms", (2 * cfg.n_layers + 1, h), None, "replicated"),
    ]
    out = []
    for name, (rows, cols), split, by in mats:
        local = (rows // tp, cols) if split == "rows" else (rows, cols // tp) if split == "cols" else (rows, cols)
        out.append({"name": name, "shape": (rows, cols), "split": split, "by": by, "local": local})
    return out


# ---- communication -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Collective:
    """One collective call on one rank: where (region), when (phase), what (op), and its buffer S
    (bytes; the full gathered size for all-gather and reduce-scatter) and bytes sent (ring)."""

    region: str  # "embedding", "layer0.attn", "layer0.mlp", ..., "head", "loss", "grad sync"
    phase: str  # "forward" | "backward" | "step"
    op: str  # "all_reduce" | "all_gather" | "reduce_scatter"
    bytes: int
    sent_bytes: float


def step_collectives(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool = False,
    regather: bool = False,
    recompute: str = "none",
    dtype_bytes: int = 4,
) -> list[Collective]:
    """Every collective one rank issues in one training step of our TP model, in order (module
    docstring). ``regather``: each region's backward all-gathers its input's shard once more.
    ``recompute="full"``: in backward, each block's forward runs again (phase "recompute") as far
    as the tensors backward needs, i.e. up to its MLP's input: its last collective is not repeated
    (non-reentrant ``torch.utils.checkpoint`` stops early)."""
    check_tp(cfg, tp, seq_len=seq_len, sequence_parallel=sequence_parallel, regather=regather)
    b, s, h, B, t = micro_batch, seq_len, cfg.hidden, dtype_bytes, tp
    act = B * b * s * h  # one [b, s, h] activation
    if t == 1:
        return []
    sp = sequence_parallel

    def c(region, phase, op, size):
        return Collective(region, phase, op, size, sent_bytes(op, size, t))

    enter = "all_gather" if sp else None  # f is the identity forward: no collective
    enter_back = "reduce_scatter" if sp else "all_reduce"
    leave = "reduce_scatter" if sp else "all_reduce"
    leave_back = "all_gather" if sp else None
    out = [c("embedding", "forward", leave, act)]
    for i in range(cfg.n_layers):
        for part in ("attn", "mlp"):
            if enter:
                out.append(c(f"layer{i}.{part}", "forward", enter, act))
            out.append(c(f"layer{i}.{part}", "forward", leave, act))
    if enter:
        out.append(c("head", "forward", enter, act))
    out += [c("loss", "forward", "all_reduce", 4 * b * s), c("loss", "forward", "all_reduce", 2 * 4 * b * s)]
    # backward: the conjugates, in reverse order (the loss's backward needs no communication)
    again = [("all_gather", act)] if regather else []
    out += [c("head", "backward", op, size) for op, size in again + [(enter_back, act)]]
    for i in reversed(range(cfg.n_layers)):
        for part in ("mlp", "attn"):
            if leave_back:
                out.append(c(f"layer{i}.{part}", "backward", leave_back, act))
            if part == "mlp" and recompute == "full":
                redo = [(f"layer{i}.attn", enter), (f"layer{i}.attn", leave), (f"layer{i}.mlp", enter)]
                out += [c(region, "recompute", op, act) for region, op in redo if op]
            out += [c(f"layer{i}.{part}", "backward", op, size) for op, size in again + [(enter_back, act)]]
    if leave_back:
        out.append(c("embedding", "backward", leave_back, act))
    if sp:  # replicated norm weights saw s/t tokens each: sum their gradients (fp32 parameters)
        out.append(c("grad sync", "step", "all_reduce", 4 * (2 * cfg.n_layers + 1) * h))
    return out


def summarize(collectives, *, by=("phase", "op")) -> dict[tuple, dict[str, float]]:
    """Count, buffer bytes and bytes sent, grouped by the given fields of each :class:`Collective`
    (or of each dict with the same keys, as measured)."""
    get = (lambda x, k: x[k]) if collectives and isinstance(collectives[0], dict) else getattr
    out: dict[tuple, dict[str, float]] = {}
    for x in collectives:
        key = tuple(get(x, k) for k in by)
        row = out.setdefault(key, {"count": 0, "bytes": 0, "sent_bytes": 0.0})
        row["count"] += 1
        row["bytes"] += get(x, "bytes")
        row["sent_bytes"] += get(x, "sent_bytes")
    return out


def layer_summary(collectives, layer: int = 0) -> dict[tuple, dict[str, float]]:
    """:func:`summarize` of one layer's collectives (its attention and MLP regions), by (phase, op);
    predicted :class:`Collective` objects or measured dicts alike."""
    region = lambda x: x["region"] if isinstance(x, dict) else x.region  # noqa: E731
    return summarize([x for x in collectives if region(x).startswith(f"layer{layer}.")])


def layer_comm(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool = False,
    regather: bool = False,
    recompute: str = "none",
    dtype_bytes: int = 4,
) -> dict[str, dict[str, int | float]]:
    """One transformer layer, forward and backward: ``{"forward": {op: count, ..., "sent_bytes": x}, ...}``
    (and "recompute" with ``recompute="full"``). TP: 2 all-reduces each way, 4·B·bsh(t−1)/t bytes sent each way."""
    sizes = dict(
        seq_len=seq_len,
        micro_batch=micro_batch,
        tp=tp,
        sequence_parallel=sequence_parallel,
        regather=regather,
        recompute=recompute,
        dtype_bytes=dtype_bytes,
    )
    layer = [x for x in step_collectives(cfg, **sizes) if x.region.startswith("layer0.")]
    out = {"forward": {"sent_bytes": 0.0}, "backward": {"sent_bytes": 0.0}}
    for x in layer:
        out.setdefault(x.phase, {"sent_bytes": 0.0})
        out[x.phase][x.op] = out[x.phase].get(x.op, 0) + 1
        out[x.phase]["sent_bytes"] += x.sent_bytes
    return out


def layer_comm_seconds(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int,
    hardware: Hardware,
    sequence_parallel: bool = False,
    regather: bool = False,
    dtype_bytes: int = 2,
    latency: float = 5e-6,
    bandwidth: float | None = None,
) -> float:
    """Predicted seconds of communication per layer, forward + backward (alpha-beta model,
    ``theory.comm.collective_seconds``), collectives not overlapped. The link is ``hardware``'s
    intra-node one while the t ranks fit in one node (``devices_per_node``), its inter-node one
    beyond (which is why TP stays inside a node); ``bandwidth`` (bytes/s) overrides both."""
    sizes = dict(
        seq_len=seq_len,
        micro_batch=micro_batch,
        tp=tp,
        sequence_parallel=sequence_parallel,
        regather=regather,
        dtype_bytes=dtype_bytes,
    )
    layer = [x for x in step_collectives(cfg, **sizes) if x.region.startswith("layer0.")]
    if bandwidth is None:
        bandwidth = hardware.intra_node_bandwidth if tp <= hardware.devices_per_node else hardware.inter_node_bandwidth
    return sum(collective_seconds(x.op, x.bytes, tp, bandwidth, latency) for x in layer)


def layer_flops(cfg: ModelConfig, *, seq_len: int, micro_batch: int) -> float:
    """Matmul FLOPs of one layer, forward + backward (3× forward), whole layer (divide by t per rank):
    2·tokens·(weights of the layer) for the projections plus 2·2·b·a·s²·d for q·kᵀ and probs·v."""
    tokens = micro_batch * seq_len
    weights = cfg.attention_params() + cfg.dense_mlp_params()
    forward = 2 * tokens * weights + 4 * micro_batch * cfg.n_heads * seq_len * seq_len * cfg.dim_head
    return 3.0 * forward


def layer_seconds(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int,
    hardware: Hardware,
    flops_per_s: float,
    sequence_parallel: bool = False,
    regather: bool = False,
    dtype_bytes: int = 2,
    bandwidth: float | None = None,
) -> dict[str, float]:
    """One layer, forward + backward, on one of t ranks: ``compute`` = layer FLOPs / t at
    ``flops_per_s`` (what a matmul of the local size achieves: measured, or peak × an efficiency),
    ``comm`` = :func:`layer_comm_seconds` (not overlapped). TP pays while the compute it removes
    exceeds the communication it adds."""
    compute = layer_flops(cfg, seq_len=seq_len, micro_batch=micro_batch) / tp / flops_per_s
    comm = layer_comm_seconds(
        cfg,
        seq_len=seq_len,
        micro_batch=micro_batch,
        tp=tp,
        hardware=hardware,
        sequence_parallel=sequence_parallel,
        regather=regather,
        dtype_bytes=dtype_bytes,
        bandwidth=bandwidth,
    )
    return {"tp": tp, "compute": compute, "comm": comm, "total": compute + comm}


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

    Compared with the single-process block (``theory.activations``): everything between entering and
    leaving a parallel region (q, k, v, the attention core, the attention output; the four SwiGLU
    tensors) is divided by t, because each rank holds a/t heads and f/t ffn channels. The norms and
    the residual stream stay whole under plain TP; with SP they hold s/t of the sequence, and the
    input of each region (the all-gathered norm output, saved by q/k/v and by gate/up) is whole,
    unless ``regather`` saves its sequence shard instead: then every term but the causal mask is
    divided by t, the shape of Korthikanti et al.'s TP+SP row sbh(34/t + 5as/(ht)).

    Recomputation as in ``theory.activations``: "selective" keeps q, k, v (a/t, g/t, g/t heads)
    instead of the attention core's tensors; "full" keeps only the block's input ([b, s/t, h] with SP).
    ``attention="flash"`` (a fused kernel, Dao et al. 2022, arXiv:2205.14135): selective's terms
    plus the kernel's fp32 log-sum-exp over this rank's a/t heads (``theory.activations``).
    """
    check_tp(cfg, tp, seq_len=seq_len, sequence_parallel=sequence_parallel, regather=regather)
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(map(repr, RECOMPUTE))}; got {recompute!r}")
    core, lse = attention_core(recompute, attention)
    b, s, h, B, t = micro_batch, seq_len, cfg.hidden, dtype_bytes, tp
    a, g, d, f = cfg.n_heads // t, cfg.kv_heads // t, cfg.dim_head, cfg.ffn_hidden // t  # this rank's share
    sn = s // t if sequence_parallel else s  # tokens the norms see
    if recompute == "full":
        return {"block input (kept for recomputation)": b * sn * h * B}
    terms = {}
    for part in ("attn", "mlp"):
        terms |= {
            f"{part} norm: input": b * sn * h * B,
            f"{part} norm: inv_rms": b * sn * B,
            f"{part} norm: x * inv_rms": b * sn * h * B,
            **(
                {f"{part} region input (sequence shard)": b * sn * h * B}
                if regather
                else {f"{part} region input ({'all-gathered' if sequence_parallel else 'norm output'})": b * s * h * B}
            ),
        }
        if part == "attn" and core == "selective":
            terms |= {
                "q (kept for recomputation, a/t heads)": b * a * s * d * B,
                "k (kept, g/t heads)": b * g * s * d * B,
                "v (kept, g/t heads)": b * g * s * d * B,
                **(
                    {"log-sum-exp (fp32, flash kernel, a/t heads)": flash_lse_bytes(seq_len=s, micro_batch=b, heads=a)}
                    if lse
                    else {}
                ),
                "attention output (o_proj input)": b * s * a * d * B,
            }
        elif part == "attn":
            terms |= {
                "q (a/t heads)": b * a * s * d * B,
                "k repeated (a/t heads)": b * a * s * d * B,
                "causal mask (bool)": s * s * MASK_BYTES,
                "attention probabilities (a/t heads)": b * a * s * s * B,
                "v repeated (a/t heads)": b * a * s * d * B,
                "attention output (o_proj input)": b * s * a * d * B,
            }
    return terms | {
        "gate_proj output (f/t)": b * s * f * B,
        "silu(gate) (f/t)": b * s * f * B,
        "up_proj output (f/t)": b * s * f * B,
        "silu(gate) * up (f/t)": b * s * f * B,
    }


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
        recompute=recompute,
        dtype_bytes=dtype_bytes,
    )
    block = sum(tp_block_activation_breakdown(cfg, **sizes, attention=attention).values())
    b, s, h, B, V = micro_batch, seq_len, cfg.hidden, dtype_bytes, cfg.vocab_size
    sn = s // tp if sequence_parallel else s
    return {
        "embedding: local ids (int64) and mask (bool)": b * s * (INDEX_BYTES + MASK_BYTES),
        "blocks": cfg.n_layers * block,
        "final norm": (2 * b * sn * h + b * sn) * B,
        "head input": b * (sn if regather else s) * h * B,
        "softmax over V/t (fp32)": b * s * (V // tp) * 4,
        "targets (int64)": b * s * INDEX_BYTES,
    }


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


def op_counts(collectives) -> Counter:
    """How many of each op: ``Counter({"all_reduce": 4, ...})``."""
    return Counter(x.op if isinstance(x, Collective) else x["op"] for x in collectives)
