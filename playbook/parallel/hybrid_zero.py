"""Step 5 of ``parallelize`` with ZeRO: the optimizer sharded over the mesh's ``dp`` axis, tensor
parallelism inside (each tp rank shards its own slices). ``parallel.zero.Zero`` does the work; these
are the one training loop's hooks for it."""

from __future__ import annotations

from playbook.measure import trace
from playbook.measure.sharding import SavedActivationsBesides
from playbook.parallel.zero import Zero


def zero_hooks(model, mesh, plan, setup, tracer) -> dict:
    zero = Zero(model, stage=plan.zero, group=mesh.group("dp"), lr=setup.lr, prefetch=True, tracer=tracer)
    first: list = []
    memory: dict = {}  # the first step's bytes by category, as chapter 2 measures them

    def forward_backward(_, tokens, targets):
        with SavedActivationsBesides(zero.unit_buffers) as saved:  # the weights' own buffers are not activations
            loss = zero.loss(tokens, targets)
        memory.setdefault("activations", saved.bytes)
        loss.backward()
        return loss

    def sync(_):
        zero.sync()
        if not first:  # the first step's gradient slices, after the reduce-scatter
            first.extend(u.opt_param.grad.clone() for u in zero.units)
            memory["grads"] = zero.held()["grads"]

    def finish(result):
        held = zero.held()  # after the last step: weights (flat or sharded) and AdamW's state
        result.memory = {
            "params": held["params"],
            "grads": memory["grads"],
            "optimizer": held["optimizer"],
            "activations": memory["activations"],
        }
        with trace.on_axis("report"):  # gathering whole tensors for the parity check is not the step's traffic
            result.grads = {k: v.cpu() for k, v in zero.gather(first).items()}
            result.params = {k: v.cpu() for k, v in zero.gather([u.opt_param for u in zero.units]).items()}
        return result

    return {
        "model": model,
        "optimizer": zero,
        "forward_backward": forward_backward,
        "sync_grads": sync,
        "finish": finish,
    }
