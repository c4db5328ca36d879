"""A tied embedding across the pipeline, as Megatron-LM composes it (Shoeybi et al. 2019, §3;
Narayanan et al. 2021, §4.1's embedding group).

With ``tie_embeddings`` the output head reuses the word embedding, one [vocab, hidden] tensor
(1/tp of its rows per tensor-parallel rank). In a pipeline the embedding sits on the first stage
and the head on the last, so both ranks hold a copy: every rank builds the whole model from the
same seed before the pipeline is cut, so the copies start equal. Each copy's gradient is then only
its own use (the lookup on the first stage, the projection on the last); after backward, and
before the gradients are summed over dp×cp, the two are summed over the two-rank *embedding group*
(``axis "embed"``): both copies then hold the single process's gradient, AdamW takes the same step
on both, and they stay equal. Megatron sums over the embedding group after the data-parallel
all-reduce; the two sums commute, but ZeRO's reduce-scatter leaves each rank a slice of the flat
gradient only (Rajbhandari et al. 2020, §5), so here the embedding group goes first, with or without
ZeRO: the gradient is then whole on both ends. Where one rank holds both stages (the V of ZB-V and
DualPipe-V) the two uses meet in the one tensor and nothing is sent; ZeRO puts it in the embedding's
flat unit, which the head reads too (``parallel.zero.flat_unit``). The copy on the last stage is reported
under the single process's name, ``tok_emb.weight``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from playbook.cluster.trace import tracer as trace
from playbook.cluster.mesh import _group
from playbook.theory.hybrid.hybrid import tied_stage_ranks


def embedding_group(mesh, plan, cfg):
    """This rank's embedding group (its first and last pipeline rank, at its dp, tp and cp
    coordinates), or None where it holds neither or both. Every rank creates every group, in order."""
    first, last = tied_stage_ranks(cfg, plan.dims.pp, plan.schedule, plan.v)
    if first == last:
        return None
    mine = None
    for ranks in plan.dims.groups("pp"):  # global ranks in pipeline order
        pair = [ranks[first], ranks[last]]
        group = _group(pair, "embed")
        mine = group if mesh.rank in pair else mine
    return mine


def tie_across_stages(hooks: dict, own, mesh, plan, cfg) -> dict:
    """The loop's hooks with the embedding-group sum after ``sync_grads`` and the copy on the last
    stage named as the single process names it."""
    group = embedding_group(mesh, plan, cfg)
    if group is None:
        return hooks
    copy = own.tok_emb.weight if hasattr(own, "tok_emb") else own.lm_head.weight  # [vocab/tp, hidden]
    sync, finish = hooks["sync_grads"], hooks.get("finish")

    def sync_tied(model):
        with trace.on_axis("embed"):  # under ZeRO a view of the flat gradient, reduce-scattered next
            dist.all_reduce(copy.grad, group=group)  # lookup's gradient + projection's gradient
        sync(model)  # then dp×cp: ZeRO's reduce-scatter, or the all-reduce

    def rename(result):
        result = finish(result) if finish is not None else result
        return single_process_names(result)

    return hooks | {"sync_grads": sync_tied, "finish": rename}


def single_process_names(result):
    """``result`` with the last stage's copy under the single process's name, ``tok_emb.weight``."""
    for tensors in (result.grads, result.params):
        if "lm_head.weight" in tensors:
            tensors["tok_emb.weight"] = tensors.pop("lm_head.weight")
    return result


def sum_with_peer(grad: torch.Tensor, peer: int, group) -> None:
    """``grad`` plus the other copy's gradient on ``group`` rank ``peer``, in place on both ranks, where
    no two-rank group exists (``parallel.pp.run``'s standalone pipeline): an all-reduce over two ranks is
    one exchange, each sending S bytes (the ring's 2S(n − 1)/n), and a + b on one rank is b + a, the
    same float, on the other."""
    theirs = torch.empty_like(grad)  # [vocab, hidden]
    peer = dist.get_global_rank(group, peer)
    with trace.on_axis("embed"):
        sent = dist.isend(grad.contiguous(), dst=peer, group=group, tag=TIED_TAG)
        dist.recv(theirs, src=peer, group=group, tag=TIED_TAG)
        sent.wait()
    grad += theirs


TIED_TAG = 2**30  # above every micro-batch message's tag (``pp.executor._tag``)
