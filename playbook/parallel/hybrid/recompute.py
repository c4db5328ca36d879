"""Step 4 of ``parallelize``: activation recomputation on whatever this rank holds.

After tensor, context and expert parallelism have rebuilt the blocks, and before the pipeline cuts
them into stages, each block of the rank's model is told what to keep (torchtitan applies
activation checkpointing at the same point, after TP/EP/CP and before FSDP):

- "selective" (Korthikanti et al. 2022, arXiv:2205.05198, §4): each attention keeps q, k, v and
  reruns its core in backward; the core is whatever the rank runs, the TP shard's heads or context
  parallelism's ring, whose K/V exchange is then sent again in backward;
- "full" (Chen et al. 2016, arXiv:1604.06174): each block keeps its input only and its whole
  forward reruns in backward, its TP and CP collectives included (Megatron pays them too,
  Korthikanti et al. 2022, §5).

Both use non-reentrant ``torch.utils.checkpoint``, so a pipeline stage calling its blocks one by
one (``pp.executor.Chunk``) recomputes them as the single process does. In an MoE block "full"
reruns the routing and the dispatch and combine all-to-alls too (``theory.hybrid.recompute``); the
replay stops inside the MoE layer, so its forward hooks (``parallel.hybrid.moe``) record each
forward once. "selective" leaves the MoE layer alone. The recomputed forward's
tensors are held by the checkpoint's own saved-tensor hooks, not by the pipeline's counter
(``measure.held.HeldActivations``): it counts what the forward keeps, never the replay.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from playbook.theory.inventory.inventory import RECOMPUTE_MODES
from playbook.model.moe import replay_context


def check_recompute(mode: str) -> None:
    """``mode`` is known. Every mode composes with every layout: under a split backward (ZB-H1, ZB-V,
    DualPipe-V) B recomputes each block once and W takes its inputs from that (``pp.executor``)."""
    if mode not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {mode!r}")


def apply_recompute(model: nn.Module, mode: str) -> nn.Module:
    """Set recomputation ``mode`` on every block of ``model`` (a GPT or its TP shard, CP's core
    already swapped in), in place; returns ``model``. Parameter names do not change."""
    check_recompute(mode)
    for block in model.blocks:
        block.attn.recompute_core = mode == "selective"
        if mode == "full":
            block.forward, block.checkpointed = _checkpointed(block.forward, block), True
    return model


def _checkpointed(forward, block: nn.Module):
    """``forward(x, positions)`` that keeps only its inputs and reruns in backward. Early stop is set
    here, not left to a global setting: the replay ends at the last tensor backward needs, so what
    it sends again is fixed (``theory.hybrid.recompute``), and in an MoE block it ends inside the
    MoE layer, before its forward hooks (routing records, the aux loss, ``parallel.hybrid.moe``):
    they fire once per forward, never for the replay; its routing is its forward's (the route biases
    of aux-loss-free balancing kept for it, ``model.moe.replay_context``)."""

    def run(x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return forward(x, positions)
        with set_checkpoint_early_stop(True):
            context = lambda: replay_context(block)  # noqa: E731
            return checkpoint(forward, x, positions, use_reentrant=False, context_fn=context)  # [b, s, h]

    return run
