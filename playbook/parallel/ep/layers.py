"""The expert-parallel MoE layer, and tensor parallelism inside the experts for contrast.

:class:`ExpertParallelMoE`: each of ``ep`` ranks holds E/ep experts. A rank routes its own tokens
(``playbook.model.moe``, whose layer asks the three questions overridden here), then

    1. counts: all-gather every rank's routed counts [n, E]; from them every rank knows the
       global capacity decisions and every split below (nothing else has to be exchanged);
    2. permute: its kept slots, grouped by expert = grouped by destination rank;
    3. dispatch: one all-to-all with uneven splits: rows to each expert's owner;
    4. compute: each local expert on the rows from every source (regrouped expert-major);
    5. combine: the second all-to-all, splits swapped, sends the results home;
    6. un-permute: each row scaled by its gate and added back to its token (``index_add``).

Backward runs through both all-to-alls: the gradient of an all-to-all is the all-to-all with the
splits swapped (``parallel.comm.AllToAll``; GShard, Lepikhin et al. 2020, arXiv:2006.16668). Per
rank and MoE layer, the dispatch sends k·T_local·h·(ep−1)/ep elements under even routing, and a
training step runs four all-to-alls (two forward, two backward).

:class:`TensorParallelExperts` (Gale et al. 2023, MegaBlocks, arXiv:2211.15841, §2): every expert on every rank, a 1/tp slice of its SwiGLU width. Tokens are all-gathered,
each rank computes its slice of every expert, partial outputs are reduce-scattered back:
4·T_local·tp·h·(tp−1)/tp elements per step against EP's 4·k·T_local·h·(ep−1)/ep, ratio k/tp.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from playbook.config import require_divides
from playbook.model.moe import MoEMLP
from playbook.parallel.comm import GatherRows, ScatterSumRows, all_to_all


# ---- the expert-parallel MoE layer -------------------------------------------------------------
class ExpertParallelMoE(MoEMLP):
    """A :class:`MoEMLP` whose experts are split over ``ep_group``; only ``exchange_counts`` and
    ``run_experts`` differ (the aux loss is this rank's share: Σ over its tokens / the global ones).
    ``experts`` keeps the global expert numbers as keys, so parameter names match the single-process model's."""

    def __init__(self, moe: MoEMLP, *, ep_group, data_group, ep: int, ep_rank: int, data_rank: int, n_data: int):
        nn.Module.__init__(self)
        self.hidden, self.n_experts, self.top_k = moe.hidden, moe.n_experts, moe.top_k
        self.capacity_factor, self.aux_alpha, self.bias_rate = moe.capacity_factor, moe.aux_alpha, moe.bias_rate
        self.register_buffer("route_bias", moe.route_bias, persistent=False)  # [E] or None: the same on every rank
        self.ep, self.ep_rank, self.data_rank, self.n_data = ep, ep_rank, data_rank, n_data
        self.ep_group, self.data_group, self.native = ep_group, data_group, False
        self.per_rank = self.n_experts // ep
        self.first = ep_rank * self.per_rank  # my experts: first .. first + per_rank - 1
        self.router, self.shared_experts = moe.router, moe.shared_experts
        self.experts = nn.ModuleDict({str(e): moe.experts[e] for e in range(self.first, self.first + self.per_rank)})
        self.aux_loss, self.stats = None, None

    def exchange_counts(self, counts):
        out = counts.new_empty(self.n_data * self.n_experts)  # [n*E]
        dist.all_gather_single(out, counts, group=self.data_group)
        return out.view(self.n_data, self.n_experts), self.data_rank  # [n, E]

    def run_experts(self, xs, kept_by_rank):
        ep, per, me = self.ep, self.per_rank, self.ep_rank
        if ep == 1:  # every expert is here: only the counts (capacity, aux loss) were global
            sizes = kept_by_rank[self.data_rank].tolist()
            outs = [self.experts[str(e)](chunk) for e, chunk in enumerate(xs.split(sizes)) if sizes[e]]
            return torch.cat(outs) if outs else xs[:0]  # [S, h]
        group = kept_by_rank[self.data_rank - me : self.data_rank - me + ep]  # [ep, E] my EP group's kept slots
        send = group[me].view(ep, per).sum(1).tolist()  # rows to each member (xs is grouped by expert = by owner)
        from_each = group[:, self.first : self.first + per]  # [ep, per] rows each member sends me, per local expert
        recv = from_each.sum(1).tolist()
        xr = all_to_all(xs, send, recv, self.ep_group, self.native)  # [R, h] source-major, expert-minor
        chunks = list(xr.split(from_each.reshape(-1).tolist()))  # chunk s*per + e
        for e in range(per):  # regroup expert-major: one batch per local expert, then split back
            idx = [s * per + e for s in range(ep)]
            sizes = [chunks[i].shape[0] for i in idx]
            if sum(sizes):
                out = self.experts[str(self.first + e)](torch.cat([chunks[i] for i in idx]))  # [rows_e, h]
                for i, part in zip(idx, out.split(sizes)):
                    chunks[i] = part
        yr = torch.cat(chunks)  # [R, h] back in arrival order (un-permuted)
        return all_to_all(yr, recv, send, self.ep_group, self.native)  # [S, h] in xs's order


class TensorParallelExperts(MoEMLP):
    """The contrast: every expert on every rank, a 1/tp slice of its width (gate/up rows, down
    columns, Megatron-style). Tokens all-gathered, routed identically everywhere, partial outputs
    reduce-scattered. The router and shared experts are replicated (dense)."""

    def __init__(self, moe: MoEMLP, *, group, tp: int, rank: int):
        nn.Module.__init__(self)
        self.hidden, self.n_experts, self.top_k = moe.hidden, moe.n_experts, moe.top_k
        self.capacity_factor, self.aux_alpha, self.bias_rate = moe.capacity_factor, moe.aux_alpha, moe.bias_rate
        self.register_buffer("route_bias", moe.route_bias, persistent=False)  # [E] or None: the same on every rank
        self.group, self.router, self.shared_experts = group, moe.router, moe.shared_experts
        fe = moe.experts[0].gate_proj.weight.shape[0]
        require_divides("tp", tp, "expert_ffn_hidden", fe)
        cut = slice(rank * fe // tp, (rank + 1) * fe // tp)
        for expert in moe.experts:
            with torch.no_grad():
                for lin in (expert.gate_proj, expert.up_proj):  # [fe, h] -> [fe/tp, h]
                    lin.weight = nn.Parameter(lin.weight[cut].clone())
                expert.down_proj.weight = nn.Parameter(expert.down_proj.weight[:, cut].clone())  # [h, fe/tp]
        self.experts = moe.experts
        self.aux_loss, self.stats = None, None
        self.tp = tp

    def aux_scale(self) -> float:
        """1/tp: every rank routes the whole group's tokens, so it computes the whole aux loss, and its
        share of it (the ranks' losses are summed, ``model.gpt.lm_loss``) is 1/tp."""
        return 1.0 / self.tp

    def forward(self, x):
        shape = x.shape  # [batch, seq, hidden]
        x = x.reshape(-1, self.hidden)  # [T, h]
        every = GatherRows.apply(x, self.group)  # [tp*T, h] the whole group's tokens, in rank order
        y = ScatterSumRows.apply(self.routed(every), self.group)  # [T, h] sum of the tp partial outputs
        for shared in self.shared_experts:
            y = y + shared(x)  # [T, h]
        return y.view(shape)
