"""Memory of one planner layout on its most loaded GPU, by category, with either activation model:
"ours" (``theory.activations``: our teaching GPT's kernels, exact on real ranks) or "production"
(``theory.prod_activations``: fused kernels as Megatron-LM runs them). Model state (parameters,
gradients, Adam's state under ZeRO) is ``theory.memory.training_memory``'s either way. No torch.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.theory.memory import training_memory
from playbook.theory.prod_activations import production_stage_activations


def memory_breakdown(
    cfg: ModelConfig, lay, seq_len: int, attention: str = "flash", activations: str = "production"
) -> dict[str, float]:
    """Bytes on the most loaded GPU of ``lay`` by category: params, grads, optimizer (``training_memory``,
    mixed precision, SP with tp) and activations, counted by ``activations``: "ours" (our teaching
    GPT's kernels, ``training_memory``'s own count) or "production" (``theory.prod_activations``:
    fused kernels, SP-sharded saved inputs, the schedule's micro-batches in flight)."""
    mem = training_memory(
        cfg,
        seq_len=seq_len,
        micro_batch=lay.micro_batch,
        **lay.degrees,
        zero=lay.zero,
        sequence_parallel=lay.tp > 1,
        recompute=lay.recompute,
        precision="mixed",
        attention=attention,
    )
    out = {"params": mem.params, "grads": mem.grads, "optimizer": mem.optimizer, "activations": mem.activations}
    if activations == "production":
        out["activations"] = production_stage_activations(
            cfg,
            seq_len=seq_len,
            micro_batch=lay.micro_batch,
            microbatches=lay.microbatches,
            **lay.degrees_no_dp,
            recompute=lay.recompute,
            attention=attention,
        )
    return out


def memory_bytes(
    cfg: ModelConfig, lay, seq_len: int, attention: str = "flash", activations: str = "production"
) -> float:
    """Total of :func:`memory_breakdown`."""
    return sum(memory_breakdown(cfg, lay, seq_len, attention, activations).values())
