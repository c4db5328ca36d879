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

from dataclasses import asdict, dataclass

from playbook.config import ModelConfig, divisors, require_divides, require_positive
from playbook.theory.inventory.activations import ATTENTION_KERNELS
from playbook.theory.cp import check_layout, cp_activation_bytes
from playbook.theory.inventory.inventory import RECOMPUTE_MODES
from playbook.theory.inventory.korthikanti import activation_bytes_per_layer
from playbook.theory.inventory.model_state import (
    _STATE_BYTES,
    ZERO_STAGES,
    TrainingMemory,
    _check_grad_accum,
    _choice,
    _dtype_bytes,
    bytes_to_gb,
    bytes_to_gib,
    model_state_bytes,
)
from playbook.theory.moe.moe import inference_weight_bytes, moe_model_state_bytes
from playbook.theory.hybrid.stages import (
    activation_bytes,
    layout_stage_memory,
    most_loaded_stage,
    pipeline_stage_memory,
)
from playbook.theory.tp.layout import check_tp, params_per_rank
from playbook.theory.tp.tp import tp_model_activation_bytes

ATTENTION = ATTENTION_KERNELS  # "eager": our model's attention; "flash": a fused FlashAttention-style kernel
__all__ = [
    "ATTENTION", "RECOMPUTE_MODES", "ZERO_STAGES", "InferenceMemory", "TrainingMemory",
    "activation_bytes_per_layer", "bytes_to_gb", "bytes_to_gib", "inference_memory", "kv_cache_bytes_per_token",
    "model_state_bytes", "training_memory",
]  # fmt: skip


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
    ``"mixed"`` and 32 bits for ``"fp32"``: ``playbook.theory.inventory.activations`` for dense blocks,
    ``playbook.theory.hybrid.local_activations.block_bytes`` (even routing, no drops) for MoE blocks, at
    every ``pp`` and ``ep`` (``playbook.theory.hybrid.stages.activation_bytes``). Compare with Korthikanti
    et al. 2022, Table 2 (:func:`activation_bytes_per_layer` × ``cfg.n_layers``), which counts a GPT block.

    ``attention``: "eager" (default) is our model's attention, whose softmax keeps [b, a, s, s] per
    layer, what the chapters measure; "flash" is a fused kernel (Dao et al. 2022, *FlashAttention*,
    arXiv:2205.14135) as production runs use: no [s, s] tensor, only q, k, v, the output and an fp32
    log-sum-exp [b, a/tp, s/cp] per layer, i.e. selective recomputation's count (Korthikanti et al.
    2022, §5) plus those statistics (``playbook.theory.inventory.activations``). With ``cp`` and "flash" every
    block is counted at s/cp tokens, so recomputation is modelled there too.

    Degrees: ``dp`` with ``zero`` (ZeRO stages); ``tp`` (Megatron TP, with ``sequence_parallel``:
    ``playbook.theory.tp.tp``), ``cp`` (ring attention: ``playbook.theory.cp``), ``ep`` (experts split:
    ``playbook.theory.moe.moe``) and ``pp`` (1F1B: the most loaded stage). Alone, each uses its
    chapter's exact count; together, ``playbook.theory.hybrid.stages.layout_stage_memory`` builds every
    stage from its ranks' local shapes (and gives each stage's bytes); with ZeRO, dense weights
    shard over the dp·cp data ranks.
    """
    require_positive(seq_len=seq_len, micro_batch=micro_batch, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
    _choice("zero", zero, ZERO_STAGES)
    _choice("precision", precision, tuple(_STATE_BYTES))
    _choice("recompute", recompute, RECOMPUTE_MODES)
    _choice("attention", attention, ATTENTION)
    if not isinstance(sequence_parallel, bool):
        raise ValueError(f"sequence_parallel must be True or False, got {sequence_parallel!r}")
    split = {name: d for name, d in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)) if d != 1}
    if len(split) > 1:  # every degree together: each stage from its ranks' local shapes
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

    dtype_bytes = 2 if precision == "mixed" else 4
    sizes = dict(seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes, recompute=recompute)
    common = dict(dp=dp, zero=zero, precision=precision, n_tensors=n_tensors, fp32_grad_accum=fp32_grad_accum)
    if pp > 1:  # 1F1B pipeline: the most loaded stage, holding p - i micro-batches in flight
        stages = pipeline_stage_memory(
            cfg, pp=pp, seq_len=seq_len, micro_batch=micro_batch, recompute=recompute, attention=attention, **common
        )
        return stages[most_loaded_stage(stages)].memory
    if tp > 1:  # Megatron TP (+ SP): matrices split 1/t, norms replicated; exact activations of our TP model
        check_tp(cfg, tp, seq_len=seq_len, sequence_parallel=sequence_parallel)
        held = params_per_rank(cfg, tp)
        state = model_state_bytes(held["split"] + held["replicated"], **common)
        acts = tp_model_activation_bytes(cfg, tp=tp, sequence_parallel=sequence_parallel, attention=attention, **sizes)
    elif cp > 1:  # ring attention: weights replicated, every activation at s/cp tokens; ZeRO over dp·cp
        state = model_state_bytes(cfg.num_params(), **{**common, "dp": dp * cp})
        if attention == "flash":  # a fused ring kernel: the flash block at s/cp tokens
            check_layout(seq_len, cp, zigzag=False)
            acts = activation_bytes(cfg, **{**sizes, "seq_len": seq_len // cp}, attention=attention)
        else:
            acts = cp_activation_bytes(cfg, cp=cp, variant="ring", **sizes)
    elif ep > 1:  # routed experts split over ep ranks (DeepSpeed-MoE); activations at even routing
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
    scales that quantized caches also store are not counted per token:
    ``playbook.theory.serving.serving.kv_block_bytes`` adds them per block).
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
    (``playbook.theory.moe.moe.inference_weight_bytes``).

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
