"""Memory of one planner layout on its most loaded GPU, by category, with either activation model:
"ours" (``theory.activations``: our teaching GPT's kernels, exact on real ranks) or "production"
(``theory.prod_activations``: fused kernels as Megatron-LM runs them). Model state (parameters,
gradients, Adam's state under ZeRO) is ``theory.memory.training_memory``'s either way. No torch.
"""

from __future__ import annotations

import functools

from playbook.config import ModelConfig
from playbook.theory.memory import RECOMPUTE, training_memory
from playbook.theory.prod_activations import in_flight, production_stage_activations


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


def memory_breakdown(
    cfg: ModelConfig, lay, seq_len: int, attention: str = "flash", activations: str = "production"
) -> dict[str, float]:
    """Bytes on the most loaded GPU of ``lay`` by category: params, grads, optimizer (``training_memory``,
    mixed precision, SP with tp) and activations, counted by ``activations``: "ours" (our teaching
    GPT's kernels, ``training_memory``'s own count) or "production" (``theory.prod_activations``:
    fused kernels, SP-sharded saved inputs, the schedule's micro-batches in flight; up to ZeRO-2 the
    gradients accumulated in fp32, sharded like the bf16 ones: Megatron-LM's ``main_grad``, which it
    requires with bf16, and Llama 3's "FP32 gradient accumulation ... and reduce-scatter gradients in
    FP32" (Dubey et al. 2024, arXiv:2407.21783, §3.3.2); ZeRO-3 keeps ZeRO's 16Ψ/Nd, as FSDP's fp32
    sharded parameter and gradient do)."""
    if activations == "ours" and getattr(lay, "ends", "even") != "even":
        raise ValueError("ends=light is counted with production activations; ours counts even 1F1B stages")
    b = lay.micro_batch if activations == "ours" else 1  # production: only the state is read, the same at any b
    accum = "main_grad" if activations == "production" and lay.zero < 3 else False
    state = _ours(cfg, seq_len, b, tuple(lay.degrees.items()), lay.zero, lay.recompute, attention, accum)
    out = dict(zip(("params", "grads", "optimizer", "activations"), state))
    if activations == "production":
        out["activations"] = production_stage_activations(
            cfg,
            seq_len=seq_len,
            micro_batch=lay.micro_batch,
            microbatches=lay.microbatches,
            **lay.degrees_no_dp,
            recompute=lay.recompute,
            attention=attention,
            schedule=getattr(lay, "schedule", "1f1b"),
            v=getattr(lay, "v", 1),
            ends=getattr(lay, "ends", "even"),
        )
    return out


def memory_bytes(
    cfg: ModelConfig, lay, seq_len: int, attention: str = "flash", activations: str = "production"
) -> float:
    """Total of :func:`memory_breakdown`."""
    return sum(memory_breakdown(cfg, lay, seq_len, attention, activations).values())


def _memory_key(v) -> tuple[float, int, int, int]:
    """What orders a layout's bytes among its variants (same degrees): micro-batches in flight per
    micro-batch (the schedule's factor), b, ZeRO (reversed) and recomputation (reversed)."""
    held = in_flight(v.schedule, v.pp, v.microbatches, v.v) / v.microbatches
    return (held, v.micro_batch, -v.zero, -RECOMPUTE.index(v.recompute))


def _needs_more(v: tuple, w: tuple) -> bool:
    """``v`` holds at least ``w``'s bytes (keys of :func:`_memory_key`): no component smaller."""
    return v[0] >= w[0] - 1e-12 and v[1] >= w[1] and v[2] >= w[2] and v[3] >= w[3]
