"""Expert parallelism: the experts of every MoE layer split across ranks, tokens sent to them.

The layers are in ``parallel.ep.layers`` (:class:`ExpertParallelMoE`, and
:class:`TensorParallelExperts` for contrast); this module trains them, puts the ranks' pieces back
together, and runs the chapter (``playbook run ep``).

Expert parallelism lives *inside* data parallelism (DeepSpeed-MoE, arXiv:2201.05596, §5): all n
ranks read different rows of the batch; the dense weights (attention, norms, routers) are
replicated and their gradients summed over all n; ranks r, r+ep, r+2ep, ... hold the same
experts and sum those gradients among themselves. Each rank's loss is its share of the global
batch's: Σ cross-entropy over its tokens / the global tokens, plus its share of the aux loss; the
sums are then the global batch's gradients, an expert's arriving summed over the n ranks' tokens by
the all-to-all.
The groups are the mesh's (``ParallelDims(dp=n, ep=ep)``: ``ep`` groups of consecutive ranks,
``ep_replica`` strided by ep, ``dp_cp`` all n), and the gradients are summed by the hybrid
mesh's own table (``parallel.grads``), as in the hybrid.

Training is ``parallel.training.train`` with hooks: ``sync_grads`` as above, and ``sync_loss``
(:class:`StepRecord`) reporting the global loss and recording each step's routing and bytes.

Parity target: ``playbook.model.moe`` on one process, same global batch (``train_moe`` without ``ctx``).
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

from playbook.config import ModelConfig, divisors, require_divides
from playbook.dims import ParallelDims
from playbook.model.gpt import build_moe as build
from playbook.model.moe import AUX_ALPHA, MoEMLP, moe_layers
from playbook.parallel.ep.layers import ExpertParallelMoE, TensorParallelExperts
from playbook.parallel.grads import reduce_gradients
from playbook.parallel.report import all_finite, max_abs_loss_diff, max_rel_diff, rel_l2_diff
from playbook.parallel.training import TrainResult, TrainSetup, train
from playbook.theory.moe.comm import alltoall_bytes_from_routing
from playbook.theory.moe.capacity import check_capacity_factor, check_ep
from playbook.model.moe import is_expert


def sync_gradients(model: nn.Module, mesh, **options) -> None:
    """The hybrid's sums by parameter class (``parallel.grads``): every rank's loss is its share of the
    global batch's mean (Σ over its tokens / the global tokens), so the sums are the global gradient."""
    reduce_gradients(model, mesh, **options)


# ---- the model on this rank's mesh -------------------------------------------------------------
def parallelize(model: nn.Module, mesh, mode: str) -> nn.Module:
    """Swap every MoE layer for its expert-parallel version over the mesh's ``ep`` axis (routing
    counts over all its data ranks, ``dp_cp``), or (``mode="tp"``) for tensor parallelism inside
    every expert over all the data ranks; in place."""
    for block in model.blocks:
        if isinstance(block.mlp, MoEMLP):
            if mode == "ep":
                block.mlp = ExpertParallelMoE(
                    block.mlp,
                    ep_group=mesh.group("ep"),
                    data_group=mesh.group("dp_cp"),
                    ep=mesh.size("ep"),
                    ep_rank=mesh.index("ep"),
                    data_rank=mesh.index("dp_cp"),
                    n_data=mesh.size("dp_cp"),
                )
            else:
                block.mlp = TensorParallelExperts(
                    block.mlp, group=mesh.group("dp_cp"), tp=mesh.size("dp_cp"), rank=mesh.index("dp_cp")
                )
    return model


# ---- training: the one loop, with EP's hooks ---------------------------------------------------
@dataclass
class MoERun(TrainResult):
    """A :class:`TrainResult` plus, per step, the routing of every MoE layer and the comm."""

    routing: list[list[dict]] = field(default_factory=list)  # [step][layer] RoutingStats.as_dict()
    choices: list[list[torch.Tensor]] = field(default_factory=list)  # [step][layer] experts [T_local, k]
    ce: list[float] = field(default_factory=list)  # this rank's cross-entropy per step
    comm: list[dict] = field(default_factory=list)  # [step] {op: sent bytes}, plus "all_to_all_seconds"
    rank: int = 0


class StepRecord:
    """The loop's ``sync_loss`` hook: the global batch's loss, and what each step did.

    Loss: with ``group``, the sum over the n data ranks of their shares (Σ local cross-entropy / the
    global tokens + the aux share), and the aux loss the sum of the shares (TP experts: every rank
    computes the whole batch's, its share 1/n of it). Recorded per step: every MoE layer's routing, this rank's expert choices, the global
    cross-entropy, and the bytes sent by op since the last step (``spans``: this rank's tracer)."""

    def __init__(self, model: nn.Module, *, mode: str = "ep", group=None, n: int = 1, spans: list = ()):
        self.model, self.mode, self.group, self.n, self.spans = model, mode, group, n, spans
        self.first = len(spans)
        self.routing, self.choices, self.ce, self.comm = [], [], [], []

    def __call__(self, loss: torch.Tensor) -> torch.Tensor:
        layers = moe_layers(self.model)
        aux = sum(m.stats.aux for m in layers)  # EP: this rank's share; one process or TP: the whole batch's
        if self.group is not None:  # every rank's loss and aux are shares: their sums are the global ones
            both = torch.stack([loss, torch.tensor(aux, device=loss.device)])
            dist.all_reduce(both, group=self.group)
            loss, aux = both[0], float(both[1])
        self.ce.append(float(loss) - aux)
        self.routing.append([m.stats.as_dict() for m in layers])
        self.choices.append([m.stats.experts for m in layers])
        comm: dict[str, float] = {"all_to_all_seconds": 0.0}
        for s in self.spans[self.first :]:
            if s.kind == "comm":
                comm[s.name] = comm.get(s.name, 0.0) + s.sent_bytes
                if s.name == "all_to_all_single":
                    comm["all_to_all_seconds"] += s.duration
        self.first = len(self.spans)
        self.comm.append(comm)
        return loss


def train_moe(
    setup: TrainSetup,
    cfg: ModelConfig,
    *,
    capacity_factor: float | None = None,
    aux_alpha: float = AUX_ALPHA,
    bias_rate: float = 0.0,
    ctx=None,
    mode: str = "ep",
    ep: int | None = None,
    native: bool = False,
    dtype: torch.dtype = torch.float32,
) -> MoERun:
    """``parallel.training.train`` for a mixture of experts: without ``ctx`` the single-process
    reference; with ``ctx`` (a rank) expert parallelism over ``ep`` ranks (default all) inside
    data parallelism over all, or ``mode="tp"``: tensor parallelism inside every expert.
    ``native=True``: PyTorch's differentiable all-to-all instead of ours (not traced); ``dtype``:
    float64 gives the exact answer the float floor is measured against (``parallel.parity``)."""
    rank, n, device = (0, 1, "cpu") if ctx is None else (ctx.rank, ctx.world_size, ctx.device)
    model = build(cfg, setup.seed, capacity_factor=capacity_factor, aux_alpha=aux_alpha, bias_rate=bias_rate)
    hooks, record = {}, StepRecord(model)
    if ctx is not None:
        validate(cfg, n, ep or n, capacity_factor, setup.global_batch, mode)
        # TP experts: every rank's expert slices are its own (no replicas to sum over): ep = n says so
        mesh = ctx.mesh_for(ParallelDims(dp=n, ep=(ep or n) if mode == "ep" else n))
        parallelize(model, mesh, mode)
        for layer in moe_layers(model):
            layer.native = native
        record = StepRecord(model, mode=mode, group=mesh.group("dp_cp"), n=n, spans=ctx.tracer.spans)
        hooks = dict(sync_grads=lambda m: sync_gradients(m, mesh, sequence_parallel=False), progress=ctx.progress)
        hooks["global_tokens"] = setup.global_batch * setup.seq_len  # every rank's loss: its share of the mean
    result = train(
        setup, rank=rank, world_size=n, device=device, model=model.to(device, dtype), sync_loss=record, **hooks
    )
    return MoERun(
        **vars(result), routing=record.routing, choices=record.choices, ce=record.ce, comm=record.comm, rank=rank
    )


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
        raise ValueError(
            f"global_batch={global_batch} does not split over {world_size} ranks; "
            f"try world_size in {{{', '.join(map(str, divisors(global_batch)))}}}"
        )


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


def merge(results: list[MoERun], mode: str = "ep") -> MoERun:
    """One :class:`MoERun` for the whole model from every rank's (what the reference would hold)."""
    r0 = results[0]
    routing = []
    for step in range(len(r0.routing)):
        layers = []
        for i, layer in enumerate(r0.routing[step]):
            shares = [r.routing[step][i] for r in results] if mode == "ep" else [layer]
            layers.append(
                layer
                | {
                    "aux": sum(s["aux"] for s in shares),
                    "router_entropy": sum(s["router_entropy"] for s in shares) / len(shares),
                }
            )
        routing.append(layers)
    choices = [
        [
            torch.cat([r.choices[s][i] for r in results]) if mode == "ep" else r0.choices[s][i]
            for i in range(len(r0.choices[s]))
        ]
        for s in range(len(r0.choices))
    ]
    ce = r0.ce  # every rank computed the global batch's cross-entropy
    return MoERun(
        r0.losses,
        _full([r.grads for r in results], mode),
        _full([r.params for r in results], mode),
        r0.memory,
        routing=routing,
        choices=choices,
        ce=ce,
        comm=r0.comm,
    )


def replicas_agree(results: list[MoERun], mode: str = "ep") -> float:
    """Largest relative difference between copies of the same weight on different ranks (0 expected)."""
    worst = 0.0
    for r in results[1:]:
        same = {k: v for k, v in r.params.items() if k in results[0].params and (mode == "ep" or not is_expert(k))}
        worst = max(worst, max_rel_diff(same, {k: results[0].params[k] for k in same}))
    return worst


def parity(candidate: MoERun, reference: MoERun) -> dict:
    """Loss, aux loss, first-step gradients, parameters after the last step, and the routing."""
    same_routing = all(
        torch.equal(a, b) for sa, sb in zip(candidate.choices, reference.choices) for a, b in zip(sa, sb)
    )
    return {
        "reference": "single-process MoE, same global batch",
        "finite": all_finite(candidate, reference),
        "max_abs_loss_diff": max_abs_loss_diff(candidate.losses, reference.losses),
        "max_abs_aux_diff": max_abs_loss_diff(
            [a["aux"] for s in candidate.routing for a in s], [b["aux"] for s in reference.routing for b in s]
        ),
        "max_rel_grad_diff": max_rel_diff(candidate.grads, reference.grads),
        "max_rel_param_diff": max_rel_diff(candidate.params, reference.params),
        "max_rel_l2_param_diff": rel_l2_diff(candidate.params, reference.params),
        "same_experts_chosen": same_routing,
        "same_tokens_dropped": same_routing
        and all(a["kept"] == b["kept"] for sa, sb in zip(candidate.routing, reference.routing) for a, b in zip(sa, sb)),
    }


# ---- predictions from the routing counts -------------------------------------------------------
def predicted_alltoall_bytes(run: MoERun, ep: int, hidden: int, dtype_bytes: int = 4) -> list[list[float]]:
    """[step][rank] bytes sent through all-to-all, from the routing counts alone (all layers)."""
    return alltoall_bytes_from_routing(run.routing, ep, hidden, dtype_bytes)
