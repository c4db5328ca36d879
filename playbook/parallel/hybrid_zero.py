"""Step 5 of ``parallelize`` with ZeRO: the optimizer sharded over the ranks that hold the same
dense weights, ``dp×cp`` (CP is data parallelism over tokens for everything but attention, so its
ranks hold replicas too; torchtitan shards FSDP over dp×cp alike), tensor parallelism inside (each tp
rank shards its own slices), and inside a pipeline over this stage's units only. Each routed
expert is a unit of its own, sharded over the ``ep_replica`` ranks that hold the same experts
(none when ep = dp·cp), its gradient divided by dp·cp as the dense one is: the all-to-all already
summed it over the tokens of the ep group (DeepSpeed-MoE, Rajbhandari et al. 2022, §5.2; DeepSeek-V3
trains with ZeRO-1 under EP, DeepSeek-AI 2024, arXiv:2412.19437, §3.2). An expert that no token
reached in a step keeps no gradient, so AdamW leaves it alone as the single process's does (not a
zero gradient, which AdamW would apply: weight decay, moments, a step counted); and the experts'
units are reduced after backward in unit order at every stage, so that a replica whose expert got
no token still joins the reduce-scatter of one that did (``parallel.flat_unit.Fed``). In a
pipeline ZeRO-2 reduces on the last micro-batch, as torchtitan's FSDP does under PP: the m micro-batches sum into a
whole flat gradient (ZeRO-1's), reduce-scattered once per step, after which only this rank's slice
is kept, so it holds ZeRO-1's gradient bytes at the step's peak and saves them only between steps;
ZeRO-3 there gathers its weights once a step and frees them after the last micro-batch
(``parallel.zero_pipeline``). ``parallel.zero.Zero`` does the work; these are the loop's hooks for it.

Every rank's loss is the mean over its tokens, and every rank holds as many, so ``Zero`` dividing
the reduce-scattered sum by dp·cp gives the global batch's mean gradient. Under sequence
parallelism the norms saw s/tp tokens each: their gradients are first summed over tp, unit by unit,
in place in the flat gradient, just before that unit's reduction over dp×cp, wherever it happens:
after backward (ZeRO-1, and ZeRO-2 in a pipeline) or during it (ZeRO-2 and 3), so that the
reduce-scatter never runs on a norm gradient that holds only this tp rank's tokens.
"""

from __future__ import annotations

from playbook.measure import trace
from playbook.measure.sharding import SavedActivationsBesides
from playbook.parallel.zero import Zero
from playbook.parallel.zero_pipeline import PipelineZero, readable


def zero_optimizer(model, mesh, plan, setup, tracer, pieces=None) -> tuple[Zero, dict]:
    """(ZeRO over dp×cp on ``pieces`` of ``model``, hooks: its ``sync_grads`` and a ``finish`` that
    puts the first step's gradients and the last parameters back together for the parity check)."""
    summed_first = None
    if plan.sequence_parallel:  # the norms' gradients, summed over tp before any reduction over dp×cp
        from playbook.parallel.tp import shard_dims

        summed_first = (mesh.group("tp"), {name for name, dim in shard_dims(model).items() if dim is None})
    in_pipeline = plan.dims.pp > 1 and plan.zero >= 2  # reduce on the last micro-batch
    zero = (PipelineZero if in_pipeline else Zero)(
        model,
        stage=plan.zero,
        group=mesh.group("dp_cp"),
        lr=setup.lr,
        prefetch=True,
        tracer=tracer,
        pieces=pieces,
        expert_group=mesh.group("ep_replica") if mesh.size("ep_replica") > 1 else None,
        n_data=mesh.size("dp_cp"),
        summed_first=summed_first,
    )
    first: list = []
    memory: dict = {}  # the first step's bytes by category, as chapter 2 measures them

    def sync(m):
        # weights, gradients and AdamW before the reduction (the last step's): the peak in a pipeline
        memory["state_after_backward"] = sum(zero.held().values())
        zero.sync()
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
    return zero, hooks | ({"collect": readable} if in_pipeline and plan.zero == 3 else {})


def zero_hooks(model, mesh, plan, setup, tracer, positions=None) -> dict:
    """The loop's hooks for ZeRO without a pipeline: ``Zero``'s own forward, unit by unit."""
    zero, hooks = zero_optimizer(model, mesh, plan, setup, tracer)
    memory = hooks.pop("memory")

    def forward_backward(_, tokens, targets):
        with SavedActivationsBesides(zero.unit_buffers) as saved:  # the weights' own buffers are not activations
            loss = zero.loss(tokens, targets, positions)
        memory.setdefault("activations", saved.bytes)
        loss.backward()
        return loss

    return {"model": model, "forward_backward": forward_backward, **hooks}
