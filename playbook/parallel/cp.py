"""Context parallelism (CP): split every sequence across n ranks, so each holds s/n tokens.

Why: activations grow with the sequence (and attention's with its square), while data, tensor and
pipeline parallelism leave each rank holding whole sequences. With CP every tensor outside
attention is simply 1/n as long; attention is the one place where a token needs the others, and
``playbook.parallel.ring_attention`` supplies it three ways (ring, all-gather, Ulysses).

The rest of the model is threaded through unchanged:
- RoPE rotates each token by its *global* position (``positions``, from
  ``playbook.theory.cp.shard_positions``: contiguous, or zig-zag chunks i and 2n−1−i);
- the loss is the sum of cross-entropies over this rank's tokens divided by the global token
  count, so the n ranks' losses (and gradients) add up to the single-process mean;
- the weights are replicated (CP is data parallelism over tokens for everything but attention),
  so after backward their gradients are summed over the CP ranks with one all-reduce.

Ring attention: Liu et al. 2023, arXiv:2310.01889; zig-zag balance: Llama 3 (Dubey et al. 2024,
arXiv:2407.21783, §3.3.2); Ulysses: Jacobs et al. 2023 (arXiv:2309.14509).
PyTorch's own ``torch.distributed.tensor.experimental.context_parallel`` (in torch 2.13 by default
an all-gather of K/V with "head-tail" load balancing, i.e. our zig-zag layout) runs only on CUDA
SDPA kernels (FEASIBILITY.md: no CPU path), so the from-scratch version is the one checked here.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

from playbook.cluster import default_backend, launch
from playbook.measure.memory import SavedActivations, gradient_bytes, optimizer_bytes, parameter_bytes
from playbook.measure.trace import bytes_by_op
from playbook.model import GPT
from playbook.parallel.registry import register
from playbook.parallel.report import RunReport, compare
from playbook.parallel.ring_attention import VARIANTS, attention
from playbook.parallel.training import TrainResult, TrainSetup, train
from playbook.theory import cp as theory
from playbook.theory.memory import model_state_bytes


# ---- the model, one shard of the sequence at a time -------------------------------------------
def cp_attention_fn(variant: str, group, *, zigzag: bool, causal: bool = True, positions=None, log=None):
    """A function (q, k, v) -> out for this rank's shard. ``group=None``: one process, plain
    attention at ``positions`` (the reference)."""
    if group is None:
        return lambda q, k, v: attention(q, k, v, positions, positions, causal)
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    extra = {"log": log} if variant == "ring" else {}
    return lambda q, k, v: VARIANTS[variant](q, k, v, group, zigzag=zigzag, causal=causal, **extra)


def cp_loss(model: GPT, tokens, targets, positions, total_tokens: int) -> torch.Tensor:
    """This rank's share of the global mean loss: Σ cross-entropy over its tokens / all tokens.
    tokens, targets [batch, s/n] int64; positions [s/n] int64 (global). The model's attention
    cores must already be the CP ones (``use_attention``)."""
    logits = model(tokens, positions=positions)  # [batch, s/n, vocab]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum") / total_tokens


def use_attention(model, attend) -> None:
    """Swap every block's attention core (q, k, v) -> out for ``attend``, in place."""
    for block in model.blocks:
        block.attn.core = attend


def sum_over(group, model: torch.nn.Module) -> None:
    """Sum every gradient over the CP ranks: one all-reduce of one flat buffer."""
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])  # [num_params]
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


@dataclass
class CPResult(TrainResult):
    """A ``TrainResult`` plus what CP adds: ring blocks this rank computed in one attention
    forward (a list of dicts), seconds inside ring blocks (forward + backward, every call),
    bytes sent per step by op."""

    blocks: list[dict] = field(default_factory=list)
    block_seconds: float = 0.0
    sent_per_step: dict[str, float] = field(default_factory=dict)


def train_cp(setup: TrainSetup, *, group=None, variant: str = "ring", zigzag: bool = False, causal: bool = True,
             device="cpu", dtype=torch.float32, progress=None) -> CPResult:  # fmt: skip
    """Train ``setup`` with each sequence split over the ranks of ``group`` (None: one process,
    the whole sequence). Same model, data and AdamW as ``training.train``, so the two compare.
    ``dtype=torch.float64`` takes rounding out of a parity check."""
    from playbook.measure import trace

    rank, n = (dist.get_rank(group), dist.get_world_size(group)) if group is not None else (0, 1)
    cfg = setup.config()
    check(setup, n, variant, zigzag)
    model = GPT(cfg, seed=setup.seed).to(device=device, dtype=dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=setup.lr)
    positions = torch.tensor(theory.shard_positions(setup.seq_len, n, rank, zigzag), device=device)  # [s/n]
    log: list[dict] = []
    use_attention(model, cp_attention_fn(variant, group, zigzag=zigzag, causal=causal, positions=positions, log=log))
    losses, grads, memory = [], {}, {}
    for step in range(setup.steps):
        tokens, targets = setup.task().batch(step, setup.global_batch, setup.seq_len, device=device)  # [B, s]
        tokens, targets = tokens[:, positions], targets[:, positions]  # [B, s/n]: this rank's tokens
        optimizer.zero_grad(set_to_none=True)
        with SavedActivations(model) if step == 0 else nullcontext() as saved:
            loss = cp_loss(model, tokens, targets, positions, setup.global_batch * setup.seq_len)
        loss.backward()
        loss = loss.detach()
        if group is not None:
            sum_over(group, model)
            dist.all_reduce(loss, group=group)  # the global mean: every rank's share, summed
        if step == 0:
            grads = {k: p.grad.detach().cpu().clone() for k, p in model.named_parameters()}
            memory = {"params": parameter_bytes(model), "grads": gradient_bytes(model), "activations": saved.bytes}
        optimizer.step()
        if step == 0:
            memory["optimizer"] = optimizer_bytes(optimizer)
        losses.append(float(loss))
        if progress is not None:
            progress(step + 1, setup.steps)
    tracer = trace.current()
    spans = tracer.spans if tracer is not None else []
    calls = cfg.n_layers * setup.steps
    sent = bytes_by_op(spans, per=setup.steps)
    return CPResult(
        losses, grads, {k: p.detach().cpu().clone() for k, p in model.named_parameters()}, memory,
        blocks=[b for b in log if b["pass_"] == "forward"][: len(log) // (2 * calls)] if log else [],
        block_seconds=sum(s.duration for s in spans if s.name.startswith("ring block")),
        sent_per_step=sent,
    )  # fmt: skip


def check(setup: TrainSetup, n: int, variant: str, zigzag: bool) -> None:
    """Clear errors before any rank starts: layout, heads for Ulysses, the variant's name."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    theory.check_layout(setup.seq_len, n, zigzag)
    cfg = setup.config()
    if cfg.is_moe:
        raise ValueError(f"{cfg.name} is a mixture of experts; this chapter's CP forward is for dense models "
                         "(its loss has no load-balancing term): use gpt-tiny or gpt-small")  # fmt: skip
    if variant == "ulysses":
        theory.check_ulysses(n, cfg.n_heads, cfg.kv_heads)


def reference(setup: TrainSetup, causal: bool = True) -> TrainResult:
    """The single-process run to compare with: the model's own forward when causal, else the
    same pieces with unmasked attention on the whole sequence."""
    return train(setup) if causal else train_cp(setup, causal=False)


def predicted_memory(setup: TrainSetup, n: int, variant: str, causal: bool = True) -> dict[str, float]:
    """Bytes per rank by category: fp32 AdamW model state (replicated) and this variant's activations."""
    cfg = setup.config()
    state = model_state_bytes(cfg.num_params(), precision="fp32", n_tensors=cfg.num_param_tensors())
    acts = theory.cp_activation_bytes(cfg, seq_len=setup.seq_len, micro_batch=setup.global_batch, cp=n, variant=variant,
                                       causal=causal)  # fmt: skip
    return {"params": state.params, "grads": state.grads, "optimizer": state.optimizer, "activations": float(acts)}


# ---- on real ranks ------------------------------------------------------------------------------
def cp_rank(ctx, setup: TrainSetup, variant: str = "ring", zigzag: bool = False, causal: bool = True,
            dtype=torch.float32) -> CPResult:  # fmt: skip
    """Rank function: train with the sequence split over all ranks of ``ctx.group``."""
    return train_cp(setup, group=ctx.group, variant=variant, zigzag=zigzag, causal=causal,
                    device=ctx.device, dtype=dtype, progress=ctx.progress)  # fmt: skip


def attention_work(ctx, *, seq_len: int, zigzag: bool, causal: bool = True, batch: int = 1, heads: int = 4,
                   kv_heads: int = 4, head_dim: int = 32, repeats: int = 3, warmup: int = 1) -> dict:  # fmt: skip
    """Ring attention alone, forward + backward on random data. Returns the blocks this rank
    computed in one forward (the kernel's own log), their score elements, and per pass (mean of
    ``repeats`` after ``warmup`` untimed passes, forward + backward) the seconds inside ring blocks:
    ``seconds`` wall time (from the tracer's spans), ``cpu_seconds`` this rank's CPU time, which does
    not count time the OS gave to other ranks (n ranks on fewer cores)."""
    gen = torch.Generator().manual_seed(ctx.rank)
    shard = seq_len // ctx.world_size
    q = torch.randn(batch, heads, shard, head_dim, generator=gen).to(ctx.device).requires_grad_()  # [b, a, s/n, d]
    k = torch.randn(batch, kv_heads, shard, head_dim, generator=gen).to(ctx.device).requires_grad_()  # [b, g, s/n, d]
    v = torch.randn(batch, kv_heads, shard, head_dim, generator=gen).to(ctx.device).requires_grad_()  # [b, g, s/n, d]
    log: list[dict] = []
    for i in range(warmup + repeats):
        if i == warmup:
            log.clear()
            first_timed = len(ctx.tracer.spans)
        VARIANTS["ring"](q, k, v, ctx.group, zigzag=zigzag, causal=causal, log=log).sum().backward()
    spans = [s for s in ctx.tracer.spans[first_timed:] if s.name.startswith("ring block")]
    forward = [b for b in log if b["pass_"] == "forward"][: len(log) // (2 * repeats)]
    return {"blocks": forward, "elements": sum(b["rows"] * b["cols"] for b in forward),
            "seconds": sum(s.duration for s in spans) / repeats,
            "cpu_seconds": sum(b["cpu_seconds"] for b in log) / repeats}  # fmt: skip


# ---- playbook run cp ----------------------------------------------------------------------------
@dataclass
class CPReport(RunReport):
    """``RunReport`` plus ``work``: ring blocks per rank per attention call, measured and predicted."""

    work: dict = field(default_factory=dict)

    def summary(self) -> str:
        lines = [super().summary()]
        if self.work:
            lines.append(f"  ring blocks per rank per attention call ({self.work['layout']}): "
                         f"predicted {self.work['predicted']}, measured {self.work['measured']}")  # fmt: skip
        return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--variant", default="ring", choices=list(VARIANTS), help="how queries see remote keys")
    parser.add_argument("--zigzag", action="store_true", help="2n chunks, rank i holds i and 2n-1-i (balances causal work)")


@register("cp", help="context parallel: ring / all-gather / Ulysses attention over a sharded sequence", arguments=add_arguments)
def run_cp(setup: TrainSetup, *, world_size: int, backend: str = "auto", variant: str = "ring", zigzag: bool = False) -> CPReport:
    check(setup, world_size, variant, zigzag)
    backend = default_backend(world_size) if backend == "auto" else backend
    results = launch(cp_rank, world_size, setup, variant, zigzag, backend=backend)
    cfg = setup.config()
    comm = theory.comm_bytes_per_step(cfg, seq_len=setup.seq_len, micro_batch=setup.global_batch, cp=world_size, variant=variant)
    work = {}
    if variant == "ring":
        work = {"layout": "zig-zag" if zigzag else "contiguous",
                "predicted": theory.ring_blocks_per_rank(world_size, zigzag),
                "measured": [len(r.blocks) for r in results]}  # fmt: skip
    return CPReport(
        strategy="cp",
        world_size=world_size,
        backend=backend,
        parity=compare(results[0], reference(setup)),
        memory={"predicted": predicted_memory(setup, world_size, variant), "measured": results[0].memory},
        comm={"predicted": comm, "measured": results[0].sent_per_step},
        setup={**setup.as_dict(), "variant": variant, "zigzag": zigzag},
        losses=results[0].losses,
        work=work,
    )
