"""Expert parallelism: the experts of every MoE layer split across ranks, tokens sent to them.

Each of ``ep`` ranks holds E/ep experts. A rank routes its own tokens (``playbook.moe``), then

    1. counts: all-gather every rank's routed counts [n, E]; from them every rank knows the
       global capacity decisions and every split below (nothing else has to be exchanged);
    2. permute: its kept slots, grouped by expert = grouped by destination rank;
    3. dispatch: one all-to-all with uneven splits: rows to each expert's owner;
    4. compute: each local expert on the rows from every source (regrouped expert-major);
    5. combine: the second all-to-all, splits swapped, sends the results home;
    6. un-permute: each row scaled by its gate and added back to its token (``index_add``).

Backward runs through both all-to-alls: the gradient of an all-to-all is the all-to-all with the
splits swapped (:class:`AllToAll`). Per rank and MoE layer, the dispatch sends k·T_local·h·(ep−1)/ep
elements under even routing, and a training step runs four all-to-alls (two forward, two backward).

Expert parallelism lives *inside* data parallelism (DeepSpeed-MoE, arXiv:2201.05596, §5): all n
ranks read different rows of the batch; the dense weights (attention, norms, routers) are
replicated and their gradients averaged over all n; ranks r, r+ep, r+2ep, ... hold the same
experts and average those gradients among themselves. Each rank's loss is its local cross-entropy
plus n × its share of the aux loss; averaging over n gives the global batch's gradients, and an
expert's gradient, which arrives summed over the n ranks' tokens by the all-to-all, is divided by n.

For contrast (Gale et al. 2023 MegaBlocks §2; article 2 of SEEDS.md): tensor parallelism *inside*
each expert keeps every expert on every rank, a 1/tp slice of its SwiGLU width. Tokens are
all-gathered, each rank computes its slice of every expert, partial outputs are reduce-scattered
back: 4·T_local·tp·h·(tp−1)/tp elements per step against EP's 4·k·T_local·h·(ep−1)/ep, ratio k/tp.

Parity target: ``playbook.moe`` on one process, same global batch (``train_moe`` without ``ctx``).
Capacity is global (over the whole global batch, first come first served in global token order),
so EP drops exactly the slots the single process drops; real systems often use per-rank capacity.

Measuring: the tracer records our ``dist.all_to_all_single`` calls, forward and backward (on CPU
autograd runs backward in the calling thread). Not checked on GPUs: there autograd runs backward
in a device thread, which the thread-local tracer may not see. PyTorch's functional all-to-all
(``native=True``) is never traced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from playbook.config import ModelConfig, divisors, require_divides, require_positive
from playbook.measure.memory import measure_training_step
from playbook.moe import AUX_ALPHA, MoEMLP, build, moe_layers
from playbook.parallel.registry import register
from playbook.parallel.report import RunReport, all_finite, max_abs_loss_diff, max_rel_diff, rel_l2_diff
from playbook.parallel.training import TrainResult, TrainSetup
from playbook.theory.moe import (
    alltoall_bytes_from_routing, check_capacity_factor, check_ep, model_activation_bytes_moe, moe_model_state_bytes,
    param_tensors_per_rank, routing_report,
)  # fmt: skip
from playbook.theory.moe import step_comm_bytes as predicted_comm  # the chapter calls it by this name


# ---- collectives with gradients ----------------------------------------------------------------
class AllToAll(torch.autograd.Function):
    """Rows [sum(send), ...] -> rows [sum(recv), ...]: ``send[i]`` rows go to rank i of the group,
    ``recv[i]`` arrive from it, in rank order. Backward: the same exchange with the splits swapped."""

    @staticmethod
    def forward(ctx, x, send: list[int], recv: list[int], group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))  # [R, h]
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))  # [S, h]
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out, None, None, None


def all_to_all(x: torch.Tensor, send: list[int], recv: list[int], group, native: bool = False) -> torch.Tensor:
    """Our :class:`AllToAll`, or PyTorch's own differentiable one (functional collectives), which
    the tracer does not see."""
    if native:
        from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

        return wait_tensor(all_to_all_single_autograd(x.contiguous(), recv, send, group))
    return AllToAll.apply(x, send, recv, group)


class GatherRows(torch.autograd.Function):
    """All-gather along rows (every rank the same count); backward: reduce-scatter (sum)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, n = group, dist.get_world_size(group)
        out = x.new_empty((n * x.shape[0], *x.shape[1:]))  # [n*T, h]
        dist.all_gather_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((grad.shape[0] // dist.get_world_size(ctx.group), *grad.shape[1:]))  # [T, h]
        dist.reduce_scatter_single(out, grad.contiguous(), group=ctx.group)
        return out, None


class ScatterSumRows(torch.autograd.Function):
    """Reduce-scatter (sum) along rows; backward: all-gather."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.new_empty((x.shape[0] // dist.get_world_size(group), *x.shape[1:]))  # [T, h]
        dist.reduce_scatter_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return GatherRows.apply(grad, ctx.group), None


# ---- the expert-parallel MoE layer -------------------------------------------------------------
class ExpertParallelMoE(MoEMLP):
    """A :class:`MoEMLP` whose experts are split over ``ep_group``; only ``exchange_counts``,
    ``run_experts`` and ``aux_scale`` differ. ``experts`` keeps the global expert numbers as keys,
    so parameter names match the single-process model's."""

    def __init__(self, moe: MoEMLP, *, ep_group, data_group, ep: int, ep_rank: int, data_rank: int, n_data: int):
        nn.Module.__init__(self)
        self.hidden, self.n_experts, self.top_k = moe.hidden, moe.n_experts, moe.top_k
        self.capacity_factor, self.aux_alpha = moe.capacity_factor, moe.aux_alpha
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

    def aux_scale(self) -> float:
        return float(self.n_data)

    def run_experts(self, xs, kept_by_rank):
        ep, per, me = self.ep, self.per_rank, self.ep_rank
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
        self.capacity_factor, self.aux_alpha = moe.capacity_factor, moe.aux_alpha
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

    def forward(self, x):
        shape = x.shape  # [batch, seq, hidden]
        x = x.reshape(-1, self.hidden)  # [T, h]
        every = GatherRows.apply(x, self.group)  # [tp*T, h] the whole group's tokens, in rank order
        y = ScatterSumRows.apply(self.routed(every), self.group)  # [T, h] sum of the tp partial outputs
        for shared in self.shared_experts:
            y = y + shared(x)  # [T, h]
        return y.view(shape)


# ---- groups, model, gradients ------------------------------------------------------------------
@dataclass
class Layout:
    """Who is who: n ranks = n data-parallel ranks; EP groups of ``ep`` consecutive ranks."""

    mode: str  # "ep" or "tp" (tensor parallel inside experts, over all n ranks)
    n: int
    ep: int
    rank: int
    world: object
    ep_group: object = None
    replica_group: object = None  # the ranks that hold the same experts (size n / ep)

    @classmethod
    def make(cls, ctx, mode: str, ep: int) -> Layout:
        n, r = ctx.world_size, ctx.rank
        lay = cls(mode, n, ep if mode == "ep" else n, r, ctx.group)
        if mode == "ep":  # every rank creates every group, in the same order
            for g in range(n // ep):
                grp = dist.new_group(list(range(g * ep, (g + 1) * ep)))
                lay.ep_group = grp if r // ep == g else lay.ep_group
            for i in range(ep):
                grp = dist.new_group(list(range(i, n, ep))) if n > ep else None
                lay.replica_group = grp if r % ep == i else lay.replica_group
        return lay


def is_expert(name: str) -> bool:
    return ".mlp.experts." in name


def parallelize(model: nn.Module, lay: Layout) -> nn.Module:
    """Swap every MoE layer for its expert-parallel (or tensor-parallel-experts) version, in place."""
    for block in model.blocks:
        if isinstance(block.mlp, MoEMLP):
            if lay.mode == "ep":
                block.mlp = ExpertParallelMoE(block.mlp, ep_group=lay.ep_group, data_group=lay.world, ep=lay.ep,
                                              ep_rank=lay.rank % lay.ep, data_rank=lay.rank, n_data=lay.n)  # fmt: skip
            else:
                block.mlp = TensorParallelExperts(block.mlp, group=lay.world, tp=lay.n, rank=lay.rank)
    return model


def _flat_all_reduce(tensors: list[torch.Tensor], group) -> None:
    """One SUM all-reduce for a list of tensors (one bucket: ~5 ms per gloo call, FEASIBILITY.md)."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(part.view_as(t))


def sync_grads(model: nn.Module, lay: Layout) -> None:
    """Dense gradients: average over all n ranks. Expert gradients: already the sum over the
    ranks whose tokens reached them; sum over the replicas (EP+DP), then divide by n."""
    dense = [p for name, p in model.named_parameters() if not is_expert(name)]
    experts = [p for name, p in model.named_parameters() if is_expert(name)]
    _flat_all_reduce([p.grad for p in dense], lay.world)
    if lay.replica_group is not None:  # a replica whose expert got no token has no grad: send zeros + a flag
        had = torch.tensor([p.grad is not None for p in experts], dtype=torch.float32, device=experts[0].device)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in experts]
        _flat_all_reduce(grads + [had], lay.replica_group)
        for p, g, flag in zip(experts, grads, had):
            p.grad = g if flag > 0 else None
    for p in dense + experts:
        if p.grad is not None:
            p.grad /= lay.n


# ---- one training loop for the reference and every layout -------------------------------------
@dataclass
class MoERun(TrainResult):
    """A :class:`TrainResult` plus, per step, the routing of every MoE layer and the comm."""

    routing: list[list[dict]] = field(default_factory=list)  # [step][layer] RoutingStats.as_dict()
    choices: list[list[torch.Tensor]] = field(default_factory=list)  # [step][layer] experts [T_local, k]
    ce: list[float] = field(default_factory=list)  # this rank's cross-entropy per step
    comm: list[dict] = field(default_factory=list)  # [step] {op: sent bytes}, plus "all_to_all_seconds"
    rank: int = 0


def train_moe(setup: TrainSetup, cfg: ModelConfig, *, capacity_factor: float | None = None,
              aux_alpha: float = AUX_ALPHA, ctx=None, mode: str = "ep", ep: int | None = None,
              native: bool = False) -> MoERun:  # fmt: skip
    """``parallel.training.train`` for a mixture of experts: without ``ctx`` the single-process
    reference; with ``ctx`` (a rank) expert parallelism over ``ep`` ranks (default all) inside
    data parallelism over all, or ``mode="tp"``: tensor parallelism inside every expert.
    ``native=True``: PyTorch's differentiable all-to-all instead of ours (not traced)."""
    rank, n, device = (0, 1, "cpu") if ctx is None else (ctx.rank, ctx.world_size, ctx.device)
    model = build(cfg, setup.seed, capacity_factor=capacity_factor, aux_alpha=aux_alpha)
    sync = None
    if ctx is not None:
        validate(cfg, n, ep or n, capacity_factor, setup.global_batch, mode)
        lay = Layout.make(ctx, mode, ep or n)
        parallelize(model, lay)
        for layer in moe_layers(model):
            layer.native = native
        sync = lambda m: sync_grads(m, lay)  # noqa: E731
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=setup.lr)
    task, spans = setup.task(), (ctx.tracer.spans if ctx is not None else [])
    run = MoERun([], {}, {}, {}, rank=rank)
    for step in range(setup.steps):
        tokens, targets = task.batch(step, setup.global_batch, setup.seq_len, rank, n, device=device)
        first = len(spans)
        if step == 0:
            snap = measure_training_step(model, optimizer, tokens, targets, after_backward=sync)
            loss, run.memory = snap.loss, snap.as_dict()
            run.grads = {k: p.grad.detach().cpu().clone() for k, p in model.named_parameters() if p.grad is not None}
        else:
            optimizer.zero_grad(set_to_none=True)
            _, loss = model(tokens, targets)
            loss.backward()
            if sync is not None:
                sync(model)
            optimizer.step()
        layers = moe_layers(model)
        aux = sum(m.stats.aux for m in layers)  # EP: this rank's share; one process or TP: the whole batch's
        if ctx is not None:  # global loss = mean of (local CE + n·aux share); global aux = sum of shares
            both = torch.stack([loss.detach(), torch.tensor(aux, device=device)])
            dist.all_reduce(both, group=ctx.group)
            loss, aux = both[0] / n, float(both[1]) / (n if mode == "tp" else 1)
            ctx.progress(step + 1, setup.steps)
        run.ce.append(float(loss.detach()) - aux)
        run.routing.append([m.stats.as_dict() for m in layers])
        run.choices.append([m.stats.experts for m in layers])
        comm: dict[str, float] = {"all_to_all_seconds": 0.0}
        for s in spans[first:]:
            if s.kind == "comm":
                comm[s.name] = comm.get(s.name, 0.0) + s.sent_bytes
                if s.name == "all_to_all_single":
                    comm["all_to_all_seconds"] += s.duration
        run.comm.append(comm)
        run.losses.append(float(loss.detach()))
    run.params = {k: p.detach().cpu().clone() for k, p in model.named_parameters()}
    return run


def validate(cfg: ModelConfig, world_size: int, ep: int, capacity_factor, global_batch: int, mode: str = "ep") -> None:
    """Clear errors before any rank starts: E divisible by ep, ep | n, top_k <= E, capacity > 0."""
    if not cfg.is_moe:
        raise ValueError(f"{cfg.name} is dense (n_experts=0): expert parallelism needs an MoE model, e.g. gpt-tiny-moe")
    if mode not in ("ep", "tp"):
        raise ValueError(f"mode must be 'ep' (experts split over ranks) or 'tp' (each expert split), got {mode!r}")
    check_capacity_factor(capacity_factor)
    if mode == "ep":
        check_ep(cfg.n_experts, ep, world_size)
    else:
        require_divides("tp", world_size, "expert_ffn_hidden", cfg.expert_ffn_hidden)
    if global_batch % world_size:
        raise ValueError(f"global_batch={global_batch} does not split over {world_size} ranks; "
                         f"try world_size in {{{', '.join(map(str, divisors(global_batch)))}}}")  # fmt: skip


# ---- putting the ranks' pieces back together ---------------------------------------------------
def _full(pieces: list[dict[str, torch.Tensor]], mode: str) -> dict[str, torch.Tensor]:
    """Rank-local tensors -> the whole model's, named as in the single-process model. EP: dense
    from rank 0, each expert from the first rank that holds it. TP: expert slices concatenated."""
    out = dict(pieces[0])
    if mode == "ep":
        for piece in pieces[1:]:
            out.update({k: v for k, v in piece.items() if k not in out})
        return out
    for name in out:
        if is_expert(name):
            dim = 1 if name.endswith("down_proj.weight") else 0
            out[name] = torch.cat([p[name] for p in pieces], dim=dim)
    return out


def combine(results: list[MoERun], mode: str = "ep") -> MoERun:
    """One :class:`MoERun` for the whole model from every rank's (what the reference would hold)."""
    r0 = results[0]
    routing = []
    for step in range(len(r0.routing)):
        layers = []
        for i, layer in enumerate(r0.routing[step]):
            shares = [r.routing[step][i] for r in results] if mode == "ep" else [layer]
            layers.append(layer | {"aux": sum(s["aux"] for s in shares),
                                   "router_entropy": sum(s["router_entropy"] for s in shares) / len(shares)})  # fmt: skip
        routing.append(layers)
    choices = [[torch.cat([r.choices[s][i] for r in results]) if mode == "ep" else r0.choices[s][i]
                for i in range(len(r0.choices[s]))] for s in range(len(r0.choices))]  # fmt: skip
    ce = r0.ce  # every rank computed the global batch's cross-entropy
    return MoERun(r0.losses, _full([r.grads for r in results], mode), _full([r.params for r in results], mode),
                  r0.memory, routing, choices, ce, r0.comm)  # fmt: skip


def replicas_agree(results: list[MoERun], mode: str = "ep") -> float:
    """Largest relative difference between copies of the same weight on different ranks (0 expected)."""
    worst = 0.0
    for r in results[1:]:
        same = {k: v for k, v in r.params.items() if k in results[0].params and (mode == "ep" or not is_expert(k))}
        worst = max(worst, max_rel_diff(same, {k: results[0].params[k] for k in same}))
    return worst


def parity(candidate: MoERun, reference: MoERun) -> dict:
    """Loss, aux loss, first-step gradients, parameters after the last step, and the routing."""
    same_routing = all(torch.equal(a, b) for sa, sb in zip(candidate.choices, reference.choices) for a, b in zip(sa, sb))
    return {
        "reference": "single-process MoE, same global batch",
        "finite": all_finite(candidate, reference),
        "max_abs_loss_diff": max_abs_loss_diff(candidate.losses, reference.losses),
        "max_abs_aux_diff": max_abs_loss_diff([a["aux"] for s in candidate.routing for a in s],
                                              [b["aux"] for s in reference.routing for b in s]),  # fmt: skip
        "max_rel_grad_diff": max_rel_diff(candidate.grads, reference.grads),
        "max_rel_param_diff": max_rel_diff(candidate.params, reference.params),
        "max_rel_l2_param_diff": rel_l2_diff(candidate.params, reference.params),
        "same_experts_chosen": same_routing,
        "same_tokens_dropped": same_routing and all(a["kept"] == b["kept"] for sa, sb in zip(candidate.routing, reference.routing)
                                                    for a, b in zip(sa, sb)),  # fmt: skip
    }


# ---- predictions from the routing counts -------------------------------------------------------
def predicted_alltoall_bytes(run: MoERun, ep: int, hidden: int, dtype_bytes: int = 4) -> list[list[float]]:
    """[step][rank] bytes sent through all-to-all, from the routing counts alone (all layers)."""
    return alltoall_bytes_from_routing(run.routing, ep, hidden, dtype_bytes)


# ---- playbook run ep ----------------------------------------------------------------------------
def moe_config(setup: TrainSetup, experts: int | None, top_k: int | None) -> ModelConfig:
    """The setup's preset as an MoE: a dense preset ``X`` becomes ``X-moe`` if that exists, else
    gets experts of width ffn_hidden // top_k; ``experts``/``top_k`` override."""
    require_positive(**{k: v for k, v in (("experts", experts), ("top_k", top_k)) if v is not None})
    cfg = setup.config()
    if not cfg.is_moe:
        try:
            cfg = ModelConfig.preset(f"{setup.model}-moe")
        except ValueError:
            k = 2 if top_k is None else top_k
            cfg = cfg.replace(n_experts=4 if experts is None else experts, top_k=k, expert_ffn_hidden=max(1, cfg.ffn_hidden // max(k, 1)))
    if experts is not None or top_k is not None:  # 0 is a value to refuse, not "use the preset's"
        cfg = cfg.replace(n_experts=cfg.n_experts if experts is None else experts, top_k=cfg.top_k if top_k is None else top_k)
    return cfg


def _rank_main(ctx, setup, cfg, capacity_factor, aux_alpha, mode, ep, native=False):
    """One rank: ours, then (``native``) the same run with PyTorch's differentiable all-to-all."""
    kw = dict(capacity_factor=capacity_factor, aux_alpha=aux_alpha, ctx=ctx, mode=mode, ep=ep)
    ours = train_moe(setup, cfg, **kw)
    if not native:
        return ours
    return ours, train_moe(setup, cfg, **kw, native=True)


def add_arguments(p) -> None:
    p.add_argument("--experts", type=int, default=None, help="number of experts (default: the preset's)")
    p.add_argument("--top-k", type=int, default=None, help="experts per token (default: the preset's)")
    p.add_argument("--capacity-factor", type=float, default=None, help="Switch capacity factor; default: no dropping")
    p.add_argument("--ep", type=int, default=None, help="expert-parallel degree (divides world size); default: world size")
    p.add_argument("--aux-alpha", type=float, default=AUX_ALPHA, help="weight of the load-balancing loss (Switch: 0.01)")
    p.add_argument("--experts-tp", action="store_true", help="contrast: tensor parallelism inside each expert instead")


@dataclass
class EPReport(RunReport):
    """:class:`RunReport` plus ``routing``: per step and layer, tokens per expert, drops, balance,
    and all-to-all bytes per rank predicted from the counts beside those measured."""

    routing: dict = field(default_factory=dict)

    def summary(self) -> str:
        lines = [super().summary(), "  routing (step: tokens per expert per layer; dropped; all-to-all bytes rank 0 pred/meas)"]
        for s, step in enumerate(self.routing.get("steps", [])):
            per_layer = " | ".join(str(L["tokens_per_expert"]) for L in step["layers"])
            dropped = sum(L["dropped"] for L in step["layers"])
            b = step["alltoall_bytes_per_rank"]
            lines.append(f"    {s}: {per_layer}; dropped {dropped}; {b['predicted'][0]:,.0f} / {b['measured'][0]:,.0f}")
        return "\n".join(lines)


@register("ep", help="expert parallelism: MoE experts split over ranks, tokens sent by all-to-all", arguments=add_arguments)
def run_ep(setup: TrainSetup, *, world_size: int, backend: str = "auto", experts: int | None = None,
           top_k: int | None = None, capacity_factor: float | None = None, ep: int | None = None,
           aux_alpha: float = AUX_ALPHA, experts_tp: bool = False) -> EPReport:  # fmt: skip
    from playbook.cluster import default_backend, launch

    cfg = moe_config(setup, experts, top_k)
    mode, ep = ("tp", world_size) if experts_tp else ("ep", world_size if ep is None else ep)
    validate(cfg, world_size, ep, capacity_factor, setup.global_batch, mode)
    backend = default_backend(world_size) if backend == "auto" else backend
    both = launch(_rank_main, world_size, setup, cfg, capacity_factor, aux_alpha, mode, ep, mode == "ep", backend=backend)
    results = [b[0] for b in both] if mode == "ep" else both
    reference = train_moe(setup, cfg, capacity_factor=capacity_factor, aux_alpha=aux_alpha)
    whole = combine(results, mode)
    native = None
    if mode == "ep":
        theirs = combine([b[1] for b in both], mode)
        native = {"reference": "torch functional all_to_all_single_autograd in place of ours",
                  "max_rel_grad_diff": max_rel_diff(theirs.grads, whole.grads),
                  "max_rel_param_diff": max_rel_diff(theirs.params, whole.params)}  # fmt: skip
    tokens = setup.global_batch // world_size * setup.seq_len
    measured_a2a = [[r.comm[s].get("all_to_all_single", 0.0) for r in results] for s in range(setup.steps)]
    seconds = [[r.comm[s]["all_to_all_seconds"] for r in results] for s in range(setup.steps)]
    split = dict(ep=ep, expert_tp=1) if mode == "ep" else dict(ep=1, expert_tp=world_size)
    state = moe_model_state_bytes(cfg, **split, dp=world_size, precision="fp32",
                                  n_tensors=param_tensors_per_rank(cfg, split["ep"]))  # fmt: skip
    acts = model_activation_bytes_moe(cfg, seq_len=setup.seq_len, micro_batch=setup.global_batch // world_size,
                                      layers=whole.routing[0], rank=0, ep=ep, mode=mode, tp=world_size)  # fmt: skip
    predicted = {"params": state.params, "grads": state.grads, "optimizer": state.optimizer, "activations": float(acts)}
    comm_pred = predicted_comm(cfg, world_size, ep, mode, tokens)
    if mode == "ep":
        comm_pred["all_to_all_single"] = sum(predicted_alltoall_bytes(whole, ep, cfg.hidden)[s][0] for s in range(setup.steps)) / setup.steps
    comm_meas: dict[str, float] = {}
    for step in results[0].comm:
        for k, v in step.items():
            if k != "all_to_all_seconds":
                comm_meas[k] = comm_meas.get(k, 0.0) + v / setup.steps
    return EPReport(
        strategy="ep" if mode == "ep" else "ep (tensor-parallel experts)", world_size=world_size, backend=backend,
        parity=parity(whole, reference) | {"replicas_max_rel_diff": replicas_agree(results, mode)}, native=native,
        memory={"predicted": predicted, "measured": {k: results[0].memory[k] for k in ("params", "grads", "optimizer", "activations")}},
        comm={"predicted": comm_pred, "measured": comm_meas},
        setup=setup.as_dict() | {"model": cfg.name, "model_config": cfg.name, "n_experts": cfg.n_experts, "top_k": cfg.top_k,
                                 "capacity_factor": capacity_factor, "aux_alpha": aux_alpha, "ep": ep, "mode": mode},
        losses=whole.losses,
        routing=routing_report(whole.routing, whole.ce, ep if mode == "ep" else 1, cfg.hidden, measured_a2a, seconds),
    )  # fmt: skip
