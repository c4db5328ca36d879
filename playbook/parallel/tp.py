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

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from playbook.cluster import default_backend, launch
from playbook.model import GPT, RECOMPUTE_MODES, Attention
from playbook.measure.matmul import matmul_throughput  # noqa: F401  (the chapter imports it from here)
from playbook.parallel.comm import all_reduce, f, g  # noqa: F401  (f, g: the chapter imports them from here)
from playbook.parallel.tp_layers import (  # noqa: F401  (layers, re-exported for the chapter and tests)
    ColumnParallelLinear,
    Region,
    RowParallelLinear,
    VocabParallelCrossEntropy,
    VocabParallelEmbedding,
    shard,
)
from playbook.parallel.registry import register
from playbook.parallel.report import RunReport, compare
from playbook.parallel.training import TrainResult, TrainSetup, train
from playbook.theory.tp import check_tp, step_collectives, summarize, tp_training_memory


# ---- the model, cut from the reference GPT ------------------------------------------------------
class TPAttention(Attention):
    """Heads split over ranks: a/t query heads and g/t key/value heads each (t must divide g).
    The reference ``Attention.forward`` runs unchanged on the local head counts; only ``project``
    differs: q, k and v enter the parallel region once."""

    def __init__(self, ref, rank, t, region: Region):
        nn.Module.__init__(self)
        self.n_heads, self.kv_heads, self.head_dim, self.region = (
            ref.n_heads // t,
            ref.kv_heads // t,
            ref.head_dim,
            region,
        )
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

    def __init__(
        self, ref: GPT, group, *, sequence_parallel: bool = False, regather: bool = False, recompute: str = "none"
    ):
        super().__init__()
        if recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
        cfg, rank, t = ref.cfg, dist.get_rank(group), dist.get_world_size(group)
        if cfg.is_moe:
            raise NotImplementedError(
                "TPGPT splits the dense SwiGLU MLP; experts are split by the expert-parallel chapter"
            )
        if regather and not sequence_parallel:
            raise ValueError("regather saves sequence shards, so it needs sequence_parallel=True")
        check_tp(cfg, t)
        self.cfg, self.group, self.sp, self.vocab_start = cfg, group, sequence_parallel, rank * cfg.vocab_size // t
        mode = dict(group=group, sequence_parallel=sequence_parallel, regather=regather)
        self.tok_emb = VocabParallelEmbedding(
            shard(ref.tok_emb.weight, 0, rank, t), self.vocab_start, Region(label="embedding", **mode)
        )
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


_OP = {
    "all_gather_single": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
}


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
        out.append(
            {
                "region": region,
                "phase": phase,
                "op": _OP.get(c["name"], c["name"]),
                "bytes": c["bytes"],
                "sent_bytes": c["sent_bytes"],
            }
        )
    return out


def tp_group(ctx):
    """The chapter's layout: every rank on one tensor-parallel axis."""
    from playbook.dims import ParallelDims

    return ctx.mesh_for(ParallelDims(tp=ctx.world_size)).group("tp")


def train_tp(
    ctx, setup: TrainSetup, *, sequence_parallel: bool = False, regather: bool = False, recompute: str = "none"
):
    """Rank function: build this rank's shard from the reference GPT, train, and return
    (TrainResult of this rank's slices, shard dims, the collectives of step 0)."""
    group = tp_group(ctx)
    model = TPGPT(
        GPT(setup.config(), seed=setup.seed).to(ctx.device),
        group,
        sequence_parallel=sequence_parallel,
        regather=regather,
        recompute=recompute,
    )
    sync = (lambda m: sync_replicated_grads(m, group)) if sequence_parallel else None
    result = train_loop(model, setup, ctx.device, after_backward=sync, progress=ctx.progress)
    return result, shard_dims(model), measured_collectives(ctx.tracer.spans)


def gather_result(per_rank) -> TrainResult:
    """One TrainResult with full tensors from the ranks' (result, dims, ...) answers; rank 0's memory."""
    results, dims = [r[0] for r in per_rank], per_rank[0][1]
    return TrainResult(
        results[0].losses,
        unshard([r.grads for r in results], dims),
        unshard([r.params for r in results], dims),
        results[0].memory,
    )


def on_rank(
    ctx,
    setup: TrainSetup,
    *,
    sequence_parallel: bool = False,
    native: bool = False,
    regather: bool = False,
    recompute: str = "none",
):
    """Rank function of ``playbook run tp``: ours, and (``native``) DTensor's on the same setup."""
    ours = train_tp(ctx, setup, sequence_parallel=sequence_parallel, regather=regather, recompute=recompute)
    if not native:
        return ours, None
    from playbook.parallel.tp_dtensor import train_dtensor

    return ours, train_dtensor(ctx, setup, sequence_parallel=sequence_parallel)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--sequence-parallel", action="store_true", help="sequence parallelism (Korthikanti et al. 2022)"
    )
    parser.add_argument(
        "--regather",
        action="store_true",
        help="with --sequence-parallel: save sequence shards, all-gather again in backward (Megatron-LM)",
    )
    parser.add_argument(
        "--recompute",
        default="none",
        choices=list(RECOMPUTE_MODES),
        help="activation recomputation: selective (attention core) or full (each block)",
    )
    parser.add_argument("--no-native", dest="native", action="store_false", help="skip the DTensor counterpart")


@register(
    "tp",
    help="Megatron tensor parallelism (+ --sequence-parallel), from scratch and with DTensor",
    arguments=add_arguments,
    on_rank=on_rank,
    predict=step_collectives,
)
def run_tp(
    setup: TrainSetup,
    *,
    world_size: int,
    backend: str = "auto",
    sequence_parallel: bool = False,
    regather: bool = False,
    recompute: str = "none",
    native: bool = True,
) -> RunReport:
    """t = world_size tensor-parallel ranks on the whole global batch, against the single process."""
    cfg = setup.config()
    check_tp(cfg, world_size, seq_len=setup.seq_len, sequence_parallel=sequence_parallel, regather=regather)
    backend = default_backend(world_size) if backend == "auto" else backend
    answers = launch(
        on_rank,
        world_size,
        setup,
        sequence_parallel=sequence_parallel,
        native=native,
        regather=regather,
        recompute=recompute,
        backend=backend,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like one rank: several threads on a busy 2-core machine run 10-30x slower
    try:
        reference = train(setup)
    finally:
        torch.set_num_threads(threads)
    ours = gather_result([a[0] for a in answers])
    sizes = dict(
        seq_len=setup.seq_len,
        micro_batch=setup.global_batch,
        tp=world_size,
        sequence_parallel=sequence_parallel,
        regather=regather,
        recompute=recompute,
    )
    predicted = summarize(step_collectives(cfg, **sizes), by=("op",))
    measured = summarize(answers[0][0][2], by=("op",))
    return RunReport(
        strategy=("tp+sp" + ("+regather" if regather else "")) if sequence_parallel else "tp",
        world_size=world_size,
        backend=backend,
        parity=compare(ours, reference),
        native=compare(answers[0][1], reference, "DTensor parallelize_module, same global batch") if native else None,
        memory={
            "predicted": tp_training_memory(cfg, **sizes, n_tensors=cfg.num_param_tensors()).as_dict(),
            "measured": {k: ours.memory[k] for k in ("params", "grads", "optimizer", "activations")},
        },
        comm={
            "predicted": {op[0]: v["sent_bytes"] for op, v in predicted.items()},
            "measured": {op[0]: v["sent_bytes"] for op, v in measured.items()},
        },
        setup={**setup.as_dict(), "sequence_parallel": sequence_parallel, "regather": regather, "recompute": recompute},
        losses=ours.losses,
    )
