"""Serving: where inference memory goes, and how long prefill and decode take (pure arithmetic, no torch).

Memory per GPU, as vLLM sizes it: ``mem_util`` (its ``gpu_memory_utilization``, 0.9 as the book's
``hardware.MEM_UTIL``) × the memory the device reports (``Hardware.capacity_bytes``) holds the resident
weights, the activation peak of one forward over the engine's largest step
(``playbook.theory.serving.profile``: what vLLM's profiling run measures) and the KV cache; the rest is
headroom for other processes and fragmentation.

- Weights per GPU under TP/PP/EP: ``playbook.theory.hybrid.memory.inference_memory`` (even split).
- KV cache per token: a key and a value per KV head per layer, ``2·L·g·d·bytes`` (MHA: g = heads;
  GQA: g < heads; Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving
  with PagedAttention", §3); multi-head latent attention caches one latent of ``kv_lora_rank`` plus
  the shared RoPE key of ``qk_rope_head_dim`` per layer (DeepSeek-V2, arXiv:2405.04434, §2.1).
- Paged cache (Kwon et al. §4.2): memory is cut into blocks of ``block_size`` tokens; a sequence of
  n tokens holds ceil(n / block_size) blocks, so at most ``block_size − 1`` slots per sequence are
  wasted and the number of sequences that fit is ``blocks // ceil(context / block_size)``.
- A quantized block (int8, fp8) also holds its scales: one fp32 per layer, per K and V, per KV head
  (``kv_block_bytes``; ``playbook.serve.kv_quant`` stores them so), so an int8 block of 16 tokens of
  Llama 3.1 70B is 2,621,440 + 5,120 bytes against bf16's 5,242,880. Quantized weights (``quantize``):
  ``playbook.theory.serving.weights``; their capacity and speed at scale: ``theory.serving.quantized``.

Time, as a roofline (Pope et al. 2022, "Efficiently Scaling Transformer Inference",
arXiv:2211.05102, §2 and §3.1): a phase takes max(FLOPs / achievable FLOP/s, bytes read / achievable
HBM bandwidth), plus its tensor-parallel collectives (two all-reduces of the activations per layer,
Megatron's g after attention and after the MLP; Shoeybi et al. 2019), which at small batch are
latency-bound (alpha-beta, ``playbook.theory.cost.comm.collective_seconds``).

- Prefill (the prompt, all tokens at once): FLOPs = tokens · (2N + attention) (``theory.cost.flops``,
  forward), divided by tp: compute-bound. Its time is the time to first token (TTFT).
- Decode (one token per sequence per step): every step reads this GPU's weights once and the whole
  KV cache of the batch: memory-bound until the batch is large (Pope et al. §3.1: the batch at which
  FLOPs catch up with bytes is about peak FLOP/s ÷ bandwidth ÷ 2 per byte of weight). Its time is the
  time per output token (TPOT); tokens/s per GPU = batch / TPOT / GPUs per replica.
- Pipeline stages (pp): each holds 1/pp of the layers; a token crosses every stage in turn, so its
  latency is pp stage times plus pp − 1 sends; with pp batches in flight the throughput is pp times
  one batch's.

Layouts on a fixed number of GPUs (TP against DP replicas): ``playbook.theory.serving.layouts``.

Units: bytes, seconds, FLOP/s, bytes/s (decimal).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from playbook.config import ModelConfig, divisors, require_positive
from playbook.hardware import MEM_UTIL, Hardware
from playbook.theory.cost import allreduce_algo
from playbook.theory.cost.comm import collective_seconds, sent_bytes
from playbook.theory.cost.flops import flops_per_token
from playbook.theory.inventory.model_state import _dtype_bytes
from playbook.theory.hybrid.memory import _kv_heads_per_rank, inference_memory, kv_cache_bytes_per_token
from playbook.theory.serving.profile import activation_peak
from playbook.theory.serving.weights import served_weight_bytes

BLOCK_SIZE = 16  # vLLM's default tokens per KV block
KV_SCALE_BYTES = 4  # a quantized KV block's scale: one fp32 per layer, per K and V, per KV head
QUANTIZED_KV = ("int8", "fp8", "int4")  # KV dtypes stored with per-block scales


# ---- memory -------------------------------------------------------------------------------------
def weights_per_gpu(cfg: ModelConfig, *, tp: int = 1, pp: int = 1, ep: int = 1, dtype: str = "bf16") -> float:
    """Bytes of weights one GPU holds: ``num_params · bytes / (tp·pp)``, routed experts over ``ep``."""
    return inference_memory(cfg, batch=1, seq_len=1, tp=tp, pp=pp, ep=ep, dtype=dtype).weights


def kv_bytes_per_token(cfg: ModelConfig, *, tp: int = 1, pp: int = 1, dtype: str = "bf16") -> float:
    """Bytes of KV cache one token occupies on one GPU: the whole model's share
    (``kv_cache_bytes_per_token``) divided by pp, and by tp as the KV heads are split (a KV head is
    replicated when tp > kv_heads; an MLA latent is held whole by every tensor-parallel rank)."""
    whole = kv_cache_bytes_per_token(cfg, dtype)
    share = 1.0 if cfg.attention == "mla" else _kv_heads_per_rank(cfg, tp) / cfg.kv_heads
    return whole * share / pp


def kv_block_bytes(
    cfg: ModelConfig, *, tp: int = 1, pp: int = 1, dtype: str = "bf16", block_size: int = BLOCK_SIZE
) -> float:
    """Bytes of one paged KV block on one GPU: ``block_size`` tokens of ``kv_bytes_per_token`` and,
    for a quantized cache (:data:`QUANTIZED_KV`), the block's scales, :data:`KV_SCALE_BYTES` for each
    layer's K and V of each KV head this rank holds (an MLA latent: one per layer). So the 16-bit
    block of gpt-tiny (2 layers, 2 KV heads of 16) at 16 tokens is 4,096 bytes, the int8 one
    2,048 + 2·2·2·4 = 2,080: the scale term is why capacity grows 1.97×, not 2×."""
    require_positive(block_size=block_size)
    data = block_size * kv_bytes_per_token(cfg, tp=tp, pp=pp, dtype=dtype)
    if dtype not in QUANTIZED_KV:
        return data
    per_layer = 1.0 if cfg.attention == "mla" else 2 * _kv_heads_per_rank(cfg, tp)
    return data + cfg.n_layers / pp * per_layer * KV_SCALE_BYTES


def weights_bytes(
    cfg: ModelConfig, *, tp: int = 1, pp: int = 1, ep: int = 1, dtype: str = "bf16", quantize=None
) -> float:
    """``weights_per_gpu``, or with ``quantize`` ("int8", "fp8") the exact count of
    ``theory.serving.weights.served_weight_bytes`` (its linears in one byte plus their scales, the
    rest at ``dtype``; dense models, pp = ep = 1)."""
    if quantize is None:
        return weights_per_gpu(cfg, tp=tp, pp=pp, ep=ep, dtype=dtype)
    if pp > 1 or ep > 1:
        raise ValueError(f"quantized weights are counted at pp = ep = 1 here, got pp={pp} ep={ep}")
    return served_weight_bytes(cfg, tp=tp, quantize=quantize, dtype=dtype)["total"]


def kv_per_token_by_attention(cfg: ModelConfig, dtype: str = "bf16") -> dict[str, float]:
    """KV bytes per token of ``cfg``'s shape cached three ways: MHA (every query head has its own K
    and V), GQA (``kv_heads`` of them) and, when the config has a latent (``kv_lora_rank``), MLA."""
    b, L = _dtype_bytes(dtype), cfg.n_layers
    if cfg.kv_lora_rank:  # MHA would cache every head's key (nope + rope part) and value
        return {
            "MHA": float(L * cfg.n_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim) * b),
            "MLA": float(L * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * b),
        }
    out = {"MHA": 2.0 * L * cfg.n_heads * cfg.dim_head * b, "GQA": 2.0 * L * cfg.kv_heads * cfg.dim_head * b}
    return out


def kv_capacity(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    context: int,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    mem_util: float = MEM_UTIL,
    block_size: int = BLOCK_SIZE,
    max_batched_tokens: int | None = None,
    dtype: str = "bf16",
    kv_dtype: str | None = None,
    quantize: str | None = None,
) -> dict:
    """How much KV cache one GPU of a replica holds, and how many sequences of ``context`` tokens fit
    (paged: whole blocks of ``block_size`` tokens), as vLLM sizes it after its profiling run:

        kv_budget = mem_util × hw.capacity_bytes − weights − activation peak

    the activation peak being one forward over ``max_batched_tokens`` rows (default ``context``: the
    engine's largest step prefills one whole prompt, as §3's time to first token assumes;
    ``theory.serving.profile.activation_peak``). The non-torch memory vLLM also subtracts (CUDA
    graphs, NCCL buffers) is not counted. Raises ``ValueError`` when not one sequence fits, naming a
    tp that would. ``kv_dtype`` (default ``dtype``): the cache's dtype, a quantized one with its
    scales (``kv_block_bytes``); ``quantize`` ("int8", "fp8"): the weights' linears in one byte
    (``weights_bytes``)."""
    require_positive(context=context, block_size=block_size)
    kv_dtype = kv_dtype or dtype
    if not 0 < mem_util <= 1:
        raise ValueError(f"mem_util must be in (0, 1], got {mem_util}; vLLM's default is 0.9")
    step = context if max_batched_tokens is None else max_batched_tokens
    require_positive(max_batched_tokens=step)
    memory = mem_util * hw.capacity_bytes

    def room(t: int) -> tuple[float, float, float]:  # weights, activation peak, what is left for the cache
        weights = weights_bytes(cfg, tp=t, pp=pp, ep=ep, dtype=dtype, quantize=quantize)
        act = activation_peak(cfg, tokens=step, tp=t, dtype=dtype)
        return weights, act, memory - weights - act

    weights, activations, budget = room(tp)
    per_token = kv_bytes_per_token(cfg, tp=tp, pp=pp, dtype=kv_dtype)
    block = kv_block_bytes(cfg, tp=tp, pp=pp, dtype=kv_dtype, block_size=block_size)
    per_seq = math.ceil(context / block_size)
    if budget < block * per_seq:
        ok = [
            t
            for t in divisors(cfg.n_heads)
            if t > tp
            and room(t)[2] >= per_seq * kv_block_bytes(cfg, tp=t, pp=pp, dtype=kv_dtype, block_size=block_size)
        ]
        raise ValueError(
            f"{cfg.name} at tp={tp} pp={pp}: weights {weights / 1e9:.1f} GB and activations "
            f"{activations / 1e9:.2f} GB per GPU leave {max(budget, 0) / 1e9:.2f} GB of {mem_util:g} × "
            f"{hw.capacity_bytes / 1e9:.1f} GB, not one sequence of {context} tokens; "
            + (f"try tp >= {ok[0]}" if ok else "use more GPUs per replica")
        )
    blocks = int(budget // block)
    return {
        "memory": memory,
        "weights": weights,
        "activations": activations,
        "kv_budget": budget,
        "kv_bytes_per_token": per_token,
        "block_bytes": block,
        "blocks": blocks,
        "tokens": blocks * block_size,
        "blocks_per_seq": per_seq,
        "max_seqs": blocks // per_seq,
    }


def paged_kv_bytes(lengths, kv_per_token: float, block_size: int = BLOCK_SIZE) -> float:
    """Bytes a paged cache holds for sequences of ``lengths`` tokens: whole blocks each."""
    return sum(math.ceil(n / block_size) for n in lengths) * block_size * kv_per_token


# ---- time ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Phase:
    """One prefill or decode step on one GPU: its work, and the roofline's time."""

    flops: float
    bytes: float  # read from memory (weights + KV cache)
    compute: float  # seconds at achievable FLOP/s
    memory: float  # seconds at achievable bandwidth
    comm: float  # seconds in tensor-parallel all-reduces and pipeline sends
    stages: int = 1

    @property
    def seconds(self) -> float:
        return self.stages * max(self.compute, self.memory) + self.comm

    @property
    def bound(self) -> str:
        return "compute" if self.compute >= self.memory else "memory"

    def as_dict(self) -> dict:
        return {**asdict(self), "seconds": self.seconds, "bound": self.bound}


def tp_allreduce_bytes(cfg: ModelConfig, *, tokens: int, tp: int, act_bytes: float = 2) -> float:
    """Bytes one rank sends per layer in tensor parallelism's two all-reduces of [tokens, hidden]."""
    return 2 * sent_bytes("all_reduce", tokens * cfg.hidden * act_bytes, tp)


RING_STEP = 5e-6  # seconds per ring step, the default ``latency``
BY_SIZE = "by-size"  # ``latency=BY_SIZE``: one-shot, two-shot or ring, whichever is least for the message


def allreduce_seconds(message: float, tp: int, hw: Hardware, latency: float | str = RING_STEP) -> float:
    """One TP all-reduce of ``message`` bytes per rank: a ring with ``latency`` seconds per step
    (2(tp − 1) steps), or with ``latency="by-size"`` the algorithm a library picks by size
    (``theory.cost.allreduce_algo``: one-shot below a few hundred KB, ~10 µs whatever tp)."""
    if latency == BY_SIZE:
        return allreduce_algo.allreduce_seconds(message, tp, hw.intra_node_bandwidth)[0]
    if isinstance(latency, str):
        raise ValueError(f"latency must be seconds per ring step (e.g. 5e-6) or {BY_SIZE!r}, got {latency!r}")
    return collective_seconds("all_reduce", message, tp, hw.intra_node_bandwidth, latency)


def _phase(
    cfg, hw, *, tokens, seq_len, kv_tokens, tp, pp, dtype, mfu, mbu, latency, kv_dtype=None, quantize=None
) -> Phase:
    require_positive(tokens=tokens, tp=tp, pp=pp)
    kv_dtype = kv_dtype or dtype
    if not (0 < mfu <= 1 and 0 < mbu <= 1):
        raise ValueError(f"mfu and mbu must be in (0, 1], got {mfu} and {mbu}")
    b = _dtype_bytes(dtype)
    flops = tokens * flops_per_token(cfg, seq_len, training=False) / (tp * pp)
    kv_per_token = kv_block_bytes(cfg, tp=tp, pp=pp, dtype=kv_dtype) / BLOCK_SIZE  # with a quantized block's scales
    read = weights_bytes(cfg, tp=tp, pp=pp, dtype=dtype, quantize=quantize) + kv_tokens * kv_per_token
    message = tokens * cfg.hidden * b
    comm = 2 * cfg.n_layers * allreduce_seconds(message, tp, hw, latency)
    if pp > 1:
        comm += (pp - 1) * (message / hw.intra_node_bandwidth + (RING_STEP if latency == BY_SIZE else latency))
    return Phase(flops, read, flops / (hw.peak_bf16_flops * mfu), read / (hw.memory_bandwidth * mbu), comm, pp)


def prefill(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    prompt: int,
    batch: int = 1,
    tp: int = 1,
    pp: int = 1,
    dtype: str = "bf16",
    mfu: float = 0.5,
    mbu: float = 0.8,
    latency: float | str = RING_STEP,
    kv_dtype: str | None = None,
    quantize: str | None = None,
) -> Phase:
    """Prefill of ``batch`` prompts of ``prompt`` tokens: its ``seconds`` is the time to first token."""
    return _phase(
        cfg,
        hw,
        tokens=batch * prompt,
        seq_len=prompt,
        kv_tokens=batch * prompt,
        tp=tp,
        pp=pp,
        dtype=dtype,
        mfu=mfu,
        mbu=mbu,
        latency=latency,
        kv_dtype=kv_dtype,
        quantize=quantize,
    )


def decode(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    context: int,
    batch: int = 1,
    tp: int = 1,
    pp: int = 1,
    dtype: str = "bf16",
    mfu: float = 0.5,
    mbu: float = 0.8,
    latency: float | str = RING_STEP,
    kv_dtype: str | None = None,
    quantize: str | None = None,
) -> Phase:
    """One decode step of ``batch`` sequences with ``context`` tokens cached each: its ``seconds``
    is the time per output token; it reads this GPU's weights and ``batch·context`` tokens of KV.
    ``kv_dtype`` and ``quantize`` (as in ``kv_capacity``) price the bytes read in those formats; the
    FLOPs stay at the bf16 peak (a dequantizing kernel; FP8 tensor cores would double the peak)."""
    return _phase(
        cfg,
        hw,
        tokens=batch,
        seq_len=context,
        kv_tokens=batch * context,
        tp=tp,
        pp=pp,
        dtype=dtype,
        mfu=mfu,
        mbu=mbu,
        latency=latency,
        kv_dtype=kv_dtype,
        quantize=quantize,
    )


def flat_allreduce_latency(tp: int, seconds: float = 10e-6) -> float:
    """The per-ring-step ``latency`` that makes a small all-reduce over ``tp`` ranks cost ``seconds``
    in all, for ``prefill``/``decode``/``serving_layout``. Their default (5 µs per step of a ring,
    2(tp − 1) steps) is far above what small all-reduces measure inside an NVLink/NVSwitch node
    (about 10 µs whatever tp from 2 to 8 on H100s, NCCL's tree and NVLS algorithms not being rings):
    this reads a measured flat cost into the same formula."""
    require_positive(tp=tp)
    return seconds / (2 * (tp - 1)) if tp > 1 else 0.0


def critical_batch(cfg: ModelConfig, hw: Hardware, *, dtype: str = "bf16", mfu: float = 0.5, mbu: float = 0.8) -> float:
    """The decode batch at which compute time equals weight-reading time (KV ignored): Pope et al.'s
    point where decode stops being memory-bound, ``(peak·mfu / (bw·mbu)) · bytes / 2`` tokens."""
    return hw.peak_bf16_flops * mfu / (hw.memory_bandwidth * mbu) * _dtype_bytes(dtype) / 2
