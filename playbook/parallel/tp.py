"""Tensor parallelism (Megatron-LM) and sequence parallelism, from scratch: ``playbook run tp``.

The idea (Shoeybi et al. 2019, "Megatron-LM", arXiv:1909.08053, §3). Split a weight by columns and
each rank computes its own slice of the output, with no communication: Y_i = X A_i (column
parallel). Feed that slice to a weight split by rows and each rank has a partial sum of the result:
Z = Σ_i Y_i B_i, one all-reduce (row parallel). A transformer layer is two such pairs: attention
(q, k, v column parallel by heads, o row parallel) and the SwiGLU MLP (gate, up column, down row).
Two conjugate operators mark each parallel region:

    f: identity forward, all-reduce backward   (enters a region: the input's gradient is partial)
    g: all-reduce forward, identity backward   (leaves a region: the output is partial)

so a layer costs 2 all-reduces of the [b, s, h] activation forward and 2 backward,
8bsh(t−1)/t bytes per rank per direction in 16-bit (``playbook.theory.tp``).

Sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198, §4.2.2): an all-reduce is a
reduce-scatter followed by an all-gather. Keep the residual stream and the norms on sequence shards
[b, s/t, h], all-gather where a region starts and reduce-scatter where it ends (and the reverse in
backward): the same bytes, and the activations outside the regions are divided by t. The gathered
input of a region is still saved whole for the weight gradients, unless ``regather=True`` saves
its shard and all-gathers it again in backward, as Megatron-LM does (one more all-gather per
region in backward; then every saved tensor of a block is divided by t).

The vocabulary is split too: the embedding by rows (a rank looks up the tokens it owns, zeros the
rest, and g sums), the output head by columns, and the cross-entropy is computed from the logit
shards with two small all-reduces, so the [b, s, V] logits never exist on one rank.

Layout of this file: collectives, the conjugate operators, a ``Region`` (how one attention or MLP
block is entered and left), the parallel layers, the model sliced from the reference, training on
real ranks and ``playbook run tp``, and a matmul-throughput probe for "when TP stops paying".

Every collective is a traced ``torch.distributed`` call inside our own ``autograd.Function``
(FEASIBILITY.md: ``torch.distributed.nn.functional.all_gather`` returned wrong gradients on gloo
for non-contiguous inputs), and sends ``.contiguous()`` buffers. Each runs inside a labelled span
(``tp:<region>:<phase>``) so the chapter can attribute the traced collectives to layers.
PyTorch's own DTensor version is in ``playbook/parallel/tp_dtensor.py``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from playbook.cluster import default_backend, launch
from playbook.model import GPT, RECOMPUTE_MODES, Attention
from playbook.parallel.comm import (  # noqa: F401  (the chapter imports these from here)
    CopyToModelParallelRegion, GatherFromSequenceParallelRegion, ReduceFromModelParallelRegion,
    ReduceScatterToSequenceParallelRegion, all_gather, all_reduce, f, g, reduce_scatter,
)
from playbook.parallel.registry import register
from playbook.parallel.report import RunReport, compare
from playbook.parallel.training import TrainResult, TrainSetup, train
from playbook.theory.tp import check_tp, step_collectives, summarize, tp_training_memory




class LinearsWithSequenceParallelRegather(torch.autograd.Function):
    """SP as Megatron-LM runs it (Korthikanti et al. 2022, §4.2.2 and Table 2's TP+SP row): all-gather
    the sequence shard, apply the column-parallel weights, but save only the *shard*; backward
    all-gathers it again for the weight gradients, then reduce-scatters the input gradient. One more
    all-gather per region in backward buys s/t instead of s tokens of saved region input."""

    @staticmethod
    def forward(ctx, x, region, *weights):
        full = all_gather(x, 1, region.group, region.label, "forward")  # [b, s, h], not saved
        ctx.region = region
        ctx.save_for_backward(x, *weights)  # x: [b, s/t, h]
        return tuple(F.linear(full, w) for w in weights)  # each [b, s, out/t]

    @staticmethod
    def backward(ctx, *grads):
        x, *weights = ctx.saved_tensors
        full = all_gather(x, 1, ctx.region.group, ctx.region.label, "backward")  # [b, s, h] again
        flat = full.reshape(-1, full.shape[-1])  # [b*s, h]
        grad_w = [gy.reshape(-1, gy.shape[-1]).t() @ flat for gy in grads]  # each [out/t, h]
        grad_full = sum(gy @ w for gy, w in zip(grads, weights))  # [b, s, h], this rank's share
        return reduce_scatter(grad_full, 1, ctx.region.group, ctx.region.label, "backward"), None, *grad_w


@dataclass(frozen=True)
class Region:
    """One parallel region (a layer's attention or MLP, or the head): how it is entered and left.
    ``sequence_parallel``: all-gather / reduce-scatter instead of f / g; ``regather``: with SP, save
    only the sequence shard of the region's input and all-gather it again in backward."""

    group: object
    sequence_parallel: bool
    regather: bool
    label: str

    def columns(self, x: torch.Tensor, *layers) -> list[torch.Tensor]:
        """Enter the region once and apply every column-parallel layer that reads its input
        (q, k, v; gate, up; the head): their input gradients are summed before f's all-reduce."""
        if self.sequence_parallel and self.regather:
            return list(LinearsWithSequenceParallelRegather.apply(x, self, *[layer.weight for layer in layers]))
        op = GatherFromSequenceParallelRegion if self.sequence_parallel else CopyToModelParallelRegion
        x = op.apply(x, self.group, self.label)  # [b, s, h] on every rank
        return [layer(x) for layer in layers]  # each [b, s, out/t]

    def leave(self, y: torch.Tensor) -> torch.Tensor:
        """g (TP), or reduce-scatter to sequence shards (SP): partial [b, s, h] -> [b, s or s/t, h]."""
        op = ReduceScatterToSequenceParallelRegion if self.sequence_parallel else ReduceFromModelParallelRegion
        return op.apply(y, self.group, self.label)


# ---- parallel layers ----------------------------------------------------------------------------
def shard(weight: torch.Tensor, dim: int, rank: int, t: int) -> torch.Tensor:
    """This rank's contiguous 1/t of ``weight`` along ``dim`` (a copy)."""
    return weight.detach().chunk(t, dim)[rank].clone()


class ColumnParallelLinear(nn.Module):
    """Y_i = X A_iᵀ with this rank's out_features/t rows of the [out, in] weight. No communication:
    ``Region.columns`` enters the region once for all column layers that share an input (q, k, v;
    gate, up), so their input gradients are summed locally and all-reduced once."""

    shard_dim = 0

    def __init__(self, weight_shard: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight_shard)  # [out/t, in]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)  # [..., out/t]


class RowParallelLinear(nn.Module):
    """Z = Σ_i Y_i B_iᵀ with this rank's in_features/t columns; the partial sum leaves the region
    through g (all-reduce) or, with SP, a reduce-scatter to sequence shards."""

    shard_dim = 1

    def __init__(self, weight_shard: torch.Tensor, region: Region):
        super().__init__()
        self.weight = nn.Parameter(weight_shard)  # [out, in/t]
        self.region = region

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        partial = F.linear(y, self.weight)  # [b, s, out], this rank's share of the sum
        return self.region.leave(partial)  # [b, s or s/t, out]


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + V/t) of the embedding. A rank looks up the tokens it owns, writes zeros
    for the others, and the sum over ranks (g, or a reduce-scatter with SP) is the full embedding."""

    shard_dim = 0

    def __init__(self, weight_shard: torch.Tensor, start: int, region: Region):
        super().__init__()
        self.weight = nn.Parameter(weight_shard)  # [V/t, h]
        self.start, self.region = start, region

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        outside = (tokens < self.start) | (tokens >= self.start + self.weight.shape[0])  # [b, s] bool
        local = (tokens - self.start).masked_fill(outside, 0)  # [b, s] row index in this shard
        x = F.embedding(local, self.weight).masked_fill(outside[..., None], 0.0)  # [b, s, h]
        return self.region.leave(x)  # [b, s or s/t, h]


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy from logit shards [b, s, V/t] (Megatron-LM's vocab-parallel loss).

    loss = log Σ_v exp(z_v − m) − (z_target − m), with the max m, the sum and the target logit each
    combined over ranks by all-reduce (max; then one sum of [Σexp, target logit]). Backward needs no
    communication: d loss / d z = (softmax − onehot) / (b·s) on this rank's slice.
    """

    @staticmethod
    def forward(ctx, logits, targets, start, group):
        n = logits.shape[-1]  # V/t
        m = all_reduce(logits.amax(-1), group, "loss", "forward", op=dist.ReduceOp.MAX)  # [b, s]
        shifted = logits - m[..., None]  # [b, s, V/t]
        exp = shifted.exp()  # [b, s, V/t]
        outside = (targets < start) | (targets >= start + n)  # [b, s]
        local = (targets - start).masked_fill(outside, 0)  # [b, s]
        target_logit = shifted.gather(-1, local[..., None])[..., 0].masked_fill(outside, 0.0)  # [b, s]
        sums = all_reduce(torch.stack([exp.sum(-1), target_logit]), group, "loss", "forward")  # [2, b, s]
        probs = exp.div_(sums[0][..., None])  # [b, s, V/t], softmax over the whole vocabulary
        ctx.save_for_backward(probs, targets)
        ctx.start = start
        return (sums[0].log() - sums[1]).mean()

    @staticmethod
    def backward(ctx, grad):
        probs, targets = ctx.saved_tensors
        n = probs.shape[-1]
        inside = ((targets >= ctx.start) & (targets < ctx.start + n)).to(probs.dtype)  # [b, s]
        local = (targets - ctx.start).clamp(0, n - 1)  # [b, s]
        dz = probs.clone().scatter_add_(-1, local[..., None], -inside[..., None])  # [b, s, V/t]
        return dz * (grad / targets.numel()), None, None, None


# ---- the model, cut from the reference GPT ------------------------------------------------------
class TPAttention(Attention):
    """Heads split over ranks: a/t query heads and g/t key/value heads each (t must divide g).
    The reference ``Attention.forward`` runs unchanged on the local head counts; only ``project``
    differs: q, k and v enter the parallel region once."""

    def __init__(self, ref, rank, t, region: Region):
        nn.Module.__init__(self)
        self.n_heads, self.kv_heads, self.head_dim, self.region = ref.n_heads // t, ref.kv_heads // t, ref.head_dim, region
        self.q_proj = ColumnParallelLinear(shard(ref.q_proj.weight, 0, rank, t))  # [a/t*d, h]
        self.k_proj = ColumnParallelLinear(shard(ref.k_proj.weight, 0, rank, t))  # [g/t*d, h]
        self.v_proj = ColumnParallelLinear(shard(ref.v_proj.weight, 0, rank, t))  # [g/t*d, h]
        self.o_proj = RowParallelLinear(shard(ref.o_proj.weight, 1, rank, t), region)  # [h, a/t*d]
        self.rope = copy.deepcopy(ref.rope)
        self.recompute_core, self.core = False, ref.core

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.region.columns(x, self.q_proj, self.k_proj, self.v_proj)  # [b, s, (a or g)/t*d]
        return q, k, v


class TPSwiGLU(nn.Module):
    """gate and up split by ffn channel (column), down by the same channels (row)."""

    def __init__(self, ref, rank, t, region: Region):
        super().__init__()
        self.region = region
        self.gate_proj = ColumnParallelLinear(shard(ref.gate_proj.weight, 0, rank, t))  # [f/t, h]
        self.up_proj = ColumnParallelLinear(shard(ref.up_proj.weight, 0, rank, t))  # [f/t, h]
        self.down_proj = RowParallelLinear(shard(ref.down_proj.weight, 1, rank, t), region)  # [h, f/t]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.region.columns(x, self.gate_proj, self.up_proj)  # [b, s, f/t] each
        return self.down_proj(F.silu(gate) * up)  # [b, s or s/t, h]


class TPBlock(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x)); x is [b, s, h] (TP) or [b, s/t, h] (SP). Each of
    attn and mlp is one parallel region: it enters on its column layers and leaves on its row layer."""

    def __init__(self, ref, rank, t, i, **mode):
        super().__init__()
        self.attn_norm, self.mlp_norm = copy.deepcopy(ref.attn_norm), copy.deepcopy(ref.mlp_norm)
        self.attn = TPAttention(ref.attn, rank, t, Region(label=f"layer{i}.attn", **mode))
        self.mlp = TPSwiGLU(ref.mlp, rank, t, Region(label=f"layer{i}.mlp", **mode))

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), positions)
        return x + self.mlp(self.mlp_norm(x))


class TPGPT(nn.Module):
    """Our GPT cut into t tensor-parallel shards, this rank's shard built by slicing ``ref``'s weights.

    Parameter names equal the reference's (``blocks.0.attn.q_proj.weight`` ...), each holding this
    rank's slice along ``shard_dims(model)[name]`` (None: replicated). ``model(tokens, targets)``
    returns (logit shard [b, s, V/t], loss), every rank the same loss. ``sequence_parallel``: norms
    and residual stream on sequence shards; ``regather`` (with SP): Megatron-LM's memory saving,
    see :class:`LinearsWithSequenceParallelRegather`.
    """

    def __init__(self, ref: GPT, group, *, sequence_parallel: bool = False, regather: bool = False,
                 recompute: str = "none"):  # fmt: skip
        super().__init__()
        if recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
        cfg, rank, t = ref.cfg, dist.get_rank(group), dist.get_world_size(group)
        if cfg.is_moe:
            raise NotImplementedError("TPGPT splits the dense SwiGLU MLP; experts are split by the expert-parallel chapter")
        if regather and not sequence_parallel:
            raise ValueError("regather saves sequence shards, so it needs sequence_parallel=True")
        check_tp(cfg, t)
        self.cfg, self.group, self.sp, self.vocab_start = cfg, group, sequence_parallel, rank * cfg.vocab_size // t
        mode = dict(group=group, sequence_parallel=sequence_parallel, regather=regather)
        self.tok_emb = VocabParallelEmbedding(shard(ref.tok_emb.weight, 0, rank, t), self.vocab_start,
                                              Region(label="embedding", **mode))  # fmt: skip
        self.blocks = nn.ModuleList(TPBlock(b, rank, t, i, **mode) for i, b in enumerate(ref.blocks))
        self.norm = copy.deepcopy(ref.norm)
        self.lm_head = ColumnParallelLinear(shard(ref.lm_head.weight, 0, rank, t))  # [V/t, h]
        self.head_region = Region(label="head", **mode)
        self.recompute = recompute  # "full": each block's forward, collectives included, reruns in backward
        for block in self.blocks:
            block.attn.recompute_core = recompute == "selective"
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight  # both split by vocabulary rows: tying still holds

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [b, s] -> [b, s, h] (TP) or [b, s/t, h] (SP)."""
        check_tp(self.cfg, dist.get_world_size(self.group), seq_len=tokens.shape[1], sequence_parallel=self.sp)
        return self.tok_emb(tokens)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and the column-parallel head: logit shard [b, s, V/t]."""
        (logits,) = self.head_region.columns(self.norm(x), self.lm_head)  # [b, s, V/t]
        return logits

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy from the logit shards (vocab-parallel): the same on every rank."""
        return VocabParallelCrossEntropy.apply(logits, targets, self.vocab_start, self.group)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None, *, positions=None):
        x = self.embed(tokens)  # [b, s, h] (TP) or [b, s/t, h] (SP)
        for block in self.blocks:
            if self.recompute == "full" and torch.is_grad_enabled():
                x = checkpoint(block, x, positions, use_reentrant=False)  # same shape
            else:
                x = block(x, positions)  # same shape
        logits = self.head(x)  # [b, s, V/t]
        if targets is None:
            return logits
        return logits, self.loss(logits, targets)


def shard_dims(model: nn.Module) -> dict[str, int | None]:
    """Parameter name -> the dim it is split along (0 or 1), None if replicated."""
    owner = {id(p): getattr(m, "shard_dim", None) for m in model.modules() for p in m.parameters(recurse=False)}
    return {n: owner[id(p)] for n, p in model.named_parameters()}


def sync_replicated_grads(model: nn.Module, group) -> None:
    """SP only: each rank's norm weights saw s/t of the tokens; sum their gradients in one all-reduce."""
    dims = shard_dims(model)
    grads = [p.grad for n, p in model.named_parameters() if dims[n] is None]
    flat = all_reduce(torch.cat([x.reshape(-1) for x in grads]), group, "grad sync", "step")
    for x, y in zip(grads, flat.split([x.numel() for x in grads])):
        x.copy_(y.view_as(x))


def unshard(per_rank: list[dict[str, torch.Tensor]], dims: dict[str, int | None]) -> dict[str, torch.Tensor]:
    """Full tensors from every rank's slices (concatenated in rank order along their dim)."""
    return {n: per_rank[0][n] if d is None else torch.cat([r[n] for r in per_rank], d) for n, d in dims.items()}


# ---- training on real ranks ---------------------------------------------------------------------
def train_loop(model, setup: TrainSetup, device, *, after_backward=None, **hooks) -> TrainResult:
    """``parallel.training.train`` on a model built elsewhere, every tensor-parallel rank seeing the
    whole global batch; ``after_backward`` is its ``sync_grads`` (kept for the chapter's calls)."""
    return train(setup, model=model, device=device, sync_grads=after_backward, **hooks)


_OP = {"all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
       "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter"}  # fmt: skip


def measured_collectives(spans, step: int = 0) -> list[dict]:
    """The collectives of training step ``step`` on one rank, each attributed to the labelled
    ``tp:<region>:<phase>`` span it ran in: ``[{region, phase, op, bytes, sent_bytes}, ...]`` in order.
    ``spans``: a tracer's spans, or the dicts of ``Ranks.last_trace`` for one rank."""
    spans = [s if isinstance(s, dict) else s.as_dict() for s in spans]
    window = next(s for s in spans if s["kind"] == "compute" and s["name"] == f"step {step}")
    labels = [s for s in spans if s["kind"] == "compute" and s["name"].startswith("tp:")]
    out = []
    for c in spans:
        if c["kind"] != "comm" or not window["start"] <= c["start"] <= window["end"]:
            continue
        inside = [s for s in labels if s["start"] <= c["start"] and c["end"] <= s["end"]]
        _, region, phase = max(inside, key=lambda s: s["start"])["name"].split(":") if inside else ("", "?", "?")
        out.append({"region": region, "phase": phase, "op": _OP.get(c["name"], c["name"]),
                    "bytes": c["bytes"], "sent_bytes": c["sent_bytes"]})  # fmt: skip
    return out


def train_tp(ctx, setup: TrainSetup, sequence_parallel: bool = False, regather: bool = False,
             recompute: str = "none"):  # fmt: skip
    """Rank function: build this rank's shard from the reference GPT, train, and return
    (TrainResult of this rank's slices, shard dims, the collectives of step 0)."""
    model = TPGPT(GPT(setup.config(), seed=setup.seed).to(ctx.device), ctx.group,
                  sequence_parallel=sequence_parallel, regather=regather, recompute=recompute)  # fmt: skip
    sync = (lambda m: sync_replicated_grads(m, ctx.group)) if sequence_parallel else None
    result = train_loop(model, setup, ctx.device, after_backward=sync, progress=ctx.progress)
    return result, shard_dims(model), measured_collectives(ctx.tracer.spans)


def gather_result(per_rank) -> TrainResult:
    """One TrainResult with full tensors from the ranks' (result, dims, ...) answers; rank 0's memory."""
    results, dims = [r[0] for r in per_rank], per_rank[0][1]
    return TrainResult(results[0].losses, unshard([r.grads for r in results], dims),
                       unshard([r.params for r in results], dims), results[0].memory)  # fmt: skip


def _on_rank(ctx, setup, sequence_parallel, native, regather=False, recompute="none"):
    ours = train_tp(ctx, setup, sequence_parallel, regather, recompute)
    if not native:
        return ours, None
    from playbook.parallel.tp_dtensor import train_dtensor

    return ours, train_dtensor(ctx, setup, sequence_parallel)


def _add_arguments(parser) -> None:
    parser.add_argument("--sequence-parallel", action="store_true", help="sequence parallelism (Korthikanti et al. 2022)")
    parser.add_argument("--regather", action="store_true",
                        help="with --sequence-parallel: save sequence shards, all-gather again in backward (Megatron-LM)")
    parser.add_argument("--recompute", default="none", choices=list(RECOMPUTE_MODES),
                        help="activation recomputation: selective (attention core) or full (each block)")
    parser.add_argument("--no-native", dest="native", action="store_false", help="skip the DTensor counterpart")


@register("tp", help="Megatron tensor parallelism (+ --sequence-parallel), from scratch and with DTensor",
          arguments=_add_arguments)
def run_tp(setup: TrainSetup, *, world_size: int, backend: str = "auto", sequence_parallel: bool = False,
           regather: bool = False, recompute: str = "none", native: bool = True) -> RunReport:  # fmt: skip
    """t = world_size tensor-parallel ranks on the whole global batch, against the single process."""
    cfg = setup.config()
    check_tp(cfg, world_size, seq_len=setup.seq_len, sequence_parallel=sequence_parallel, regather=regather)
    backend = default_backend(world_size) if backend == "auto" else backend
    answers = launch(_on_rank, world_size, setup, sequence_parallel, native, regather, recompute, backend=backend)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like one rank: several threads on a busy 2-core machine run 10-30x slower
    try:
        reference = train(setup)
    finally:
        torch.set_num_threads(threads)
    ours = gather_result([a[0] for a in answers])
    sizes = dict(seq_len=setup.seq_len, micro_batch=setup.global_batch, tp=world_size,
                 sequence_parallel=sequence_parallel, regather=regather, recompute=recompute)  # fmt: skip
    predicted = summarize(step_collectives(cfg, **sizes), by=("op",))
    measured = summarize(answers[0][0][2], by=("op",))
    return RunReport(
        strategy=("tp+sp" + ("+regather" if regather else "")) if sequence_parallel else "tp",
        world_size=world_size,
        backend=backend,
        parity=compare(ours, reference),
        native=compare(answers[0][1], reference, "DTensor parallelize_module, same global batch") if native else None,
        memory={"predicted": tp_training_memory(cfg, **sizes, n_tensors=cfg.num_param_tensors()).as_dict(),
                "measured": {k: ours.memory[k] for k in ("params", "grads", "optimizer", "activations")}},
        comm={"predicted": {op[0]: v["sent_bytes"] for op, v in predicted.items()},
              "measured": {op[0]: v["sent_bytes"] for op, v in measured.items()}},
        setup={**setup.as_dict(), "sequence_parallel": sequence_parallel, "regather": regather, "recompute": recompute},
        losses=ours.losses,
    )  # fmt: skip


# ---- when TP hurts: smaller local matmuls ---------------------------------------------------------
def matmul_throughput(tokens: int, hidden: int, ffn: int, tps=(1, 2, 4, 8), *, repeats: int = 10,
                      dtype=torch.float32, device="cpu", threads: int | None = 1) -> list[dict]:  # fmt: skip
    """Time one rank's column-parallel matmul [tokens, h] @ [h, f/t]ᵀ for each t (median of
    ``repeats``) and return ``[{tp, shape, seconds, flops_per_s}, ...]``; FLOPs = 2·tokens·h·f/t.
    ``threads``: CPU threads while timing (1, like one rank on this machine; None leaves it)."""
    import time

    saved = torch.get_num_threads()
    if threads and torch.device(device).type == "cpu":
        torch.set_num_threads(threads)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    out = []
    try:
        x = torch.randn(tokens, hidden, dtype=dtype, device=device)  # [tokens, h]
        for t in tps:
            w = torch.randn(ffn // t, hidden, dtype=dtype, device=device)  # [f/t, h], this rank's slice
            for _ in range(2):
                F.linear(x, w)  # warm up
            times = []
            for _ in range(repeats):
                sync()
                t0 = time.perf_counter()
                F.linear(x, w)  # [tokens, f/t]
                sync()
                times.append(time.perf_counter() - t0)
            seconds = sorted(times)[len(times) // 2]
            out.append({"tp": t, "shape": (tokens, hidden, ffn // t), "seconds": seconds,
                        "flops_per_s": 2 * tokens * hidden * (ffn // t) / seconds})  # fmt: skip
    finally:
        torch.set_num_threads(saved)
    return out
