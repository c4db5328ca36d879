"""Context parallelism (CP): split every sequence across n ranks, so each holds s/n tokens.

Why: activations grow with the sequence (and attention's with its square), while data, tensor and
pipeline parallelism leave each rank holding whole sequences. With CP every tensor outside
attention is simply 1/n as long; attention is the one place where a token needs the others, and
``playbook.parallel.cp.ring_attention`` supplies it three ways (ring, all-gather, Ulysses).

The rest of the model is threaded through unchanged:
- RoPE rotates each token by its *global* position (``positions``, from
  ``playbook.theory.cp.shard_positions``: contiguous, or zig-zag chunks i and 2n−1−i);
- the loss is the sum of cross-entropies over this rank's tokens divided by the global token
  count, so the n ranks' losses (and gradients) add up to the single-process mean;
- the weights are replicated (CP is data parallelism over tokens for everything but attention),
  so after backward their gradients are summed over the CP ranks with one all-reduce.

This file holds those pieces; ``parallel.cp.run`` trains with them (``parallel.training.train`` and
its hooks: ``batch``, every row and this rank's tokens; ``sync_grads``, ``sync_loss``: sums over the
``cp`` group of the mesh), the GPT running its own forward with the attention core swapped
(``use_attention``) and RoPE at ``positions``.

Ring attention: Liu et al. 2023, arXiv:2310.01889; zig-zag balance: Llama 3 (Dubey et al. 2024,
arXiv:2407.21783, §3.3.2); Ulysses: Jacobs et al. 2023 (arXiv:2309.14509).
PyTorch's own ``torch.distributed.tensor.experimental.context_parallel`` (in torch 2.13 by default
an all-gather of K/V with "head-tail" load balancing, i.e. our zig-zag layout) runs only on CUDA
SDPA kernels (no CPU path), so the from-scratch version is the one checked here.
"""

from __future__ import annotations

import torch

from playbook.model.gpt import GPT
from playbook.parallel.cp.ring_attention import VARIANTS, attention


# ---- the model, one shard of the sequence at a time -------------------------------------------
def cp_attention_fn(variant: str, group, *, zigzag: bool, causal: bool = True, positions=None, log=None):
    """A function (q, k, v) -> out for this rank's shard. ``group=None``: one process, plain
    attention at ``positions`` (the reference)."""
    if group is None:
        return lambda q, k, v: attention(q, k, v, positions, positions, causal)
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    extra = {"log": log} if variant == "ring" else {}
    return lambda q, k, v: VARIANTS[variant](q, k, v, group, zigzag=zigzag, causal=causal, **extra)


def use_attention(model, attend) -> None:
    """Swap every block's attention core (q, k, v) -> out for ``attend``, in place."""
    for block in model.blocks:
        block.attn.core = attend


def use_positions(model: GPT, positions: torch.Tensor, total_tokens: int) -> GPT:
    """Make ``model(tokens, targets)`` this rank's forward, in place: the GPT's own forward with
    RoPE at the tokens' global ``positions`` ([s/n] int64), returning ``(logits, loss)``, the loss
    ``GPT.loss``'s Σ over this rank's tokens / ``total_tokens`` (its share of the global mean)."""
    forward = model.forward  # GPT.forward, bound

    def shard_forward(tokens, targets=None):
        logits = forward(tokens, positions=positions)  # [batch, s/n, vocab]
        return logits if targets is None else (logits, model.loss(logits, targets, total_tokens))

    model.forward = shard_forward
    return model
