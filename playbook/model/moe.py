"""The mixture-of-experts MLP of our GPT, on one process: the ground truth for expert parallelism.

    x [T, h]  (T = batch·seq tokens of this call)
      -> router: probs = softmax(x Wᵣ)                 [T, E]
      -> top-k: experts [T, k], gates [T, k]           (renormalised to sum 1 when k > 1)
      -> capacity: keep slot (t, j) if fewer than C earlier slots chose the same expert
      -> y[t] = Σⱼ keep·gate[t, j] · Expert_{experts[t, j]}(x[t])  (+ shared experts(x[t]))

- Router and top-k gating: Shazeer et al. 2017, *Outrageously Large Neural Networks*
  (arXiv:1701.06538); k = 2 with renormalised gates as in GShard (Lepikhin et al. 2020,
  arXiv:2006.16668) and Mixtral (arXiv:2401.04088); k = 1 keeps the raw probability as in Switch.
- Capacity C = ceil(k · T / E · capacity_factor), tokens over capacity dropped (their residual
  passes through unchanged), first come first served in token order: Switch Transformers (Fedus et
  al. 2021, arXiv:2101.03961) §2.2. ``capacity_factor=None``: no dropping (dropless, as in
  Megablocks / Mixtral).
- Auxiliary load-balancing loss α · E · Σᵢ fᵢ · Pᵢ, fᵢ the fraction of the k·T routing slots sent
  to expert i (before dropping, not differentiable), Pᵢ the mean router probability (differentiable):
  Switch eq. 4-6, α = 0.01. Uniform routing gives exactly α.
- Shared experts, applied to every token: DeepSeekMoE (Dai et al. 2024, arXiv:2401.06066).
- Balancing without a loss (``bias_rate`` γ > 0): a per-expert bias bᵢ is added to the scores for
  *choosing* the top-k only (the gates stay the router's probabilities), and after each training
  forward bᵢ += γ · sign(mean load − loadᵢ) from the global counts: Wang et al. 2024,
  *Auxiliary-Loss-Free Load Balancing* (arXiv:2408.15664), used by DeepSeek-V3 (arXiv:2412.19437,
  §2.1.2, γ = 0.001). No gradient flows through b, so it cannot trade language modelling for balance.
  Under activation recomputation the replay of a forward routes with the biases that forward
  routed with, and its update is dropped (``replay_context``, torch checkpoint's ``context_fn``).

Written to be split: the layer asks three overridable questions — how many tokens the whole batch
has and what earlier ranks routed (``exchange_counts``), and who runs the experts
(``run_experts``) — so that ``playbook.parallel.ep.model`` changes only those and computes every other
number with this code. ``capacity`` and the aux loss are therefore global (over the whole global
batch) on any number of ranks, and EP drops exactly the tokens this single process drops.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from playbook.config import ModelConfig
from playbook.model.mlp import SwiGLU
from playbook.theory.moe.capacity import check_capacity_factor, check_routing, expert_capacity

AUX_ALPHA = 0.01  # Switch Transformers' α
ROUTED = ".mlp.experts."  # every routed expert's parameter name contains this (and no other's)


def is_expert(name: str) -> bool:
    """Parameter ``name`` belongs to a routed expert (sharded over ep, summed over its replicas)."""
    return ROUTED in name


@dataclass
class RoutingStats:
    """What the router did in one call, over the whole global batch (plain numbers, detached)."""

    counts: list[int]  # [E] slots routed to each expert (before drops)
    kept: list[int]  # [E] slots kept within capacity
    counts_by_rank: list[list[int]]  # [data ranks][E] slots each data rank routed
    capacity: int | None
    tokens: int  # T over the global batch
    router_entropy: float  # mean per-token entropy of this rank's router probabilities (nats)
    aux: float  # this rank's share of α·E·Σ f·P (the shares of all data ranks sum to the batch's aux loss)
    experts: torch.Tensor | None = field(default=None, repr=False)  # [T_local, k] this rank's choices

    @property
    def dropped(self) -> int:
        return sum(self.counts) - sum(self.kept)

    def as_dict(self) -> dict:
        return {
            k: getattr(self, k)
            for k in ("counts", "kept", "counts_by_rank", "capacity", "tokens", "router_entropy", "aux")
        } | {"dropped": self.dropped}


def top_k_gating(
    probs: torch.Tensor, top_k: int, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """probs [T, E] -> (experts [T, k] int64, best first; gates [T, k]). Gates are the top-k
    probabilities, renormalised to sum to one when k > 1 (GShard, Mixtral). ``bias`` [E] shifts the
    choice only (aux-loss-free balancing): the gates are still the chosen experts' probabilities."""
    if bias is None:
        gates, experts = probs.topk(top_k, dim=-1)  # [T, k] each
    else:
        experts = (probs + bias).topk(top_k, dim=-1).indices  # [T, k]
        gates = probs.gather(-1, experts)  # [T, k]
    if top_k > 1:
        gates = gates / gates.sum(dim=-1, keepdim=True)  # [T, k]
    return experts, gates


def slot_positions(experts: torch.Tensor, n_experts: int, offset: torch.Tensor | None = None) -> torch.Tensor:
    """experts [T, k] -> the position of each slot (t, j) in its expert's queue [T, k]: slots are
    served in order t, then j; ``offset`` [E] counts slots of earlier tokens (earlier ranks)."""
    one_hot = F.one_hot(experts.reshape(-1), n_experts)  # [T*k, E]
    pos = (one_hot.cumsum(0) - 1).gather(1, experts.reshape(-1, 1)).squeeze(1)  # [T*k]
    if offset is not None:
        pos = pos + offset[experts.reshape(-1)]
    return pos.view_as(experts)  # [T, k]


class MoEMLP(nn.Module):
    """Router + ``n_experts`` SwiGLU experts (+ shared experts), one process.

    After each forward, ``self.aux_loss`` holds this layer's load-balancing loss (a scalar tensor
    in the graph; GPT adds it to the loss) and ``self.stats`` a :class:`RoutingStats`.
    ``capacity_factor`` (None: no dropping) and ``aux_alpha`` are plain attributes: set them with
    :func:`configure`.
    """

    def __init__(self, cfg: ModelConfig, capacity_factor: float | None = None, aux_alpha: float = AUX_ALPHA):
        super().__init__()
        check_routing(cfg.n_experts, cfg.top_k)
        self.hidden, self.n_experts, self.top_k = cfg.hidden, cfg.n_experts, cfg.top_k
        self.router = nn.Linear(cfg.hidden, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(cfg.hidden, cfg.expert_ffn_hidden) for _ in range(cfg.n_experts))
        self.shared_experts = nn.ModuleList(
            SwiGLU(cfg.hidden, cfg.expert_ffn_hidden) for _ in range(cfg.n_shared_experts)
        )
        self.capacity_factor, self.aux_alpha = capacity_factor, aux_alpha
        self.bias_rate = 0.0  # γ of aux-loss-free balancing (0: off); set with :func:`configure`
        self.register_buffer("route_bias", None, persistent=False)  # [E] while bias_rate > 0 (moves with .to())
        self.aux_loss: torch.Tensor | None = None
        self.stats: RoutingStats | None = None

    # ---- the three questions a parallel version answers differently ---------------------------
    def exchange_counts(self, counts: torch.Tensor) -> tuple[torch.Tensor, int]:
        """counts [E] of this rank -> (counts of every data rank [n, E], this rank's row). One process: itself."""
        return counts[None], 0

    def run_experts(self, xs: torch.Tensor, kept_by_rank: torch.Tensor) -> torch.Tensor:
        """xs [S, h]: this rank's kept slots, grouped by expert (counts ``kept_by_rank[rank]``)
        -> each row through its expert [S, h]."""
        sizes = kept_by_rank[0].tolist()
        outs = [self.experts[e](chunk) for e, chunk in enumerate(xs.split(sizes)) if sizes[e]]
        return torch.cat(outs) if outs else xs[:0]  # [S, h]

    def aux_scale(self) -> float:
        """Factor on this rank's share of the aux loss so that the ranks' summed gradients are right (1 here:
        the share already sums this rank's tokens over the global batch's)."""
        return 1.0

    # ---- the layer ----------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape  # [batch, seq, hidden]
        x = x.reshape(-1, self.hidden)  # [T, h]
        y = self.routed(x)  # [T, h]
        for shared in self.shared_experts:
            y = y + shared(x)  # [T, h]
        return y.view(shape)  # [batch, seq, hidden]

    def routed(self, x: torch.Tensor) -> torch.Tensor:
        """The routed experts' output for tokens x [T, h] -> [T, h]; sets ``aux_loss`` and ``stats``."""
        T, E, k = x.shape[0], self.n_experts, self.top_k
        check_capacity_factor(self.capacity_factor)

        probs = F.softmax(self.router(x), dim=-1)  # [T, E]
        experts, gates = top_k_gating(probs, k, self.route_bias)  # [T, k], [T, k]
        counts = torch.bincount(experts.reshape(-1), minlength=E)  # [E] slots routed here
        counts_by_rank, me = self.exchange_counts(counts)  # [n, E]
        total_counts = counts_by_rank.sum(0)  # [E] over the global batch
        if self.route_bias is not None and self.training and torch.is_grad_enabled():
            with torch.no_grad():  # global counts: every rank makes the same update
                load = total_counts.to(self.route_bias.dtype)  # [E]
                self.route_bias += self.bias_rate * torch.sign(load.mean() - load)  # [E]
        tokens = T * counts_by_rank.shape[0]  # every data rank routes the same number of tokens
        capacity = expert_capacity(tokens, E, k, self.capacity_factor)
        if capacity is None:
            keep, kept_by_rank = torch.ones_like(experts, dtype=torch.bool), counts_by_rank
        else:
            offsets = counts_by_rank.cumsum(0) - counts_by_rank  # [n, E] slots of earlier ranks
            keep = slot_positions(experts, E, offsets[me]) < capacity  # [T, k]
            kept_by_rank = (capacity - offsets).clamp(min=0).minimum(counts_by_rank)  # [n, E]

        # Switch aux loss, this rank's share: α·E·Σᵢ fᵢ · (Σ_local pᵢ) / T_global
        f = total_counts.to(probs.dtype) / (k * tokens)  # [E], global, no gradient
        share = self.aux_alpha * E * (f * probs.sum(0) / tokens).sum()
        self.aux_loss = self.aux_scale() * share

        # dispatch: kept slots grouped by expert (stable: token order within an expert)
        slot_token = torch.arange(T, device=x.device).repeat_interleave(k)  # [T*k]
        slot_expert, slot_gate = experts.reshape(-1), gates.reshape(-1)  # [T*k]
        kept = keep.reshape(-1).nonzero().squeeze(1)  # [S]
        order = kept[torch.argsort(slot_expert[kept], stable=True)]  # [S]
        tok = slot_token[order]  # [S] which token each row is
        ys = self.run_experts(x[tok], kept_by_rank)  # [S, h]
        y = torch.zeros_like(x).index_add(0, tok, ys * slot_gate[order, None])  # [T, h]

        with torch.no_grad():
            entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1).mean()
            self.stats = RoutingStats(
                counts=total_counts.tolist(),
                kept=kept_by_rank.sum(0).tolist(),
                counts_by_rank=counts_by_rank.tolist(),
                capacity=capacity,
                tokens=tokens,
                router_entropy=float(entropy),
                aux=float(share),
                experts=experts.detach().cpu(),
            )
        return y  # [T, h]


# ---- working with a whole model -----------------------------------------------------------------
def moe_layers(model: nn.Module) -> list[MoEMLP]:
    return [m for m in model.modules() if isinstance(m, MoEMLP)]


def replay_context(module: nn.Module) -> tuple:
    """``context_fn`` for a non-reentrant ``torch.utils.checkpoint`` of ``module``: (the forward's
    context, the replay's). Called as the forward starts, it keeps a copy of the route biases its MoE
    layers are about to route with; the replay routes with that copy, and its update lands on the
    copy, dropped afterwards (the forward updated the biases, once). So the replay recomputes the
    forward's routing whatever forwards of other micro-batches changed in between."""
    layers = [layer for layer in moe_layers(module) if layer.route_bias is not None]
    kept = [layer.route_bias.clone() for layer in layers]  # [E] each, before this forward's update

    @contextlib.contextmanager
    def replay():
        now = [layer.route_bias for layer in layers]
        for layer, bias in zip(layers, kept):
            layer.route_bias = bias
        try:
            yield
        finally:
            for layer, bias in zip(layers, now):
                layer.route_bias = bias

    return contextlib.nullcontext(), replay() if layers else contextlib.nullcontext()


def configure(
    model: nn.Module, *, capacity_factor: float | None = None, aux_alpha: float = AUX_ALPHA, bias_rate: float = 0.0
) -> nn.Module:
    """Set the capacity factor (None: no dropping), aux-loss weight and bias rate γ (0: no bias
    balancing; DeepSeek-V3 uses 0.001) of every MoE layer; a bias starts at zero."""
    check_capacity_factor(capacity_factor)
    for name, value, hint in [
        ("aux_alpha", aux_alpha, "Switch uses 0.01"),
        ("bias_rate", bias_rate, "DeepSeek-V3 0.001"),
    ]:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise ValueError(f"{name} must be a finite number >= 0 (0 switches it off; {hint}), got {value!r}")
    for layer in moe_layers(model):
        layer.capacity_factor, layer.aux_alpha, layer.bias_rate = capacity_factor, float(aux_alpha), float(bias_rate)
        layer.route_bias = torch.zeros(layer.n_experts) if bias_rate > 0 else None
    return model


def routing_stats(model: nn.Module) -> list[dict]:
    """The last forward's :class:`RoutingStats` of every MoE layer, as dicts."""
    return [layer.stats.as_dict() for layer in moe_layers(model) if layer.stats is not None]


def capacity_of(tokens: int, cfg: ModelConfig, capacity_factor: float | None) -> int | None:
    """Switch capacity for ``tokens`` tokens of ``cfg``: ceil(k·T/E·cf)."""
    return expert_capacity(tokens, cfg.n_experts, cfg.top_k, capacity_factor)


def uniform_entropy(n_experts: int) -> float:
    """ln E: the router entropy of a router that has not learnt anything."""
    return math.log(n_experts)
