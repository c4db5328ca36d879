"""Activations of a PRODUCTION training stack (Megatron-LM / Transformer Engine kernels), by tensor:
the planner's default, beside ``theory.activations`` (OUR teaching GPT's kernels, exact to the byte).

Per layer, on one rank of tp = t (sequence parallelism whenever t > 1), cp = c, s' = s/c tokens,
b sequences, B bytes per activation element (16-bit: 2), a query and g key/value heads of d:

    norm before attention   input, sharded s'/t under SP           s'·b·h·B/t
      (fused RMSNorm)       its fp32 1/rms statistics               4·s'·b/t
    q, k, v input           the norm output; under SP Megatron saves its SHARD and all-gathers it
                            again in backward (Korthikanti et al. 2022, arXiv:2205.05198, §4.2.2)
                                                                    s'·b·h·B/t
    flash attention         q, k, v (after RoPE) and its output (the o_proj input, one tensor)
                            s'·b·(2a + 2g)·d·B/t, and its fp32 log-sum-exp 4·s'·b·a/t
                            (Dao et al. 2022, arXiv:2205.14135; no [s, s] tensor is kept)
    norm before the MLP     input (the residual sum), statistics, output shard as above
    fused SwiGLU            fc1's output [gate | up], saved by the fused kernel, 2·s'·b·f·B/t, and
                            its output, the down-projection's input, s'·b·f·B/t
    no dropout              (Llama 3, DeepSeek-V3 and Megatron's current GPT recipes train without)

Switches reproduce Korthikanti et al. 2022 Table 2 (GPT-3 block: LayerNorm, GeLU MLP with
f = 4h, eager attention, dropout with 1-byte masks): ``attention="eager"`` keeps Q, K (4sbh), V
(2sbh), the softmax output (2as²b), ``dropout=True`` adds its mask (as²b) and output (2as²b) and
the two sbh dropout masks after attention and the MLP; ``mlp="gelu"`` keeps the GeLU's input and
output (8sbh each); ``norm="layernorm"`` keeps only the input (their count). Then a layer is
34·s·b·h + 5·a·s²·b bytes, sbh(10 + 24/t + 5as/(ht)) under TP, sbh(34/t + 5as/(ht)) with SP,
minus the s² term under selective recomputation (``tests/test_prod_activations.py``).

Recomputation: "selective" reruns the attention core (flash: the kernel, so its log-sum-exp is
not kept; eager: the s² tensors); "full" keeps only each layer's input, s'·b·h·B/t (with SP the
input is already the shard; the paper's table writes 2sbh for every t). The tensors are the
production kernel set of the one inventory (``theory.inventory.production_block``), viewed as
``theory.activations``' exact counts are (``theory.inventory.view``). No torch.
"""

from __future__ import annotations

import functools

from playbook.config import ModelConfig
from playbook.theory.inventory import INDEX_BYTES, production_block, view

ACTIVATION_MODELS = ("production", "ours")
V_SHAPES = ("zb-v", "dualpipe-v")  # rank 0 holds the first and the last chunk (plan_schedule.V_SHAPED)


def check_activations(activations: str) -> None:
    """One line naming the choices when ``activations`` is not a model we count."""
    if activations not in ACTIVATION_MODELS:
        raise ValueError(f"activations must be one of {', '.join(ACTIVATION_MODELS)}; got {activations!r}")


def production_block_breakdown(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool | None = None,
    recompute: str = "none",
    dtype_bytes: int = 2,
    attention: str = "flash",
    mlp: str = "swiglu",
    norm: str = "rmsnorm",
    dropout: bool = False,
    moe: bool = False,
) -> dict[str, float]:
    """Bytes one layer saves for backward on one rank, by tensor (module docstring). ``moe``: the
    MLP is a routed mixture of experts at even routing (each rank's experts see top_k/1 of the tokens
    on average): router probabilities, the dispatched tokens and the fused SwiGLU of every routed
    and shared expert copy."""
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be one of none, selective, full; got {recompute!r}")
    kernels = dict(attention=attention, mlp=mlp, norm=norm, dropout=dropout, moe=moe)
    sizes = dict(seq_len=seq_len, micro_batch=micro_batch, tp=tp, cp=cp, sequence_parallel=sequence_parallel)
    return view(production_block(cfg, **sizes, dtype_bytes=dtype_bytes, **kernels), recompute)


def production_block_bytes(cfg: ModelConfig, **kw) -> float:
    """Sum of :func:`production_block_breakdown`."""
    return sum(production_block_breakdown(cfg, **kw).values())


def production_end_bytes(
    cfg: ModelConfig, *, seq_len: int, micro_batch: int, tp: int = 1, cp: int = 1, dtype_bytes: int = 2
) -> tuple[float, float]:
    """(first stage's extra: the int64 token ids; last stage's extra: the final norm's input and
    output shard, the vocab-parallel cross-entropy's softmax [s', b, V/t] and the int64 labels)."""
    s, b, h, B, t = seq_len // cp, micro_batch, cfg.hidden, dtype_bytes, tp
    first = s * b * INDEX_BYTES
    last = 2 * s * b * h * B / t + s * b * cfg.vocab_size * B / t + s * b * INDEX_BYTES
    return float(first), float(last)


def in_flight(schedule: str, pp: int, microbatches: int, v: int = 1) -> float:
    """Micro-batches of a full stage's activations the first stage holds at the step's peak:
    1F1B min(p, m) (Narayanan et al. 2021, arXiv:2104.04473, §2.2); interleaved with v model chunks
    per stage that times 1 + (p − 1)/(p·v) (Korthikanti et al. 2022, arXiv:2205.05198, §4.2.3), but
    never more than the m there are (m = p: Megatron's warm-up is every forward, before any backward);
    ZB-H1 the same as 1F1B (Qi et al. 2023, arXiv:2401.10241, §3); the V-shaped ZB-V and
    DualPipe-V hold 2p chunk-halves, i.e. p full stages (``theory.schedules_v``)."""
    p, m = pp, microbatches
    if p == 1:
        return 1.0
    if schedule == "interleaved":
        return min(min(p, m) * (1 + (p - 1) / (p * v)), m)
    return float(min(p, m))


def production_rank_activations(cfg: ModelConfig, **kw) -> dict[int, float]:
    """:func:`rank_activations` as a dict: rank -> bytes."""
    return dict(rank_activations(cfg, **kw))


@functools.lru_cache(maxsize=65536)
def rank_activations(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    microbatches: int = 1,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,  # the layout's degree: at even routing a rank's activations do not depend on it
    recompute: str = "none",
    schedule: str = "1f1b",
    v: int = 1,
    first_layers: int | None = None,
    attention: str = "flash",
    ends: str = "even",
) -> tuple[tuple[int, float], ...]:
    """(rank, activation bytes at the step's peak) for the pipeline ranks that can be the most
    loaded: the first stage holding :func:`in_flight` micro-batches of its layers (``first_layers``,
    default ⌈L/p⌉) and the token ids (rank 0), the last stage holding one micro-batch and the loss's
    softmax (rank p − 1; on a V, whose rank 0 computes the loss, rank 0 holds the more of the two).
    Full recomputation adds, for backward's peak, one layer recomputed in full. ``ends="light"``
    (Llama 3's lighter first and last stages, ``plan_schedule.chunk_layers``): every rank's order is
    played (``plan_schedule.layers_held``) and every rank is given; the most loaded, often the
    second, sets the peak. The model state differs by rank too (the embedding, the head):
    ``plan_memory`` adds each rank's own."""
    sizes = dict(seq_len=seq_len, micro_batch=micro_batch, tp=tp, cp=cp)
    first, last = production_end_bytes(cfg, **sizes)
    sizes["attention"] = attention
    dense = production_block_bytes(cfg, **sizes, recompute=recompute)
    moe = production_block_bytes(cfg, **sizes, recompute=recompute, moe=True) if cfg.is_moe else dense
    share = cfg.n_moe_layers / cfg.n_layers
    block = (1 - share) * dense + share * moe
    L = cfg.n_layers
    layers = -(-L // pp) if first_layers is None else first_layers
    transient = production_block_bytes(cfg, **sizes, moe=cfg.is_moe) if recompute == "full" else 0.0
    if pp == 1:
        return ((0, layers * block + first + last + transient),)
    held = in_flight(schedule, pp, microbatches, v)
    if ends != "even":
        from playbook.theory.plan_schedule import chunk_layers, layers_held

        per_rank = [n * block for n in layers_held(schedule, pp, microbatches, v, chunk_layers(L, pp, v, ends))]
        per_rank[0] += held * first  # token ids of every micro-batch in flight (bytes, not GB)
        per_rank[-1] += last  # the last chunk: final norm, the loss's softmax, the labels
        return tuple((r, a + transient) for r, a in enumerate(per_rank))
    head, tail = held * (layers * block + first), layers * block + last
    if schedule in V_SHAPES:
        return ((0, max(head, tail) + transient),)
    return ((0, head + transient), (pp - 1, tail + transient))
