"""Memory calculator: bytes per rank for training (model state + activations) and for serving.

Pure arithmetic on a :class:`~playbook.config.ModelConfig` and parallel degrees: no torch, no
processes, fast enough to call on every slider move. Every function returns **bytes** (plain
floats, since sharding divides exactly); :func:`bytes_to_gb` (1e9) and :func:`bytes_to_gib` (2**30)
convert for display. The papers mix the two units: ZeRO quotes GB, ``nvidia-smi`` quotes MiB.

Sources
-------
- Model state: Rajbhandari et al. 2019, *ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models*, arXiv:1910.02054, §3.1 (16Ψ for mixed-precision Adam) and §5 (the three stages).
- Activations: Korthikanti et al. 2022, *Reducing Activation Recomputation in Large Transformer
  Models*, arXiv:2205.05198, Table 2.
- KV cache: Kwon et al. 2023, *Efficient Memory Management for Large Language Model Serving with
  PagedAttention* (vLLM), §3; for multi-head latent attention DeepSeek-AI 2024, *DeepSeek-V2*,
  arXiv:2405.04434, §2.1.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from playbook.config import ModelConfig, divisors, require_divides, require_positive
from playbook.theory.activations import ATTENTION_KERNELS

# Bytes per element of each storage type (int4 packs two values per byte).
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}

ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")
ATTENTION = ATTENTION_KERNELS  # "eager": our model's attention; "flash": a fused FlashAttention-style kernel

# Bytes per parameter: (weights, gradients, optimizer states), before any sharding.
#   mixed: bf16/fp16 weights and grads; fp32 master copy + Adam momentum + variance = K = 12 (ZeRO §3.1)
#   fp32:  fp32 weights and grads; Adam momentum + variance = 8
_STATE_BYTES = {"mixed": (2, 2, 12), "fp32": (4, 4, 8)}

# Which parallel degree arrives with which chapter (training_memory refuses the others for now).
_CHAPTER = {"tp": "tensor-parallel", "pp": "pipeline-parallel", "cp": "context-parallel", "ep": "expert-parallel"}


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes per rank by category (for the most loaded rank)."""

    params: float
    grads: float
    optimizer: float
    activations: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


@dataclass(frozen=True)
class InferenceMemory:
    """Bytes per rank for serving: resident weights and the KV cache."""

    weights: float
    kv_cache: float

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


# ---- units -------------------------------------------------------------------------------------
def bytes_to_gb(x: float) -> float:
    """Bytes to decimal gigabytes (1 GB = 1e9 bytes), the unit of vendor datasheets and the ZeRO paper."""
    return x / 1e9


def bytes_to_gib(x: float) -> float:
    """Bytes to binary gibibytes (1 GiB = 2**30 bytes), the unit of ``torch.cuda`` and ``nvidia-smi`` (MiB)."""
    return x / 2**30


# ---- validation helpers ------------------------------------------------------------------------
def _choice(name: str, value, valid) -> None:
    if isinstance(value, bool) or type(value) is not type(valid[0]) or value not in valid:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, valid))}; got {value!r}")


def _dtype_bytes(dtype: str) -> float:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(map(repr, DTYPE_BYTES))}; got {dtype!r}")
    return DTYPE_BYTES[dtype]


def _require_count(name: str, value) -> None:
    """A positive, finite number (Ψ may be written 7.5e9, as in the ZeRO paper)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")


GRAD_ACCUM = {  # fp32 gradient accumulation: gradient bytes per parameter in mixed precision, by convention
    "main_grad": 4,  # Megatron-LM's main_grad replaces the 16-bit gradient: 2 + 4 + 12 = 18 in all
    "both": 6,  # the 16-bit gradient kept beside the fp32 buffer (Ultra-Scale Playbook): 2 + 6 + 12 = 20
}


def _grad_accum_name(fp32_grad_accum) -> str | None:
    """``False`` -> None; ``True`` -> ``"both"`` (what True always meant here); a name of ``GRAD_ACCUM``."""
    if fp32_grad_accum is False:
        return None
    if fp32_grad_accum is True:
        return "both"
    if fp32_grad_accum in GRAD_ACCUM:
        return fp32_grad_accum
    raise ValueError(
        f"fp32_grad_accum must be False, True (= 'both') or one of {', '.join(map(repr, GRAD_ACCUM))}, "
        f"got {fp32_grad_accum!r}"
    )


def _check_grad_accum(fp32_grad_accum, precision: str) -> None:
    if _grad_accum_name(fp32_grad_accum) and precision != "mixed":
        raise ValueError(
            f"fp32_grad_accum needs precision='mixed': with precision={precision!r} the gradients already are fp32"
        )


# ---- model state (ZeRO) ------------------------------------------------------------------------
def model_state_bytes(
    num_params: float,
    *,
    dp: int = 1,
    zero: int = 0,
    precision: str = "mixed",
    n_tensors: int = 0,
    fp32_grad_accum: bool | str = False,
) -> TrainingMemory:
    """Bytes of weights, gradients and Adam optimizer states held by one data-parallel rank.

    ZeRO (Rajbhandari et al. 2019, arXiv:1910.02054), §3.1 and §5, with Ψ = ``num_params`` and
    Nd = ``dp``:

    ========  ==============  ==============  =====================
    stage     params          grads           optimizer
    ========  ==============  ==============  =====================
    0 (DDP)   2Ψ              2Ψ              KΨ
    1 (Pos)   2Ψ              2Ψ              KΨ / Nd
    2 (+g)    2Ψ              2Ψ / Nd         KΨ / Nd
    3 (+p)    2Ψ / Nd         2Ψ / Nd         KΨ / Nd
    ========  ==============  ==============  =====================

    ``precision="mixed"``: 16-bit weights and gradients, K = 12 (fp32 master weights, Adam momentum
    and variance, 4 bytes each), 16Ψ in all. ``precision="fp32"``: weights 4Ψ, gradients 4Ψ, Adam
    8Ψ. The divisions are exact (floats), as in the paper, so Ψ = 7.5e9 and Nd = 64 give the
    paper's Figure 1: 120 GB, 31.4 GB, 16.6 GB and 1.9 GB. A real partition rounds each shard up
    to whole elements (and often pads for alignment), a few bytes more on some ranks.

    ``fp32_grad_accum`` (mixed precision only): gradients accumulated over micro-batches in fp32,
    counted with the gradients and sharded like them (÷Nd from stage 2 on). Two conventions, by name:

    - ``"main_grad"``: the fp32 buffer *replaces* the 16-bit gradient, 4Ψ of gradients, 18Ψ in all
      unsharded. Megatron-LM's ``main_grad`` (the backward adds into it; Megatron-Core's
      distributed-optimizer table, "float16 param, fp32 grads": 2 + 4 + 12 = 18 bytes).
    - ``"both"`` (also ``True``): the 16-bit gradient *and* the fp32 buffer, 6Ψ of gradients, 20Ψ in
      all: the "BF16 w/ FP32 grad acc" column of the Ultra-Scale Playbook (Tazi et al. 2025, Hugging
      Face, its memory-usage section), for code that casts each micro-batch's bf16 gradient into an
      fp32 sum.

    In ``"fp32"`` precision the gradients already are fp32, so the option is refused there. Not
    counted: temporary buffers and allocator fragmentation.

    ``n_tensors``: PyTorch's ``Adam``/``AdamW`` also keeps a scalar fp32 ``step`` tensor for every
    parameter tensor, 4 bytes each. ``n_tensors=0`` reproduces the paper; ``n_tensors=
    len(list(model.parameters()))`` gives the bytes ``torch.optim.AdamW`` actually allocates. These
    4·n_tensors bytes are added to the optimizer **unsharded**: when every tensor is split across
    the ranks (ZeRO's flat partition, FSDP's per-parameter shards) each rank keeps a step counter
    for every tensor it holds a slice of. Schemes that hand out whole tensors keep fewer; the
    difference is a few kilobytes.

    Returns a :class:`TrainingMemory` in bytes with ``activations=0``.
    """
    _require_count("num_params", num_params)
    require_positive(dp=dp)
    _choice("zero", zero, ZERO_STAGES)
    _choice("precision", precision, tuple(_STATE_BYTES))
    if isinstance(n_tensors, bool) or not isinstance(n_tensors, int) or n_tensors < 0:
        raise ValueError(
            f"n_tensors must be a non-negative integer (the number of parameter tensors), got {n_tensors!r}"
        )
    _check_grad_accum(fp32_grad_accum, precision)

    p, g, o = (b * num_params for b in _STATE_BYTES[precision])
    accum = _grad_accum_name(fp32_grad_accum)
    if accum:
        g = GRAD_ACCUM[accum] * num_params
    if zero >= 1:
        o /= dp
    if zero >= 2:
        g /= dp
    if zero >= 3:
        p /= dp
    return TrainingMemory(params=float(p), grads=float(g), optimizer=float(o + 4 * n_tensors))


# ---- activations (Korthikanti et al. 2022) -----------------------------------------------------
def activation_bytes_per_layer(
    *,
    seq_len: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> float:
    """Bytes of activations one GPT-style transformer layer saves for backward, per tensor-parallel rank.

    Korthikanti et al. 2022 (arXiv:2205.05198), Table 2, with s = ``seq_len``, b = ``micro_batch``,
    h = ``hidden``, a = ``heads``, t = ``tp`` (16-bit activations, 1-byte dropout masks):

    ==============================================  =========================
    no parallelism                                  sbh(34 + 5as/h)
    tensor parallel                                 sbh(10 + 24/t + 5as/(ht))
    tensor + sequence parallel                      sbh(34/t + 5as/(ht))
    tensor parallel + selective recomputation       sbh(10 + 24/t)
    tensor + sequence parallel + selective recomp.  sbh(34/t)
    full recomputation                              sbh · 2
    ==============================================  =========================

    Selective recomputation drops the attention-score term 5as/h (softmax input and output,
    dropout mask and output: 5as²b bytes). Full recomputation keeps only each layer's 16-bit input,
    2sbh, and we return exactly the paper's ``2sbh`` whatever ``tp`` and ``sequence_parallel`` are.
    (With sequence parallelism Megatron-LM stores that input sharded along the sequence, 2sbh/t; the
    table does not make that distinction, and we follow the table.) With ``tp=1`` every row
    reduces to the no-parallelism one, so ``sequence_parallel`` changes nothing there.

    These constants describe the paper's GPT block (LayerNorm, GeLU, dropout). Our Llama-style model
    saves a different amount: see ``playbook.theory.activations.model_activation_bytes``.
    """
    require_positive(seq_len=seq_len, micro_batch=micro_batch, hidden=hidden, heads=heads, tp=tp)
    require_divides("tp", tp, "heads", heads)
    _choice("recompute", recompute, RECOMPUTE)
    if not isinstance(sequence_parallel, bool):
        raise ValueError(f"sequence_parallel must be True or False, got {sequence_parallel!r}")

    s, b, h, a, t = seq_len, micro_batch, hidden, heads, tp
    sbh = s * b * h
    if recompute == "full":
        return float(2 * sbh)
    # the attention-score term 5as/h · sbh = 5·a·s²·b, split over the t ranks' heads
    scores = 0.0 if recompute == "selective" else 5 * a * s * s * b / t
    if sequence_parallel:
        return sbh * 34 / t + scores
    return sbh * (10 + 24 / t) + scores


# ---- training: one rank ------------------------------------------------------------------------
def training_memory(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    zero: int = 0,
    sequence_parallel: bool = False,
    recompute: str = "none",
    precision: str = "mixed",
    n_tensors: int = 0,
    fp32_grad_accum: bool | str = False,
    attention: str = "eager",
) -> TrainingMemory:
    """Bytes held by the most loaded rank while training ``cfg`` with Adam, by category.

    Model state follows ZeRO (see :func:`model_state_bytes`, Rajbhandari et al. 2019,
    arXiv:1910.02054), with Ψ = ``cfg.num_params()`` (for a mixture of experts every expert is
    held, not only the active ones). The paper's K = 12 is used; PyTorch's per-tensor ``step``
    scalars (4 bytes each) are added only when ``n_tensors`` says how many tensors there are
    (``cfg.num_param_tensors()`` for our model: then the prediction matches AdamW to the byte).
    ``fp32_grad_accum`` accumulates the gradients in fp32: ``"main_grad"`` (Megatron-LM, 4 bytes per
    parameter instead of 2) or ``"both"``/``True`` (fp32 beside bf16, 6), sharded like the gradients
    (:func:`model_state_bytes`).

    Activations are the exact count for our Llama-style model (RMSNorm, SwiGLU, no dropout) for one
    micro-batch of ``micro_batch`` sequences of ``seq_len`` tokens, stored in 16 bits for
    ``"mixed"`` and 32 bits for ``"fp32"``: ``playbook.theory.activations`` for dense blocks,
    ``playbook.theory.moe.moe_block_activation_bytes`` (even routing, no drops) for MoE blocks, at
    every ``pp`` and ``ep`` (``playbook.theory.stages.activation_bytes``). Compare with Korthikanti
    et al. 2022, Table 2 (:func:`activation_bytes_per_layer` × ``cfg.n_layers``), which counts a GPT block.

    ``attention``: "eager" (default) is our model's attention, whose softmax keeps [b, a, s, s] per
    layer, what the chapters measure; "flash" is a fused kernel (Dao et al. 2022, *FlashAttention*,
    arXiv:2205.14135) as production runs use: no [s, s] tensor, only q, k, v, the output and an fp32
    log-sum-exp [b, a/tp, s/cp] per layer, i.e. selective recomputation's count (Korthikanti et al.
    2022, §5) plus those statistics (``playbook.theory.activations``). With ``cp`` and "flash" every
    block is counted at s/cp tokens, so recomputation is modelled there too.

    Degrees: ``dp`` with ``zero`` (ZeRO stages); ``tp`` (Megatron TP, with ``sequence_parallel``:
    ``playbook.theory.tp``), ``cp`` (ring attention: ``playbook.theory.cp``), ``ep`` (experts split:
    ``playbook.theory.moe``) and ``pp`` (1F1B: the most loaded stage). Alone, each uses its
    chapter's exact count; together, ``playbook.theory.stages.layout_stage_memory`` builds every
    stage from its ranks' local shapes (and gives each stage's bytes); with ZeRO, dense weights
    shard over the dp·cp data ranks.
    """
    require_positive(seq_len=seq_len, micro_batch=micro_batch, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
    _choice("zero", zero, ZERO_STAGES)
    _choice("precision", precision, tuple(_STATE_BYTES))
    _choice("recompute", recompute, RECOMPUTE)
    _choice("attention", attention, ATTENTION)
    if not isinstance(sequence_parallel, bool):
        raise ValueError(f"sequence_parallel must be True or False, got {sequence_parallel!r}")
    split = {name: d for name, d in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)) if d != 1}
    if len(split) > 1:  # every degree together: each stage from its ranks' local shapes
        from playbook.theory.stages import layout_stage_memory, most_loaded_stage

        _check_grad_accum(fp32_grad_accum, precision)
        stages = layout_stage_memory(
            cfg,
            seq_len=seq_len,
            micro_batch=micro_batch,
            dp=dp,
            tp=tp,
            pp=pp,
            cp=cp,
            ep=ep,
            zero=zero,
            sequence_parallel=sequence_parallel,
            precision=precision,
            recompute=recompute,
            n_tensors=n_tensors,
            fp32_grad_accum=fp32_grad_accum,
            attention=attention,
        )
        return stages[most_loaded_stage(stages)].memory

    _check_grad_accum(fp32_grad_accum, precision)
    from playbook.theory.stages import activation_bytes, most_loaded_stage, pipeline_stage_memory  # lazily: no cycles

    dtype_bytes = 2 if precision == "mixed" else 4
    sizes = dict(seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes, recompute=recompute)
    common = dict(dp=dp, zero=zero, precision=precision, n_tensors=n_tensors, fp32_grad_accum=fp32_grad_accum)
    if pp > 1:  # 1F1B pipeline: the most loaded stage, holding p - i micro-batches in flight
        stages = pipeline_stage_memory(
            cfg, pp=pp, seq_len=seq_len, micro_batch=micro_batch, recompute=recompute, attention=attention, **common
        )
        return stages[most_loaded_stage(stages)].memory
    if tp > 1:  # Megatron TP (+ SP): matrices split 1/t, norms replicated; exact activations of our TP model
        from playbook.theory.tp import check_tp, params_per_rank, tp_model_activation_bytes

        check_tp(cfg, tp, seq_len=seq_len, sequence_parallel=sequence_parallel)
        held = params_per_rank(cfg, tp)
        state = model_state_bytes(held["split"] + held["replicated"], **common)
        acts = tp_model_activation_bytes(cfg, tp=tp, sequence_parallel=sequence_parallel, attention=attention, **sizes)
    elif cp > 1:  # ring attention: weights replicated, every activation at s/cp tokens
        from playbook.theory.cp import check_layout, cp_activation_bytes

        state = model_state_bytes(cfg.num_params(), **common)
        if attention == "flash":  # a fused ring kernel: the flash block at s/cp tokens
            check_layout(seq_len, cp, zigzag=False)
            acts = activation_bytes(cfg, **{**sizes, "seq_len": seq_len // cp}, attention=attention)
        else:
            acts = cp_activation_bytes(cfg, cp=cp, variant="ring", **sizes)
    elif ep > 1:  # routed experts split over ep ranks (DeepSpeed-MoE); activations at even routing
        from playbook.theory.moe import moe_model_state_bytes

        state = moe_model_state_bytes(cfg, ep=ep, **common)
        acts = activation_bytes(cfg, **sizes, attention=attention)
    else:
        state = model_state_bytes(cfg.num_params(), **common)
        acts = activation_bytes(cfg, **sizes, attention=attention)
    return TrainingMemory(params=state.params, grads=state.grads, optimizer=state.optimizer, activations=float(acts))


# ---- serving -----------------------------------------------------------------------------------
def kv_cache_bytes_per_token(cfg: ModelConfig, dtype: str = "bf16") -> float:
    """Bytes of KV cache one token occupies across all layers of the whole model (no parallelism).

    Grouped-query / multi-head attention (Kwon et al. 2023, vLLM, §3, written there for MHA; with
    GQA only the key/value heads are cached): ``2 · n_layers · kv_heads · head_dim · bytes`` — a key
    and a value vector per KV head per layer. Llama 3.1 8B in bf16: 2·32·8·128·2 = 131,072 bytes.

    Multi-head latent attention (``cfg.attention == "mla"``; DeepSeek-V2, arXiv:2405.04434, §2.1):
    the cache holds one compressed latent c_KV of ``kv_lora_rank`` elements plus the shared
    decoupled RoPE key of ``qk_rope_head_dim`` elements per layer, for all heads together:
    ``n_layers · (kv_lora_rank + qk_rope_head_dim) · bytes``. DeepSeek-V3 in bf16:
    61·(512+64)·2 = 70,272 bytes.

    ``dtype`` is the cache's storage type, one of :data:`DTYPE_BYTES` (int4: half a byte; the
    scales that quantized caches also store are not counted).
    """
    nbytes = _dtype_bytes(dtype)
    if cfg.attention == "mla":
        return float(cfg.n_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * nbytes)
    return float(2 * cfg.n_layers * cfg.kv_heads * cfg.dim_head * nbytes)


def _kv_heads_per_rank(cfg: ModelConfig, tp: int) -> float:
    """KV heads one tensor-parallel rank caches: kv_heads/tp, or 1 (replicated) when tp > kv_heads."""
    kv = cfg.kv_heads
    ok = (kv % tp == 0) if tp <= kv else (tp % kv == 0)
    if not ok:
        valid = [t for t in divisors(cfg.n_heads) if (kv % t == 0 if t <= kv else t % kv == 0)]
        raise ValueError(
            f"tp={tp} cannot split n_kv_heads={kv} evenly: tp must divide the KV heads, or be a multiple of them "
            f"(each KV head then replicated on tp/n_kv_heads ranks); try tp in {{{', '.join(map(str, valid))}}}"
        )
    return max(kv / tp, 1)


def inference_memory(
    cfg: ModelConfig, *, batch: int, seq_len: int, tp: int = 1, pp: int = 1, ep: int = 1, dtype: str = "bf16"
) -> InferenceMemory:
    """Bytes per rank for serving ``batch`` sequences of ``seq_len`` tokens: weights and KV cache.

    Weights: ``num_params · bytes / (tp · pp)``, the ideal even split. Real tensor parallelism
    replicates the RMSNorm weights on every rank (2·hidden per layer, well under 0.01% of a
    preset), and pipeline stages are even only when ``pp`` divides ``n_layers`` and the embedding
    and output head are balanced against layers; both are ignored here. Llama 3.1 70B in bf16:
    2 × 70,553,706,496 = 141.1 GB (the "70B × 2 bytes = 140 GB" rule of thumb).

    KV cache: ``batch · seq_len · kv_cache_bytes_per_token / pp``, further divided by tensor
    parallelism as the KV heads are: each rank caches ``max(kv_heads / tp, 1)`` heads, since
    when ``tp > kv_heads`` each KV head is replicated on ``tp / kv_heads`` ranks (as vLLM does) —
    for Llama 3.1 (8 KV heads) going from tp=8 to tp=16 halves the weights per rank but not the
    cache. Multi-head latent attention (``attention="mla"``) caches one latent shared by all heads,
    so every tensor-parallel rank holds all of it (the cache is not divided by ``tp``).

    ``ep``: a mixture of experts' routed experts split over ``ep`` ranks, the rest as above
    (``playbook.theory.moe.inference_weight_bytes``).

    ``tp`` must divide ``n_heads`` and divide, or be a multiple of, ``n_kv_heads``; ``dtype`` (one
    of :data:`DTYPE_BYTES`) is used for both weights and cache. Not counted: activation workspace,
    communication buffers, allocator headroom. Returns an :class:`InferenceMemory` in bytes.
    """
    require_positive(batch=batch, seq_len=seq_len, tp=tp, pp=pp, ep=ep)
    nbytes = _dtype_bytes(dtype)
    require_divides("tp", tp, "n_heads", cfg.n_heads)
    if pp > cfg.n_layers:
        raise ValueError(
            f"pp={pp} exceeds n_layers={cfg.n_layers}: every stage needs a layer; try pp in 1..{cfg.n_layers}"
        )

    if ep > 1:
        from playbook.theory.moe import inference_weight_bytes

        weights = inference_weight_bytes(cfg, ep=ep, tp=tp, pp=pp, dtype_bytes=nbytes)
    else:
        weights = cfg.num_params() * nbytes / (tp * pp)
    per_token = kv_cache_bytes_per_token(cfg, dtype)
    if cfg.attention == "mla":
        kv_share = 1.0
    else:
        kv_share = _kv_heads_per_rank(cfg, tp) / cfg.kv_heads
    kv_cache = batch * seq_len * per_token * kv_share / pp
    return InferenceMemory(weights=float(weights), kv_cache=float(kv_cache))
