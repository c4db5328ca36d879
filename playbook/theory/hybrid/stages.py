"""Memory layer by layer: activations of every layer (dense or mixture of experts) and the bytes of
every pipeline stage, for ``training_memory``.

A config with ``n_dense_layers = d`` and experts has dense layers 0..d-1 and MoE layers d..L-1
(DeepSeek-V3: 3 dense, then 58 MoE). Every function here decides dense or MoE **per layer**, so a
pipeline stage that holds a few dense layers and many MoE layers is counted as such.

Pipeline (1F1B, Narayanan et al. 2021, arXiv:2104.04473, §2.2): L layers split into contiguous
stages, evenly, the first ``L mod p`` stages taking one more; the input embedding on stage 0, the
final norm and the output head on the last stage (both ends when embeddings are tied: each end
holds a copy). With m >= p micro-batches, stage i holds the activations of p − i micro-batches
at its peak, so stage 0 holds about as many as the whole unsplit model does for one micro-batch
(Korthikanti et al. 2022, arXiv:2205.05198, §4.2.3).

Activations are the exact counts for our model: ``theory.inventory.activations.block_activation_bytes`` for
a dense block, ``theory.hybrid.local_activations.block_bytes`` (even routing, no drops) for an MoE block,
the same at every ``pp`` and ``ep``. Model state follows ZeRO (``theory.hybrid.memory.model_state_bytes``).
Every function takes ``attention`` ("eager": our model's attention, the default; "flash": a fused
kernel that keeps no [s, s] tensor, Dao et al. 2022, arXiv:2205.14135; ``theory.inventory.activations``).

Units: bytes. No torch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.theory.hybrid.local_activations import block_bytes, end_activations
from playbook.theory.inventory.model_state import TrainingMemory, model_state_bytes
from playbook.theory.pp.rank_params import rank_units


def is_moe_layer(cfg: ModelConfig, layer: int) -> bool:
    """Layer ``layer`` (0-based) is a mixture of experts: the config has experts and the layer comes
    after the first ``n_dense_layers``."""
    return cfg.is_moe and layer >= cfg.n_dense_layers


def layer_activation_bytes(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    dtype_bytes: int = 4,
    recompute: str = "none",
    attention: str = "eager",
) -> list[int]:
    """Bytes each of the ``cfg.n_layers`` blocks saves for one micro-batch, in layer order."""
    sizes = dict(
        seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes, recompute=recompute, attention=attention
    )
    dense = block_bytes(cfg, **sizes)
    moe = block_bytes(cfg, True, **sizes) if cfg.is_moe else 0
    return [moe if is_moe_layer(cfg, i) else dense for i in range(cfg.n_layers)]


def activation_bytes(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    dtype_bytes: int = 4,
    recompute: str = "none",
    attention: str = "eager",
) -> int:
    """Bytes the whole model saves for one micro-batch: every layer (:func:`layer_activation_bytes`)
    plus tokens, final norm, log-probabilities and the loss. For a dense config this equals
    ``theory.inventory.activations.model_activation_bytes``; for MoE it uses the exact even-routing count."""
    sizes = dict(seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes, recompute=recompute)
    return sum(layer_activation_bytes(cfg, **sizes, attention=attention)) + sum(end_activations(cfg, **sizes))


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage: which layers it holds, what else, and its bytes per rank."""

    stage: int
    first_layer: int
    n_layers: int
    n_moe_layers: int
    embedding: bool  # holds the input embedding (stage 0)
    head: bool  # holds the final norm and the output head (last stage)
    params: int  # parameters held (before ZeRO sharding)
    in_flight: int  # micro-batches of activations held at the peak (1F1B: p − stage)
    memory: TrainingMemory

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "memory"} | {
            "memory": self.memory.as_dict()
        }


def stage_layers(n_layers: int, pp: int) -> list[range]:
    """Contiguous layer ranges of the ``pp`` stages, the first ``n_layers mod pp`` one layer longer."""
    if pp > n_layers:
        raise ValueError(f"pp={pp} exceeds n_layers={n_layers}: every stage needs a layer; try pp in 1..{n_layers}")
    sizes = [n_layers // pp + (1 if i < n_layers % pp else 0) for i in range(pp)]
    starts = [0, *itertools.accumulate(sizes)][:-1]  # (a running sum: pp² additions made a deep pipeline slow)
    return [range(a, a + n) for a, n in zip(starts, sizes)]


def pipeline_stage_memory(
    cfg: ModelConfig,
    *,
    pp: int,
    seq_len: int,
    micro_batch: int,
    dp: int = 1,
    zero: int = 0,
    precision: str = "mixed",
    recompute: str = "none",
    n_tensors: int = 0,
    fp32_grad_accum: bool | str = False,
    attention: str = "eager",
) -> list[StageMemory]:
    """Bytes per rank of every stage of a 1F1B pipeline over ``pp`` stages (module docstring), each
    stage's model state sharded by ZeRO over its ``dp`` replicas. ``n_tensors`` (AdamW's 4-byte
    ``step`` per tensor) is kept whole on every stage, an upper bound of a few kilobytes.
    :func:`most_loaded_stage` picks the one ``training_memory(pp=...)`` reports."""
    dtype_bytes = 2 if precision == "mixed" else 4
    sizes = dict(seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes, recompute=recompute)
    per_layer = layer_activation_bytes(cfg, **sizes, attention=attention)
    first_extra, last_extra = end_activations(cfg, **sizes)
    out = []
    for i, layers in enumerate(stage_layers(cfg.n_layers, pp)):
        moe = sum(is_moe_layer(cfg, j) for j in layers)
        pieces = (layers.start + 1 - (i == 0), layers.stop + 1 + (i == pp - 1))  # + embedding, + head
        params = sum(u.numel for u in rank_units(cfg, ParallelDims(), [pieces]))  # a tied head: a copy
        acts = sum(per_layer[j] for j in layers) + (i == 0) * first_extra + (i == pp - 1) * last_extra
        state = model_state_bytes(
            params, dp=dp, zero=zero, precision=precision, n_tensors=n_tensors, fp32_grad_accum=fp32_grad_accum
        )
        memory = TrainingMemory(state.params, state.grads, state.optimizer, float(acts * (pp - i)))
        out.append(StageMemory(i, layers.start, len(layers), moe, i == 0, i == pp - 1, params, pp - i, memory))
    return out


def most_loaded_stage(stages: list[StageMemory]) -> int:
    """Index of the stage with the most bytes in all (the first one on a tie)."""
    return max(range(len(stages)), key=lambda i: (stages[i].memory.total, -i))


__all__ = [
    "StageMemory",
    "activation_bytes",
    "is_moe_layer",
    "layer_activation_bytes",
    "most_loaded_stage",
    "pipeline_stage_memory",
    "stage_layers",
]


# ---- every degree together ---------------------------------------------------------------------
def _moe_layers_in(cfg: ModelConfig, layers: range) -> int:
    """How many of ``layers`` are MoE layers (:func:`is_moe_layer`), without visiting each."""
    return max(0, layers.stop - max(layers.start, cfg.n_dense_layers)) if cfg.is_moe else 0


def _stage_params(cfg: ModelConfig, layers: range, *, tp: int, ep: int, first: bool, last: bool) -> tuple[float, float]:
    """(dense, routed-expert) parameters one rank of a stage holds: attention, dense MLPs, shared
    experts, embedding and head split 1/tp (Megatron; the vocabulary split too); norms and routers
    whole; routed experts E/ep each, not split by tp (expert parallelism instead)."""
    h = cfg.hidden
    moe = _moe_layers_in(cfg, layers)
    expert = 3 * h * cfg.expert_ffn_hidden
    dense = len(layers) * (2 * h + cfg.attention_params() / tp) + (len(layers) - moe) * cfg.dense_mlp_params() / tp
    dense += moe * (h * cfg.n_experts + cfg.n_shared_experts * expert / tp)
    experts = moe * (cfg.n_experts // ep) * expert if moe else 0.0
    table = cfg.vocab_size * h / tp
    if first:
        dense += table
    if last:
        dense += h + table
    return dense, experts


def layout_stage_memory(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    zero: int = 0,
    sequence_parallel: bool = False,
    precision: str = "mixed",
    recompute: str = "none",
    n_tensors: int = 0,
    fp32_grad_accum: bool | str = False,
    attention: str = "eager",
) -> list[StageMemory]:
    """Bytes per rank of every pipeline stage when every degree is > 1 at once, from each rank's
    local shapes: 1/tp of the split matrices, E/ep routed experts, s/cp tokens, the stage's layers,
    and the 1F1B peak of ``pp − i`` micro-batches in flight on stage i (Narayanan et al. 2021 §2.2).
    Dense weights are sharded by ZeRO over the ``dp·cp`` ranks that hold them (the data ranks);
    routed experts over their ``dp·cp/ep`` replicas. Ends (token ids; final norm, head, loss) are
    counted as the unsplit model's at s/cp tokens, and as our vocab-parallel head's under TP.
    ``ep`` must divide ``dp·cp`` (it borrows data ranks, ``playbook.dims``)."""
    if (dp * cp) % ep:
        raise ValueError(f"ep={ep} must divide dp·cp={dp * cp}: expert parallelism borrows data-parallel ranks")
    dtype_bytes = 2 if precision == "mixed" else 4
    first_extra, last_extra = end_activations(
        cfg,
        seq_len=seq_len // cp,
        micro_batch=micro_batch,
        tp=tp,
        sequence_parallel=sequence_parallel,
        dtype_bytes=dtype_bytes,
        recompute=recompute,
    )
    # A block's bytes depend on the layer only through dense or MoE, and a stage's model state only on
    # its layer counts and ends: count each once (a 126-layer model over 128 stages repeats them).
    n_moe = _moe_layers_in(cfg, range(cfg.n_layers))
    kinds = [moe for moe in (False, True) if (n_moe if moe else cfg.n_layers - n_moe)]
    variant = "ring" if attention == "eager" and recompute == "none" else None  # our ring kernel, or a fused one
    block = {
        moe: block_bytes(
            cfg,
            moe,
            seq_len=seq_len,
            micro_batch=micro_batch,
            tp=tp,
            cp=cp,
            sequence_parallel=sequence_parallel,
            dtype_bytes=dtype_bytes,
            recompute=recompute,
            attention=attention,
            variant=variant,
        )
        for moe in kinds
    }
    common = dict(zero=zero, precision=precision, fp32_grad_accum=fp32_grad_accum)
    states: dict[tuple, tuple] = {}
    out = []
    for i, layers in enumerate(stage_layers(cfg.n_layers, pp)):
        first, last = i == 0, i == pp - 1
        moe = _moe_layers_in(cfg, layers)
        key = (len(layers), moe, first, last)
        if key not in states:
            dense, experts = _stage_params(cfg, layers, tp=tp, ep=ep, first=first, last=last)
            state = model_state_bytes(dense, dp=dp * cp, n_tensors=n_tensors, **common)
            if experts:
                more = model_state_bytes(experts, dp=dp * cp // ep, **common)
                state = TrainingMemory(
                    state.params + more.params, state.grads + more.grads, state.optimizer + more.optimizer, 0.0
                )
            states[key] = (int(dense + experts), state)
        params, state = states[key]
        blocks = moe * block.get(True, 0) + (len(layers) - moe) * block.get(False, 0)
        acts = first * first_extra + last * last_extra + blocks
        memory = TrainingMemory(state.params, state.grads, state.optimizer, float(acts * (pp - i)))
        out.append(StageMemory(i, layers.start, len(layers), moe, first, last, params, pp - i, memory))
    return out
