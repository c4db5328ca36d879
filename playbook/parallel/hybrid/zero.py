"""Step 5 of ``parallelize`` with ZeRO (Rajbhandari et al. 2020): the optimizer sharded over the ranks
that hold the same dense weights, ``dp×cp`` (CP is data parallelism over tokens for everything but
attention, so its ranks hold replicas too; torchtitan shards FSDP over dp×cp alike), tensor
parallelism inside (each tp rank shards its own slices), and inside a pipeline over this stage's
units only. Each routed expert is a unit of its own, sharded over the ``ep_replica`` ranks that hold
the same experts (none when ep = dp·cp): the all-to-all already summed its gradient over the tokens
of the ep group (DeepSpeed-MoE, Rajbhandari et al. 2022, §5.2; DeepSeek-V3 trains with ZeRO-1 under
EP, DeepSeek-AI 2024, arXiv:2412.19437, §3.2). An expert that no token reached in a step keeps no
gradient, so AdamW leaves it alone as the single process's does (not a zero gradient, which AdamW
would apply: weight decay, moments, a step counted); and the experts' units are reduced after
backward in unit order at every stage, so that a replica whose expert got no token still joins the
reduce-scatter of one that did (``parallel.zero.flat_unit.Fed``).

With one micro-batch on one stage, ``Zero`` runs as chapter 5 built it: ZeRO-2 reduce-scatters each
unit during backward, ZeRO-3 gathers piece by piece (:func:`piece_runner`). With m > 1 micro-batches
or several stages, ZeRO-2 and 3 reduce on the last micro-batch, as torchtitan's FSDP does under PP:
the m micro-batches sum into a whole flat gradient (ZeRO-1's), reduce-scattered once per step, after
which only this rank's slice is kept, so it holds ZeRO-1's gradient bytes at the step's peak and saves
them only between steps; ZeRO-3 there gathers its weights once a step and frees them after the last
micro-batch (``parallel.zero.pipeline``).

Every rank's loss is its share of the global batch's mean (``hybrid.pipeline``), and ``Zero`` sums, as
everywhere. The gradients the table of ``parallel.grads`` sums over tp first (the norms under sequence
parallelism, an MoE layer's router, shared and routed experts under tp) are summed over tp unit by
unit, in place in the flat gradient, just before that unit's reduction over dp×cp, wherever it
happens: after backward (ZeRO-1, and ZeRO-2/3 over micro-batches) or during it (ZeRO-2 and 3), so that
the reduce-scatter never runs on a gradient that holds only this tp rank's tokens.
"""

from __future__ import annotations

from playbook.cluster.trace import tracer as trace
from playbook.parallel.grads import tp_summed
from playbook.parallel.zero.zero import Zero
from playbook.parallel.zero.pipeline import PipelineZero, readable


def zero_optimizer(model, mesh, plan, setup, tracer, pieces=None, clip=None) -> tuple[Zero, dict]:
    """(ZeRO over dp×cp on ``pieces`` of ``model``, hooks: its ``sync_grads`` and a ``finish`` that
    puts the first step's gradients and the last parameters back together for the parity check).
    ``clip``: the global-norm clip (``parallel.clip.GlobalClip``) of the slices, after the reduction and
    before the first step's slices are kept, so that they are the clipped gradients the step uses."""
    tp_first = tp_summed(model, mesh.size("tp"), plan.sequence_parallel)  # the table's tp×dp×cp classes
    accumulates = (plan.dims.pp > 1 or plan.m > 1) and plan.zero >= 2  # reduce on the last micro-batch
    zero = (PipelineZero if accumulates else Zero)(
        model,
        stage=plan.zero,
        group=mesh.group("dp_cp"),
        lr=setup.lr,
        prefetch=True,
        tracer=tracer,
        pieces=pieces,
        expert_group=mesh.group("ep_replica") if mesh.size("ep_replica") > 1 else None,
        sum_first=(mesh.group("tp"), tp_first) if tp_first else None,
    )
    first: list = []
    memory: dict = {}  # the first step's bytes by category, as chapter 2 measures them

    def sync(m):
        # weights, gradients and AdamW before the reduction (the last step's): the peak in a pipeline
        memory["state_after_backward"] = sum(zero.held().values())
        zero.sync()
        if clip is not None:
            clip(zero=zero)
        if not first:  # the first step's gradient slices, after the reduce-scatter
            first.extend(None if u.opt_param.grad is None else u.opt_param.grad.clone() for u in zero.units)
            memory["grads"] = zero.held()["grads"]

    def finish(result):
        held = zero.held()  # after the last step: weights (flat or sharded) and AdamW's state
        result.memory = {
            "params": held["params"] + held["gathered"],  # whole units still gathered count as weights
            "grads": memory["grads"],
            "optimizer": held["optimizer"],
            "activations": memory.get("activations", result.memory.get("activations")),
            "state_after_backward": memory["state_after_backward"],
        }
        with trace.on_axis("report"):  # gathering whole tensors for the parity check is not the step's traffic
            result.grads = {k: v.cpu() for k, v in zero.gather(first).items()}
            result.params = {k: v.cpu() for k, v in zero.gather([u.opt_param for u in zero.units]).items()}
        return result

    hooks = {"optimizer": zero, "sync_grads": sync, "finish": finish, "memory": memory}
    return zero, hooks | ({"collect": readable} if accumulates and plan.zero == 3 else {})


def piece_runner(zero: Zero, last: int):
    """ZeRO-3 with one micro-batch: ``Chunk.run`` for each piece (0: the embedding, i+1: block i,
    ``last``: the final norm and head), ``Zero``'s own: the piece's units gathered just before its
    forward (the next one's prefetched) and freed after, gathered again before its backward and
    reduce-scattered after it (Rajbhandari et al. 2020, §5.3)."""

    def run(piece: int, fn, x):
        zero.phase = "forward"
        out = zero._run(piece, fn, x)
        if piece == last:
            zero.phase = "backward"
        return out

    return run
