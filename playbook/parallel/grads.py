"""Step 5 of ``parallelize``: every gradient reduced by its parameter's class, each reduction a SUM
over declared mesh axes, all from ONE table (``REDUCTIONS``).

Every rank's loss is its share of the global batch's mean: the sum of its token losses divided by
the global batch's token count (``hybrid.pipeline``), the one division. The gradient of the global loss is
then the SUM of the gradients of the ranks that hold a parameter and fed it different tokens: never
a mean. Which ranks those are depends only on the parameter's class:

- a tensor-parallel shard (Megatron-LM's column and row splits, Shoeybi et al. 2019, §3): each tp
  rank holds another slice; the dp and cp ranks hold copies fed other rows and other positions;
- a replicated parameter fed the full sequence (the norms without SP, every weight when tp = 1):
  the tp ranks computed the same gradient from the same tokens, so only dp×cp;
- a replicated parameter fed a sequence shard: the norms under sequence parallelism (Korthikanti et
  al. 2022, §4.2.2), an MoE layer's router and shared experts where tp splits its tokens
  (``parallel.tp.moe``): each tp rank saw s/tp tokens, so tp×dp×cp;
- a routed expert: its replicas, the ``ep_replica`` ranks inside dp×cp that hold the same experts
  (the all-to-all already summed the tokens of its ep group; DeepSpeed-MoE, Rajbhandari et al. 2022,
  §5.2), and the tp ranks where tp splits the tokens;
- a tied embedding: first its two copies on the first and the last pipeline stage (Narayanan et
  al. 2021's embedding group; ``parallel.tied`` runs that sum, so that ZeRO's reduce-scatter finds the
  gradient whole), then with the dense weights over dp×cp.

``reduce_gradients`` runs the table without ZeRO, one flat all-reduce per axis; under ZeRO the
flat units do dp×cp and the replicas (``parallel.zero.zero``), and ``tp_summed`` names what they first sum over tp.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from playbook.parallel.comm import all_reduce_flat
from playbook.model.moe import ROUTED


@dataclass(frozen=True)
class Reduction:
    """A parameter class, examples of it, and the mesh axes its gradient is summed over, in order."""

    name: str
    examples: str
    axes: tuple[str, ...]


SHARD = Reduction("tensor-parallel shard", "q, k, v, o, gate, up, down; embedding and head rows", ("dp_cp",))
FULL = Reduction("replicated, fed the full sequence", "norms without SP; every weight when tp = 1", ("dp_cp",))
SEQ = Reduction(
    "replicated, fed a sequence shard",
    "norms under SP; an MoE layer's router and shared experts under tp",
    ("tp", "dp_cp"),
)
EXPERT = Reduction("routed expert", "the experts of an MoE layer", ("tp", "ep_replica"))
TIED = Reduction("tied embedding", "tok_emb = lm_head, on the first and on the last stage", ("embed", "dp_cp"))
REDUCTIONS = (SHARD, FULL, SEQ, EXPERT, TIED)  # the one table
AXIS_NAMES = {"dp_cp": "dp×cp", "tp": "tp", "ep_replica": "expert replicas", "embed": "first + last stage"}


def classify(name: str, split: int | None, *, tp: int, sequence_parallel: bool, tied: bool) -> Reduction:
    """The class of parameter ``name`` (``split``: its tensor-parallel dim, None if replicated)."""
    if tied and name in ("tok_emb.weight", "lm_head.weight"):
        return TIED
    if ROUTED in name:
        return EXPERT
    if split is not None:
        return SHARD
    if sequence_parallel or (tp > 1 and ".mlp." in name):  # an MoE layer's router, shared experts under tp
        return SEQ
    return FULL


def shard_dims(model: nn.Module) -> dict[str, int | None]:
    """Parameter name -> the dim it is split along (0 or 1), None if replicated."""
    owner = {id(p): getattr(m, "shard_dim", None) for m in model.modules() for p in m.parameters(recurse=False)}
    return {n: owner[id(p)] for n, p in model.named_parameters()}


def classes(model: nn.Module, tp: int, sequence_parallel: bool) -> dict[str, Reduction]:
    """Parameter name -> its class, for this rank's ``model`` (a GPT, its TP shard, or a stage's pieces)."""
    tied = getattr(getattr(model, "cfg", None), "tie_embeddings", False) or _shares_embedding(model)
    mode = dict(tp=tp, sequence_parallel=sequence_parallel, tied=tied)
    return {name: classify(name, split, **mode) for name, split in shard_dims(model).items()}


def _shares_embedding(model: nn.Module) -> bool:
    emb, head = getattr(model, "tok_emb", None), getattr(model, "lm_head", None)
    return emb is not None and head is not None and emb.weight is head.weight


def tp_summed(model: nn.Module, tp: int, sequence_parallel: bool) -> set[str]:
    """Names whose gradients are summed over tp before the data axes (ZeRO sums them unit by unit)."""
    return {n for n, c in classes(model, tp, sequence_parallel).items() if "tp" in c.axes} if tp > 1 else set()


def reduce_gradients(model: nn.Module, mesh, sequence_parallel: bool) -> None:
    """Sum every gradient of ``model`` over its class's axes of ``mesh``, one flat all-reduce per axis
    (the embedding group's sum is ``parallel.tied``'s). An expert that got no token on a rank has no
    gradient there: on the axes that carry experts, every MoE parameter's travels with a flag, and
    stays None where no rank had one."""
    from playbook.model.moe import moe_layers

    named = dict(model.named_parameters())
    moe = {id(p) for layer in moe_layers(model) for p in layer.parameters()}
    by_class = classes(model, mesh.size("tp"), sequence_parallel)
    for axis in ("tp", "dp_cp", "ep_replica"):
        params = [named[n] for n, c in by_class.items() if axis in c.axes]
        if mesh.size(axis) == 1 or not params:
            continue
        if any(by_class[n] is EXPERT for n, c in by_class.items() if axis in c.axes):
            _sum_flagged([p for p in params if id(p) not in moe], [p for p in params if id(p) in moe], mesh.group(axis))
        else:
            all_reduce_flat([p.grad for p in params if p.grad is not None], mesh.group(axis))


def _sum_flagged(always: list, maybe: list, group) -> None:
    """One flat sum of ``always``'s gradients and ``maybe``'s (zeros where None) with their flags."""
    had = torch.tensor([p.grad is not None for p in maybe], dtype=torch.float32, device=maybe[0].device)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in maybe]
    all_reduce_flat([p.grad for p in always if p.grad is not None] + grads + [had], group)
    for p, g, flag in zip(maybe, grads, had):
        p.grad = g if flag > 0 else None


def table() -> list[dict[str, str]]:
    """``REDUCTIONS`` as rows to show (chapter 8)."""
    return [
        {"parameter class": r.name, "for example": r.examples, "summed over": " × ".join(AXIS_NAMES[a] for a in r.axes)}
        for r in REDUCTIONS
    ]
