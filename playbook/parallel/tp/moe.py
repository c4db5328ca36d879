"""A mixture of experts under tensor parallelism: the router replicated, the tokens split over tp.

Our choice: every tp rank holds the same experts (E/ep of them, ep over dp×cp as without tp) and
routes 1/tp of the tokens, the sequence slice it owns. Megatron-LM splits the MoE tokens over tp
the same way (its "sequence parallel" dispatch). We did not borrow the tp ranks as expert ranks,
as torchtitan does, because then ep would depend on tp, and the mesh's ep lives inside dp×cp.

- Under sequence parallelism the residual stream is already [b, s/tp, h] on each rank: the MoE
  layer routes its shard and no collective is added.
- Without it the stream is replicated [b, s, h]: :class:`SplitTokens` keeps this rank's sequence
  slice (its gradient all-gathered backward, Megatron's "scatter to region"), and
  :class:`GatherTokens` all-gathers the outputs (its gradient sliced backward).

So the router, the shared and routed experts are replicated parameters fed a sequence-sharded
input: their gradients are summed over tp, then over dp×cp (``parallel.grads``). Routing
counts are all-gathered over tp, then over dp×cp, so capacity and the Switch aux loss (Fedus et
al. 2022, §2.2) see the whole batch; each rank's aux share is unscaled, since the gradients are
summed over tp and dp×cp (``parallel.grads``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from playbook.parallel.comm import all_gather
from playbook.parallel.ep.layers import ExpertParallelMoE


class SplitTokens(torch.autograd.Function):
    """[b, s, h] replicated -> this rank's [b, s/tp, h]; backward: the slices' gradients all-gathered."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        t, rank = dist.get_world_size(group), dist.get_rank(group)
        n = x.shape[1] // t
        return x[:, rank * n : (rank + 1) * n].contiguous()  # [b, s/tp, h]

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, 1, ctx.group, "moe tokens", "backward"), None  # [b, s, h]


class GatherTokens(torch.autograd.Function):
    """This rank's [b, s/tp, h] -> [b, s, h] on every rank; backward: this rank's slice of the gradient."""

    @staticmethod
    def forward(ctx, y, group):
        ctx.group, ctx.n = group, y.shape[1]
        return all_gather(y, 1, group, "moe tokens", "forward")  # [b, s, h]

    @staticmethod
    def backward(ctx, grad):
        rank, n = dist.get_rank(ctx.group), ctx.n
        return grad[:, rank * n : (rank + 1) * n].contiguous(), None  # [b, s/tp, h]


def split_tokens(layer: nn.Module, group) -> None:
    """Under TP without SP: ``layer`` routes this rank's sequence slice of its replicated input and
    its output is all-gathered (a pre-hook and a hook, so its parameter names stay the model's)."""
    layer.register_forward_pre_hook(lambda _layer, args: (SplitTokens.apply(args[0], group), *args[1:]))
    layer.register_forward_hook(lambda _layer, _args, out: GatherTokens.apply(out, group))


class TPExpertParallelMoE(ExpertParallelMoE):
    """:class:`ExpertParallelMoE` whose tokens are also split over ``tp_group``: counts over tp then
    dp×cp (rows ordered data rank major, tp minor: the stage's global rank order), experts over ep
    among the ranks of the same tp index."""

    def __init__(self, moe, *, tp_group, tp: int, tp_rank: int, **ep):
        super().__init__(moe, **ep)
        self.tp_group, self.tp, self.tp_rank = tp_group, tp, tp_rank

    def exchange_counts(self, counts):
        mine = counts.new_empty(self.tp * self.n_experts)  # [tp*E]
        dist.all_gather_single(mine, counts, group=self.tp_group)
        out = mine
        if self.n_data > 1:
            out = counts.new_empty(self.n_data * self.tp * self.n_experts)  # [n*tp*E]
            dist.all_gather_single(out, mine, group=self.data_group)
        return out.view(self.n_data * self.tp, self.n_experts), self.data_rank * self.tp + self.tp_rank

    def run_experts(self, xs, kept_by_rank):
        return super().run_experts(xs, kept_by_rank[self.tp_rank :: self.tp])  # [n, E]: my tp index's ranks
