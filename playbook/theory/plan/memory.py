"""Memory of one planner layout on its most loaded GPU, by category, with either activation model:
"ours" (``theory.inventory.activations``: our teaching GPT's kernels, exact on real ranks) or "production"
(``theory.inventory.prod_activations``: fused kernels as Megatron-LM runs them). Model state (parameters,
gradients, Adam's state under ZeRO) is ``theory.hybrid.memory.training_memory``'s for "ours"; for
"production" with a pipeline, each candidate rank's own, from its own chunks (:func:`rank_state`:
the planner's per-layer count, ``theory.hybrid.stages``, chunk by chunk), and the peak is the most of state
+ activations over the ranks: the rank with the most activations need not hold the most state. No torch.
"""

from __future__ import annotations

import functools
import itertools

from playbook.config import ModelConfig
from playbook.theory.inventory.model_state import model_state_bytes
from playbook.theory.hybrid.memory import training_memory
from playbook.theory.inventory.inventory import RECOMPUTE_MODES
from playbook.theory.plan.schedule import chunk_layers, layers_held
from playbook.theory.pp.schedules import V_SCHEDULES, chunks_per_rank
from playbook.theory.inventory.prod_activations import production_block_bytes, production_end_bytes
from playbook.theory.pp.rank_params import chunk_ranges
from playbook.theory.hybrid.stages import _stage_params


def in_flight(schedule: str, pp: int, microbatches: int, v: int = 1) -> float:
    """Micro-batches of a full stage's activations the first stage holds at the step's peak:
    1F1B min(p, m) (Narayanan et al. 2021, arXiv:2104.04473, §2.2); interleaved with v model chunks
    per stage that times 1 + (p − 1)/(p·v) (Korthikanti et al. 2022, arXiv:2205.05198, §4.2.3), but
    never more than the m there are (m = p: Megatron's warm-up is every forward, before any backward);
    ZB-H1 the same as 1F1B (Qi et al. 2023, arXiv:2401.10241, §3); the V-shaped ZB-V and
    DualPipe-V hold 2p chunk-halves, i.e. p full stages (``theory.pp.v``)."""
    p, m = pp, microbatches
    if p == 1:
        return 1.0
    if schedule == "interleaved":
        return min(min(p, m) * (1 + (p - 1) / (p * v)), m)
    return float(min(p, m))


def production_rank_activations(cfg: ModelConfig, **kw) -> dict[int, float]:
    """:func:`rank_activations` as a dict: rank -> bytes (remembered without ``ep``, which it does not read:
    a search asks the same for every ep of one structure)."""
    return dict(rank_activations(cfg, **{k: v for k, v in kw.items() if k != "ep"}))


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
    (Llama 3's lighter first and last stages, ``theory.plan.schedule.chunk_layers``): every rank's order is
    played (``theory.plan.schedule.layers_held``) and every rank is given; the most loaded, often the
    second, sets the peak. The model state differs by rank too (the embedding, the head):
    ``theory.plan.memory`` adds each rank's own."""
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
        per_rank = [n * block for n in layers_held(schedule, pp, microbatches, v, chunk_layers(L, pp, v, ends))]
        per_rank[0] += held * first  # token ids of every micro-batch in flight (bytes, not GB)
        per_rank[-1] += last  # the last chunk: final norm, the loss's softmax, the labels
        return tuple((r, a + transient) for r, a in enumerate(per_rank))
    head, tail = held * (layers * block + first), layers * block + last
    if schedule in V_SCHEDULES:
        return ((0, max(head, tail) + transient),)
    return ((0, head + transient), (pp - 1, tail + transient))


@functools.lru_cache(maxsize=4096)
def rank_chunks(cfg: ModelConfig, pp: int, rank: int, schedule: str, v: int, ends: str) -> tuple[tuple, ...]:
    """The chunks pipeline rank ``rank`` holds, each (first layer, layers, holds the embedding, holds
    the head): "even" as ``theory.pp.rank_params.chunk_ranges`` places the pieces (Megatron's loop, or
    the V), "light" with ``theory.plan.schedule.chunk_layers``' sizes, chunk c on virtual stage c·p + rank."""
    L, v = cfg.n_layers, chunks_per_rank(schedule, v)
    if ends == "even":
        pieces = chunk_ranges(cfg, pp, rank, schedule, v)
    else:
        sizes = chunk_layers(L, pp, v, ends)
        starts = [0, *itertools.accumulate(sizes)][:-1]  # a running sum, not (p·v)² additions
        stages = [c * pp + rank for c in range(v)]
        pieces = [(starts[k] + (k > 0), starts[k] + sizes[k] + 1 + (k == pp * v - 1)) for k in stages]
    return tuple((max(a, 1) - 1, max(0, min(b, L + 1) - max(a, 1)), a == 0, b == L + 2) for a, b in pieces)


@functools.lru_cache(maxsize=65536)
def rank_state(cfg, degrees, zero, accum, chunks) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes of one rank holding ``chunks`` (:func:`rank_chunks`): the
    planner's per-layer count chunk by chunk (``theory.hybrid.stages._stage_params``: matrices, shared experts,
    embedding and head 1/tp, norms and routers whole, E/ep routed experts), dense weights sharded
    by ZeRO over dp·cp, routed experts over dp·cp/ep, as ``training_memory`` shards a stage's;
    ``accum``: ``fp32_grad_accum``."""
    d = dict(degrees)
    dense, experts = _chunk_params(cfg, d["tp"], d["ep"], chunks)
    parts = [_state(dense, d["dp"] * d["cp"], zero, accum)]
    if experts:
        parts.append(_state(experts, d["dp"] * d["cp"] // d["ep"], zero, accum))
    return tuple(sum(p[i] for p in parts) for i in range(3))


@functools.lru_cache(maxsize=65536)
def _state(params: float, dp: int, zero: int, accum) -> tuple[float, float, float]:
    """``model_state_bytes``' (params, grads, optimizer), remembered: every ep of one structure
    shards the same dense parameters over the same dp·cp."""
    mem = model_state_bytes(params, dp=dp, zero=zero, precision="mixed", fp32_grad_accum=accum)
    return mem.params, mem.grads, mem.optimizer


@functools.lru_cache(maxsize=65536)
def _chunk_params(cfg, tp: int, ep: int, chunks) -> tuple[float, float]:
    """(dense, routed-expert) parameters of one rank holding ``chunks``, summed chunk by chunk
    (``theory.hybrid.stages._stage_params``), remembered: the same at every dp and ZeRO stage, which
    :func:`rank_state` is asked once for each."""
    dense = experts = 0.0
    for start, n, first, last in chunks:
        a, b = _stage_params(cfg, range(start, start + n), tp=tp, ep=ep, first=first, last=last)
        dense, experts = dense + a, experts + b
    return dense, experts


@functools.lru_cache(maxsize=65536)
def _ours(
    cfg, seq_len, micro_batch, degrees, zero, recompute, attention, grad_accum=False
) -> tuple[float, float, float, float]:
    """training_memory's (params, grads, optimizer, activations), remembered: a search asks for the
    same degrees, ZeRO stage and recomputation once per schedule and micro-batch count."""
    mem = training_memory(
        cfg,
        seq_len=seq_len,
        micro_batch=micro_batch,
        **dict(degrees),
        zero=zero,
        sequence_parallel=dict(degrees)["tp"] > 1,
        recompute=recompute,
        precision="mixed",
        attention=attention,
        fp32_grad_accum=grad_accum,
    )
    return mem.params, mem.grads, mem.optimizer, mem.activations


def _refuse_as_training_memory(cfg, seq_len, degrees: dict, recompute: str, attention: str) -> None:
    """Raise what ``training_memory`` raises for ``degrees`` (a layout it cannot model is not planned).
    Its refusals read dp, tp, pp, cp, whether ep is 1 (which picks its path) and whether ep divides
    dp·cp (the one message naming ep), never ep's value nor the ZeRO stage: so they are asked once per
    structure, with ep at the smallest factor of dp·cp standing for any ep that divides it."""
    error = _refusal_at(cfg, seq_len, *(degrees[a] for a in ("dp", "tp", "pp", "cp", "ep")), recompute, attention)
    if error is not None:
        raise error


@functools.lru_cache(maxsize=65536)
def _refusal_at(cfg, seq_len, dp, tp, pp, cp, ep, recompute, attention) -> Exception | None:
    """:func:`_refuse_as_training_memory`'s refusal (None: modelled), remembered per structure: a
    search asks it for every variant."""
    if ep != 1 and (dp * cp) % ep == 0:
        ep = next(k for k in range(2, dp * cp + 1) if (dp * cp) % k == 0)
    return _refusal(cfg, seq_len, (("dp", dp), ("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)), recompute, attention)


@functools.lru_cache(maxsize=65536)
def _refusal(cfg, seq_len, degrees, recompute, attention) -> Exception | None:
    """The refusal of :func:`_refuse_as_training_memory`, remembered (None: modelled)."""
    try:
        _ours(cfg, seq_len, 1, degrees, 0, recompute, attention, "main_grad")
    except (ValueError, NotImplementedError) as e:
        return e
    return None


def memory_breakdown(
    cfg: ModelConfig, lay, seq_len: int, attention: str = "flash", activations: str = "production"
) -> dict[str, float]:
    """Bytes on the most loaded GPU of ``lay`` by category: params, grads, optimizer and activations,
    counted by ``activations``: "ours" (our teaching GPT's kernels, ``training_memory``'s own count)
    or "production" (``theory.inventory.prod_activations``: fused kernels, SP-sharded saved inputs, the
    schedule's micro-batches in flight; the gradients accumulated in fp32: Megatron-LM's
    ``main_grad``, which it requires with bf16, and Llama 3's "FP32 gradient accumulation ... and
    reduce-scatter gradients in FP32" (Dubey et al. 2024, arXiv:2407.21783, §3.3.2), sharded as ZeRO
    shards the bf16 ones up to ZeRO-2; ZeRO-3 without a pipeline keeps ZeRO's 16Ψ/Nd, as FSDP's fp32
    sharded parameter and gradient do). With a pipeline, production's state is each candidate
    rank's own (:func:`rank_state`) and the categories are those of the rank whose state +
    activations is the most."""
    if activations == "ours" and getattr(lay, "ends", "even") != "even":
        raise ValueError("ends=light is counted with production activations; ours counts even 1F1B stages")
    zero = lay.zero
    if activations == "ours":
        state = _ours(cfg, seq_len, lay.micro_batch, tuple(lay.degrees.items()), zero, lay.recompute, attention)
        return dict(zip(("params", "grads", "optimizer", "activations"), state))
    accum = "main_grad" if zero < 3 else False
    schedule, v, ends = getattr(lay, "schedule", "1f1b"), getattr(lay, "v", 1), getattr(lay, "ends", "even")
    acts = production_rank_activations(
        cfg,
        seq_len=seq_len,
        micro_batch=lay.micro_batch,
        microbatches=lay.microbatches,
        **lay.degrees_no_dp,
        recompute=lay.recompute,
        attention=attention,
        schedule=schedule,
        v=v,
        ends=ends,
    )
    # training_memory's state (and its refusals: a layout it cannot model is not planned), the same at any b;
    # with a pipeline only the refusals, which do not depend on the ZeRO stage: asked once at ZeRO 0
    if lay.pp == 1:
        state = _ours(cfg, seq_len, 1, tuple(lay.degrees.items()), zero, lay.recompute, attention, accum)
        return dict(zip(("params", "grads", "optimizer"), state[:3]), activations=acts[0])
    degrees = lay.degrees
    _refuse_as_training_memory(cfg, seq_len, degrees, lay.recompute, attention)
    states = _pipeline_states(cfg, tuple(degrees.items()), zero, accum, schedule, v, ends, tuple(acts))
    rows = [(sum(state) + act, state, act) for state, act in zip(states, acts.values())]
    _, state, act = max(rows, key=lambda row: row[0])
    return dict(zip(("params", "grads", "optimizer"), state), activations=act)


@functools.lru_cache(maxsize=65536)
def _pipeline_states(cfg, degrees: tuple, zero, accum, schedule, v, ends, ranks: tuple) -> tuple[tuple, ...]:
    """:func:`rank_state` of each of ``ranks``, remembered: the same for every micro-batch and
    recomputation of one ZeRO stage and placement."""
    pp = dict(degrees)["pp"]
    return tuple(rank_state(cfg, degrees, zero, accum, rank_chunks(cfg, pp, r, schedule, v, ends)) for r in ranks)


def memory_bytes(
    cfg: ModelConfig, lay, seq_len: int, attention: str = "flash", activations: str = "production"
) -> float:
    """Total of :func:`memory_breakdown`."""
    return sum(memory_breakdown(cfg, lay, seq_len, attention, activations).values())


def _memory_key(v, states: tuple = ()) -> tuple:
    """What orders a layout's bytes among its variants (same degrees): micro-batches in flight per
    micro-batch (the schedule's factor), b, ZeRO (reversed), recomputation (reversed) and ``states``
    (:func:`placement_states`): a rank's activations grow with the first four, its state differs
    by placement (which rank holds the embedding and the head, and how many layers)."""
    held = in_flight(v.schedule, v.pp, v.microbatches, v.v) / v.microbatches
    return (held, v.micro_batch, -v.zero, -RECOMPUTE_MODES.index(v.recompute), states)


def placement_states(cfg: ModelConfig, v, activations: str = "production") -> tuple[float, ...]:
    """For production's pipelines, the state bytes (:func:`rank_state`) of each rank whose activations
    are counted (``theory.plan.memory.rank_activations``); () otherwise. The same for every variant of
    one ZeRO stage, placement (a V or not, v) and ends."""
    if activations != "production" or v.pp == 1:
        return ()
    ranks = range(v.pp) if v.ends != "even" else (0,) if v.schedule in V_SCHEDULES else (0, v.pp - 1)
    accum, degrees = "main_grad" if v.zero < 3 else False, tuple(v.degrees.items())
    return tuple(
        sum(rank_state(cfg, degrees, v.zero, accum, rank_chunks(cfg, v.pp, r, v.schedule, v.v, v.ends))) for r in ranks
    )


def _needs_more(v: tuple, w: tuple) -> bool:
    """``v`` holds at least ``w``'s bytes (keys of :func:`_memory_key`): no component smaller, rank
    by rank for the states of the same ranks."""
    if v[0] < w[0] - 1e-12 or v[1] < w[1] or v[2] < w[2] or v[3] < w[3]:  # the scalars first: cheaper
        return False
    mine, theirs = v[4], w[4]
    if len(mine) != len(theirs):
        return False
    for a, b in zip(mine, theirs):
        if a < b:
            return False
    return True
