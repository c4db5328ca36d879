"""Predict a sharded run (``playbook run zero``, ``playbook run fsdp2``) on a ``TrainSetup``: the bytes
rank 0 holds, the padding our flat units need, and FSDP2's bytes sent per step.

The exact counts are ``theory.zero.zero``'s (Rajbhandari et al. 2019, *ZeRO*, arXiv:1910.02054, §5 and
§7, for our padded flat units; Zhao et al. 2023, *PyTorch FSDP*, arXiv:2304.11277, for FSDP2's
per-parameter shards); activations are those of this rank's rows (``theory.hybrid.memory``).

Pure arithmetic, no torch.
"""

from __future__ import annotations

from playbook.theory.cost.comm import sent_bytes
from playbook.theory.zero.zero import padding_elements, zero3_gathered_peak, zero_state_bytes


def predicted_memory(setup, *, stage: int, world_size: int, prefetch: bool = True, precision: str = "fp32") -> dict:
    """Rank 0's predicted bytes: model state (exact, padded), activations, and ZeRO-3's gathered peaks,
    in ``precision`` ("fp32", or "mixed": bf16 units and activations, fp32 masters and AdamW states)."""
    cfg = setup.config()
    state = zero_state_bytes(cfg, stage=stage, world_size=world_size, precision=precision).as_dict()
    state.pop("total")
    out = {**state, "activations": setup.predicted_memory(world_size, precision=precision).activations}
    if stage == 3:
        out["peak_gathered"] = zero3_gathered_peak(cfg, world_size=world_size, prefetch=prefetch, precision=precision)
    return out


def padding_note(setup, *, world_size: int) -> list[str]:
    """One line for the report when ``world_size`` ranks do not divide every unit evenly, else none."""
    pads = {k: v for k, v in padding_elements(setup.config(), world_size).items() if v}
    if not pads:
        return []
    listed = ", ".join(f"{k} +{v}" for k, v in pads.items())
    return [
        f"{world_size} ranks do not divide every unit evenly: padded with zeros ({listed} elements, "
        f"{4 * sum(pads.values())} bytes in all); the predictions include the padding"
    ]


def fsdp2_comm_per_step(setup, *, world_size: int) -> dict[str, float]:
    """Bytes one rank sends per step under FSDP2 with our grouping (ring formulas, ``theory.cost.comm``).

    Like our ZeRO-3: every group (each block, and the root: embedding, final norm, head) is
    all-gathered before its forward and again before its backward, and its gradients are
    reduce-scattered once; plus the loss all-reduce. No padding when the ranks divide every
    weight's first dimension (``theory.zero.zero.fsdp2_state_bytes`` checks that).
    """
    cfg, n = setup.config(), world_size
    total = 4 * cfg.num_params()
    return {
        "all_gather": 2 * sent_bytes("all_gather", total, n),
        "reduce_scatter": sent_bytes("reduce_scatter", total, n),
        "all_reduce": sent_bytes("all_reduce", 4, n),
    }
