"""Tensor-parallel layers (Megatron-LM, Shoeybi et al. 2019, arXiv:1909.08053, §3): how a region
is entered and left, column- and row-parallel linears, the vocab-parallel embedding and loss.

A ``Region`` is one attention or MLP block (or the head): it is entered once on its column-parallel
layers (Megatron's f, or with sequence parallelism an all-gather of the sequence) and left on its
row-parallel layer (g, or a reduce-scatter to sequence shards; Korthikanti et al. 2022, §4.2.2).
The collectives themselves live in ``playbook.parallel.comm``; the model built from these layers is
``playbook.parallel.tp.model.TPGPT``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from playbook.parallel.comm import (
    CopyToModelParallelRegion,
    GatherFromSequenceParallelRegion,
    ReduceFromModelParallelRegion,
    ReduceScatterToSequenceParallelRegion,
    all_gather,
    all_reduce,
    reduce_scatter,
)


class LinearsWithSequenceParallelRegather(torch.autograd.Function):
    """SP as Megatron-LM runs it (Korthikanti et al. 2022, §4.2.2 and Table 2's TP+SP row): all-gather
    the sequence shard, apply the column-parallel weights, but save only the *shard*; backward
    all-gathers it again for the weight gradients, then reduce-scatters the input gradient. One more
    all-gather per region in backward buys s/t instead of s tokens of saved region input."""

    @staticmethod
    def forward(ctx, x, region, *weights):
        full = all_gather(x, 1, region.group, region.label, "forward")  # [b, s, h], not saved
        ctx.region = region
        ctx.save_for_backward(x, *weights)  # x: [b, s/t, h]
        return tuple(F.linear(full, w) for w in weights)  # each [b, s, out/t]

    @staticmethod
    def backward(ctx, *grads):
        x, *weights = ctx.saved_tensors
        full = all_gather(x, 1, ctx.region.group, ctx.region.label, "backward")  # [b, s, h] again
        flat = full.reshape(-1, full.shape[-1])  # [b*s, h]
        grad_w = [gy.reshape(-1, gy.shape[-1]).t() @ flat for gy in grads]  # each [out/t, h]
        grad_full = sum(gy @ w for gy, w in zip(grads, weights))  # [b, s, h], this rank's share
        return reduce_scatter(grad_full, 1, ctx.region.group, ctx.region.label, "backward"), None, *grad_w


@dataclass(frozen=True)
class Region:
    """One parallel region (a layer's attention or MLP, or the head): how it is entered and left.
    ``sequence_parallel``: all-gather / reduce-scatter instead of f / g; ``regather``: with SP, save
    only the sequence shard of the region's input and all-gather it again in backward."""

    group: object
    sequence_parallel: bool
    regather: bool
    label: str

    def columns(self, x: torch.Tensor, *layers) -> list[torch.Tensor]:
        """Enter the region once and apply every column-parallel layer that reads its input
        (q, k, v; gate, up; the head): their input gradients are summed before f's all-reduce."""
        if self.sequence_parallel and self.regather:
            return list(LinearsWithSequenceParallelRegather.apply(x, self, *[layer.weight for layer in layers]))
        op = GatherFromSequenceParallelRegion if self.sequence_parallel else CopyToModelParallelRegion
        x = op.apply(x, self.group, self.label)  # [b, s, h] on every rank
        return [layer(x) for layer in layers]  # each [b, s, out/t]

    def leave(self, y: torch.Tensor) -> torch.Tensor:
        """g (TP), or reduce-scatter to sequence shards (SP): partial [b, s, h] -> [b, s or s/t, h]."""
        op = ReduceScatterToSequenceParallelRegion if self.sequence_parallel else ReduceFromModelParallelRegion
        return op.apply(y, self.group, self.label)


# ---- parallel layers ----------------------------------------------------------------------------
def shard(weight: torch.Tensor, dim: int, rank: int, t: int) -> torch.Tensor:
    """This rank's contiguous 1/t of ``weight`` along ``dim`` (a copy)."""
    return weight.detach().chunk(t, dim)[rank].clone()


class ColumnParallelLinear(nn.Module):
    """Y_i = X A_iᵀ with this rank's out_features/t rows of the [out, in] weight. No communication:
    ``Region.columns`` enters the region once for all column layers that share an input (q, k, v;
    gate, up), so their input gradients are summed locally and all-reduced once."""

    shard_dim = 0

    def __init__(self, weight_shard: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight_shard)  # [out/t, in]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)  # [..., out/t]


class RowParallelLinear(nn.Module):
    """Z = Σ_i Y_i B_iᵀ with this rank's in_features/t columns; the partial sum leaves the region
    through g (all-reduce) or, with SP, a reduce-scatter to sequence shards."""

    shard_dim = 1

    def __init__(self, weight_shard: torch.Tensor, region: Region):
        super().__init__()
        self.weight = nn.Parameter(weight_shard)  # [out, in/t]
        self.region = region

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        partial = F.linear(y, self.weight)  # [b, s, out], this rank's share of the sum
        return self.region.leave(partial)  # [b, s or s/t, out]


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + V/t) of the embedding. A rank looks up the tokens it owns, writes zeros
    for the others, and the sum over ranks (g, or a reduce-scatter with SP) is the full embedding."""

    shard_dim = 0

    def __init__(self, weight_shard: torch.Tensor, start: int, region: Region):
        super().__init__()
        self.weight = nn.Parameter(weight_shard)  # [V/t, h]
        self.start, self.region = start, region

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        outside = (tokens < self.start) | (tokens >= self.start + self.weight.shape[0])  # [b, s] bool
        local = (tokens - self.start).masked_fill(outside, 0)  # [b, s] row index in this shard
        x = F.embedding(local, self.weight).masked_fill(outside[..., None], 0.0)  # [b, s, h]
        return self.region.leave(x)  # [b, s or s/t, h]


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy from logit shards [b, s, V/t] (Megatron-LM's vocab-parallel loss): the sum over
    these tokens divided by ``global_tokens`` (default these tokens; ``model.gpt.lm_loss``).

    loss = log Σ_v exp(z_v − m) − (z_target − m), with the max m, the sum and the target logit each
    combined over ranks by all-reduce (max; then one sum of [Σexp, target logit]). Backward needs no
    communication: d loss / d z = (softmax − onehot) / ``global_tokens`` on this rank's slice.

    In fp32 whatever the logits' dtype, as Megatron-LM casts them (``logits.float()``): the max,
    the sums and the saved softmax are fp32, so the loss's all-reduces move 4-byte elements and its
    gradient is cast back to the logits' dtype.
    """

    @staticmethod
    def forward(ctx, logits, targets, start, group, global_tokens=None):
        ctx.dtype, ctx.tokens = logits.dtype, global_tokens or targets.numel()  # Σ / the global batch's tokens
        logits = logits.float()  # [b, s, V/t] fp32
        n = logits.shape[-1]  # V/t
        m = all_reduce(logits.amax(-1), group, "loss", "forward", op=dist.ReduceOp.MAX)  # [b, s]
        shifted = logits - m[..., None]  # [b, s, V/t]
        exp = shifted.exp()  # [b, s, V/t]
        outside = (targets < start) | (targets >= start + n)  # [b, s]
        local = (targets - start).masked_fill(outside, 0)  # [b, s]
        target_logit = shifted.gather(-1, local[..., None])[..., 0].masked_fill(outside, 0.0)  # [b, s]
        sums = all_reduce(torch.stack([exp.sum(-1), target_logit]), group, "loss", "forward")  # [2, b, s]
        probs = exp.div_(sums[0][..., None])  # [b, s, V/t], softmax over the whole vocabulary
        ctx.save_for_backward(probs, targets)
        ctx.start = start
        per_token = sums[0].log() - sums[1]  # [b, s]
        return per_token.sum() / ctx.tokens

    @staticmethod
    def backward(ctx, grad):
        probs, targets = ctx.saved_tensors
        n = probs.shape[-1]
        inside = ((targets >= ctx.start) & (targets < ctx.start + n)).to(probs.dtype)  # [b, s]
        local = (targets - ctx.start).clamp(0, n - 1)  # [b, s]
        dz = probs.clone().scatter_add_(-1, local[..., None], -inside[..., None])  # [b, s, V/t]
        return (dz * (grad / ctx.tokens)).to(ctx.dtype), None, None, None, None
