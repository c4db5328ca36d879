"""A mixture of experts inside the hybrid: every stage's aux loss, the routing of every forward,
and the single-process reference that computes what m micro-batches compute.

**The aux loss of every stage.** Switch's load-balancing loss (Fedus et al. 2022, JMLR,
arXiv:2101.03961, §2.2 eq. 4) is a term of the loss of each MoE layer, and in a pipeline the loss
lives on the last stage: an earlier stage's aux loss has no way into it. So each MoE layer of a
pipeline stage puts its aux loss into the graph at its own output (:class:`AuxIntoGraph`: identity
forward; backward passes the output gradient through and gives the aux loss the gradient
``1/m``), as Megatron-LM's aux-loss auto-scaler does; the model's loss then leaves it out
(``aux_loss`` None). Every stage's aux loss so counts once, at the scale of the micro-batch's
cross-entropy (its tokens over the global batch's: 1/m), whichever stage the layer sits on; each
rank's share of it is unscaled, the data ranks' shares summing to the micro-batch's aux loss as
their gradients are summed (``parallel.grads``). One stage (pp = 1) is the same driver. For the
reported loss each rank adds the aux values of its stage; ``hybrid.global_loss`` sums the stages and
the data ranks.

**The reference.** With m micro-batches each MoE layer routes one micro-batch at a time: its
capacity C = ⌈k·T/E·cf⌉ and its aux loss α·E·Σᵢ fᵢ·Pᵢ are functions of that micro-batch's T
tokens (over all the data ranks, whose counts are all-gathered each forward). The aux loss is a
product of two batch means (fᵢ, Pᵢ), so the sum of m micro-batch aux losses is *not* the aux loss
of the whole batch, and one forward over the global batch is a different computation. The exact
single-process equivalent is gradient accumulation over the same m micro-batches: micro-batch j
of the global batch is the j-th micro-batch of every dp rank, in dp order (:func:`micro_rows`),
each loss ÷ m — what :func:`reference` runs. With m = 1 it is the plain one-forward reference.
The hybrid builds its MoE dropless (no capacity), so the order in which the ranks' tokens queue
for an expert does not matter; with a capacity factor it would under cp and tp, whose ranks hold
sequence slices (the single process queues a whole row before the next).
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from playbook.cluster.trace import tracer as trace
from playbook.model.gpt import build_moe as build
from playbook.model.moe import moe_layers
from playbook.parallel.clip import clip_reference
from playbook.parallel.parity import floor_of
from playbook.parallel.training import TrainResult, TrainSetup, train


def parallelize_experts(model, mesh, sequence_parallel: bool) -> None:
    """Every MoE layer of ``model`` swapped for its expert-parallel version over the mesh's ``ep``
    axis, its routing counts over dp×cp (and tp, whose ranks route 1/tp of the tokens each, their
    sequence slice: ``parallel.tp.moe``); in place."""
    from playbook.model.moe import MoEMLP
    from playbook.parallel.ep.layers import ExpertParallelMoE
    from playbook.parallel.tp.moe import TPExpertParallelMoE, split_tokens

    d = mesh.dims
    ep = dict(ep_group=mesh.group("ep"), data_group=mesh.group("dp_cp"), ep=d.ep, ep_rank=mesh.index("ep"))
    ep |= dict(data_rank=mesh.index("dp_cp"), n_data=d.dp * d.cp)
    for block in model.blocks:
        if not isinstance(block.mlp, MoEMLP):
            continue
        if d.tp == 1:
            block.mlp = ExpertParallelMoE(block.mlp, **ep)
            continue
        block.mlp = TPExpertParallelMoE(block.mlp, tp_group=mesh.group("tp"), tp=d.tp, tp_rank=mesh.index("tp"), **ep)
        if not sequence_parallel:  # the stream is replicated over tp: route this rank's slice of it
            split_tokens(block.mlp, mesh.group("tp"))


class AuxIntoGraph(torch.autograd.Function):
    """y = x in forward; in backward x gets y's gradient and ``aux`` (a scalar in the graph) gets
    ``scale``, as if ``scale · aux`` had been added to the loss. Saves no tensor."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)  # [batch, seq, hidden]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, torch.full((), ctx.scale, dtype=grad.dtype, device=grad.device), None


def count_aux(stage, m: int, into_graph: bool) -> list[float]:
    """The aux loss value of every MoE forward of ``stage`` (÷ m), until the caller empties the list
    returned; ``into_graph`` (a pipeline stage): each one also enters the graph at its layer's
    output at scale 1/m, and the model's loss leaves it out (module docstring)."""
    taken: list[float] = []

    def hook(layer, _inputs, out):
        taken.append(float(layer.aux_loss.detach()) / m)
        if into_graph:
            aux, layer.aux_loss = layer.aux_loss, None  # the model's loss no longer adds it
            return AuxIntoGraph.apply(out, aux, 1.0 / m)
        return None

    for layer in moe_layers(stage):
        layer.register_forward_hook(hook)
    return taken


def record_routing(model) -> list[dict]:
    """Every MoE forward's routing (``RoutingStats.as_dict``), in the order they ran; the list
    returned fills up until the caller empties it."""
    seen: list[dict] = []
    for layer in moe_layers(model):
        layer.register_forward_hook(lambda layer, _i, _o: seen.append(layer.stats.as_dict()))
    return seen


def moe_hooks(hooks: dict, plan, routing: list, mesh) -> dict:
    """The loop's hooks for an MoE model: the routing of every step appended to ``routing``
    (``[step][forward]``); inside a pipeline, every stage's aux loss counted (module docstring);
    the reported loss with the aux shares of every tp rank (each routed 1/tp of the tokens)."""
    stage, d = hooks["model"], plan.dims
    seen, taken = record_routing(stage), count_aux(stage, plan.m, into_graph=True)
    sync, report = hooks["sync_grads"], hooks["sync_loss"]

    def sync_grads(model):
        routing.append(list(seen))
        seen.clear()
        sync(model)

    def sync_loss(loss):
        mine = torch.tensor(sum(taken), dtype=loss.dtype, device=loss.device)
        taken.clear()
        if d.tp > 1:  # the other tp ranks' aux shares: their tokens were not routed here
            with trace.on_axis("report"):
                every = mine.clone()
                dist.all_reduce(every, group=mesh.group("tp"))
            loss = loss + every - mine
        return report(loss)

    step = hooks["forward_backward"]

    def forward_backward(model, tokens, targets):  # the last stage's cross-entropy + this stage's aux
        return step(model, tokens, targets) + sum(taken)

    return hooks | {"sync_grads": sync_grads, "sync_loss": sync_loss, "forward_backward": forward_backward}


# ---- the single-process reference -------------------------------------------------------------
def micro_rows(global_batch: int, dp: int, m: int) -> list[list[int]]:
    """Rows of the global batch in each of the m micro-batches: the j-th of every dp rank's m
    chunks (dp rank i holds rows i·b/dp ...), in dp order."""
    per = global_batch // dp // m
    return [[i * global_batch // dp + j * per + r for i in range(dp) for r in range(per)] for j in range(m)]


@functools.lru_cache(maxsize=16)
def _accumulated(setup: TrainSetup, dp: int, m: int, dtype: torch.dtype, max_norm: float | None = None) -> TrainResult:
    model = build(setup.config(), setup.seed).to(dtype)
    rows = micro_rows(setup.global_batch, dp, m)

    def forward_backward(model, tokens, targets):  # gradient accumulation: Σⱼ loss(micro-batch j) / m
        total = 0.0
        for r in rows:
            _, loss = model(tokens[r], targets[r])  # [len(r), s] each
            (loss / m).backward()
            total = total + loss.detach() / m
        return total

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        norms: list[float] = []
        clip = clip_reference(max_norm, norms) if max_norm is not None else None
        result = train(setup, model=model, forward_backward=forward_backward, sync_grads=clip)
        result.grad_norms = norms
        return result
    finally:
        torch.set_num_threads(threads)


def reference(setup: TrainSetup, plan) -> tuple[TrainResult, dict | None]:
    """(the single process that computes what ``plan`` computes, its float floor or None for the
    plain reference's own): for an MoE model in m > 1 micro-batches, gradient accumulation over
    the same micro-batches (module docstring); otherwise ``parity.reference``. Under ``plan.max_norm``
    both clip by torch's ``clip_grad_norm_`` (``parallel.clip``), the floor theirs."""
    from playbook.parallel.parity import float_floor, reference as plain

    clip = plan.max_norm
    if not (setup.config().is_moe and plan.m > 1):
        return plain(setup, max_norm=clip), None if clip is None else float_floor(setup, clip)
    args = (setup, plan.dims.dp, plan.m)
    single = _accumulated(*args, torch.float32, clip)
    return single, floor_of(single, _accumulated(*args, torch.float64, clip))
