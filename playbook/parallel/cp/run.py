"""Context parallelism on real ranks: ``playbook run cp``. Each rank trains the GPT of
``parallel.cp.model`` on its shard of every sequence (the one loop, ``parallel.training.train``,
with CP's hooks), and the run is compared with the single process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from playbook.cluster import default_backend, launch
from playbook.dims import ParallelDims
from playbook.cluster.trace import tracer as trace
from playbook.cluster.trace.spans import bytes_by_op
from playbook.model.gpt import GPT
from playbook.parallel.comm import all_reduce_flat
from playbook.parallel.registry import register
from playbook.parallel.report import RunReport
from playbook.parallel.cp.model import cp_attention_fn, use_attention, use_positions
from playbook.parallel.cp.ring_attention import VARIANTS
from playbook.parallel.training import TrainResult, TrainSetup, train
from playbook.parallel.parity import against_single
from playbook.parallel.parity import reference as single_process
from playbook.theory import cp as theory
from playbook.theory.inventory.model_state import model_state_bytes


@dataclass
class CPResult(TrainResult):
    """A ``TrainResult`` plus what CP adds: ring blocks this rank computed in one attention
    forward (a list of dicts), seconds inside ring blocks (forward + backward, every call),
    bytes sent per step by op."""

    blocks: list[dict] = field(default_factory=list)
    block_seconds: float = 0.0
    sent_per_step: dict[str, float] = field(default_factory=dict)


# ---- training: the one loop, with CP's hooks ----------------------------------------------------
def train_cp(
    setup: TrainSetup,
    *,
    group=None,
    variant: str = "ring",
    zigzag: bool = False,
    causal: bool = True,
    device="cpu",
    dtype=torch.float32,
    progress=None,
) -> CPResult:
    """``training.train`` with each sequence split over the ranks of ``group`` (None: one process,
    the whole sequence). Every rank reads every row of the global batch, the tokens at its
    positions; its loss is its share of the global mean (``GPT.loss`` over the global token count), so the gradients of the
    replicated weights are *summed* over the group, and so is the loss for reporting.
    ``dtype=torch.float64`` takes rounding out of a parity check."""
    rank, n = (dist.get_rank(group), dist.get_world_size(group)) if group is not None else (0, 1)
    check(setup, n, variant, zigzag)
    model = GPT(setup.config(), seed=setup.seed).to(device=device, dtype=dtype)
    positions = torch.tensor(theory.shard_positions(setup.seq_len, n, rank, zigzag), device=device)  # [s/n]
    log: list[dict] = []
    use_attention(model, cp_attention_fn(variant, group, zigzag=zigzag, causal=causal, positions=positions, log=log))
    use_positions(model, positions, setup.global_batch * setup.seq_len)
    task = setup.task()

    def batch(step):
        tokens, targets = task.batch(step, setup.global_batch, setup.seq_len, device=device)  # [B, s]
        return tokens[:, positions], targets[:, positions]  # [B, s/n]: this rank's tokens

    def sum_loss(loss):
        dist.all_reduce(loss, group=group)  # the global mean: every rank's share, summed
        return loss

    hooks = {}
    if group is not None:
        hooks = dict(sync_grads=lambda m: all_reduce_flat([p.grad for p in m.parameters()], group), sync_loss=sum_loss)
    tracer = trace.current()
    first = len(tracer.spans) if tracer is not None else 0
    result = train(setup, model=model, batch=batch, device=device, progress=progress, **hooks)
    spans = tracer.spans[first:] if tracer is not None else []
    calls = setup.config().n_layers * setup.steps
    return CPResult(
        **vars(result),
        blocks=[b for b in log if b["pass_"] == "forward"][: len(log) // (2 * calls)] if log else [],
        block_seconds=sum(s.duration for s in spans if s.name.startswith("ring block")),
        sent_per_step=bytes_by_op(spans, per=setup.steps),
    )


def on_rank(
    ctx, setup: TrainSetup, *, variant: str = "ring", zigzag: bool = False, causal: bool = True, dtype=torch.float32
) -> CPResult:
    """Rank function: train with the sequence split over the ``cp`` axis of every rank."""
    group = ctx.mesh_for(ParallelDims(cp=ctx.world_size)).group("cp")
    return train_cp(
        setup,
        group=group,
        variant=variant,
        zigzag=zigzag,
        causal=causal,
        device=ctx.device,
        dtype=dtype,
        progress=ctx.progress,
    )


# ---- checks, the reference and the prediction ---------------------------------------------------
def check(setup: TrainSetup, n: int, variant: str, zigzag: bool) -> None:
    """Clear errors before any rank starts: layout, heads for Ulysses, the variant's name."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    theory.check_layout(setup.seq_len, n, zigzag)
    cfg = setup.config()
    if cfg.is_moe:
        raise ValueError(
            f"{cfg.name} is a mixture of experts; this chapter's CP forward is for dense models "
            "(its loss has no load-balancing term): use gpt-tiny or gpt-small"
        )
    if variant == "ulysses":
        theory.check_ulysses(n, cfg.n_heads, cfg.kv_heads)


def reference(setup: TrainSetup, causal: bool = True) -> TrainResult:
    """The single-process run to compare with: the model's own forward when causal, else the
    same pieces with unmasked attention on the whole sequence."""
    return single_process(setup) if causal else train_cp(setup, causal=False)


def predicted_memory(setup: TrainSetup, n: int, variant: str, causal: bool = True) -> dict[str, float]:
    """Bytes per rank by category: fp32 AdamW model state (replicated) and this variant's activations."""
    cfg = setup.config()
    state = model_state_bytes(cfg.num_params(), precision="fp32", n_tensors=cfg.num_param_tensors())
    acts = theory.cp_activation_bytes(
        cfg, seq_len=setup.seq_len, micro_batch=setup.global_batch, cp=n, variant=variant, causal=causal
    )
    return {"params": state.params, "grads": state.grads, "optimizer": state.optimizer, "activations": float(acts)}


# ---- playbook run cp ----------------------------------------------------------------------------
@dataclass
class CPReport(RunReport):
    """``RunReport`` plus ``work``: ring blocks per rank per attention call, measured and predicted."""

    work: dict = field(default_factory=dict)

    def summary(self) -> str:
        lines = [super().summary()]
        if self.work:
            lines.append(
                f"  ring blocks per rank per attention call ({self.work['layout']}): "
                f"predicted {self.work['predicted']}, measured {self.work['measured']}"
            )
        return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--variant", default="ring", choices=list(VARIANTS), help="how queries see remote keys")
    parser.add_argument(
        "--zigzag", action="store_true", help="2n chunks, rank i holds i and 2n-1-i (balances causal work)"
    )


def predict(setup: TrainSetup, *, world_size: int, variant: str = "ring") -> dict[str, float]:
    """Bytes one rank sends per step by collective (``theory.cp.comm_bytes_per_step``)."""
    return theory.comm_bytes_per_step(
        setup.config(), seq_len=setup.seq_len, micro_batch=setup.global_batch, cp=world_size, variant=variant
    )


@register(
    "cp",
    help="context parallel: ring / all-gather / Ulysses attention over a sharded sequence",
    arguments=add_arguments,
    on_rank=on_rank,
    predict=predict,
)
def run_cp(
    setup: TrainSetup,
    *,
    world_size: int,
    backend: str = "auto",
    launch=launch,
    variant: str = "ring",
    zigzag: bool = False,
) -> CPReport:
    check(setup, world_size, variant, zigzag)
    backend = default_backend(world_size) if backend == "auto" else backend
    results = launch(on_rank, world_size, setup, variant=variant, zigzag=zigzag, backend=backend)
    measured = {k: results[0].memory[k] for k in ("params", "grads", "activations", "optimizer")}
    work = {}
    if variant == "ring":
        work = {
            "layout": "zig-zag" if zigzag else "contiguous",
            "predicted": theory.ring_blocks_per_rank(world_size, zigzag),
            "measured": [len(r.blocks) for r in results],
        }
    return CPReport(
        strategy="cp",
        world_size=world_size,
        backend=backend,
        parity=against_single(results[0], setup),  # causal: ``reference(setup)`` is the single process
        memory={"predicted": predicted_memory(setup, world_size, variant), "measured": measured},
        comm={
            "predicted": predict(setup, world_size=world_size, variant=variant),
            "measured": results[0].sent_per_step,
        },
        setup={**setup.as_dict(), "variant": variant, "zigzag": zigzag},
        losses=results[0].losses,
        work=work,
    )
