"""Tensor and sequence parallelism's collectives, predicted per rank, and their time (no torch).

Narayanan et al. 2021 (arXiv:2104.04473, §3.2): tensor parallelism all-reduces the [b, s, h]
activation twice per layer forward (Megatron's g) and twice backward (f); sequence parallelism
(Korthikanti et al. 2022, arXiv:2205.05198, §4.2.2) splits each into an all-gather and a
reduce-scatter, the same bytes. ``theory.tp.tp``'s docstring derives every count; it re-exports the ones the chapter calls.
"""

from __future__ import annotations

from dataclasses import dataclass

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.cost.comm import collective_seconds, sent_bytes
from playbook.theory.tp.layout import check_tp


# ---- communication -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Collective:
    """One collective call on one rank: where (region), when (phase), what (op), and its buffer S
    (bytes; the full gathered size for all-gather and reduce-scatter) and bytes sent (ring)."""

    region: str  # "embedding", "layer0.attn", "layer0.mlp", ..., "head", "loss", "grad sync"
    phase: str  # "forward" | "backward" | "step"
    op: str  # "all_reduce" | "all_gather" | "reduce_scatter"
    bytes: int
    sent_bytes: float


def step_collectives(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool = False,
    regather: bool = False,
    recompute: str = "none",
    dtype_bytes: int = 4,
) -> list[Collective]:
    """Every collective one rank issues in one training step of our TP model, in order (module
    docstring). ``regather``: each region's backward all-gathers its input's shard once more.
    ``recompute="full"``: in backward, each block's forward runs again (phase "recompute") as far
    as the tensors backward needs, i.e. up to its MLP's input: its last collective is not repeated
    (non-reentrant ``torch.utils.checkpoint`` stops early)."""
    check_tp(cfg, tp, seq_len=seq_len, sequence_parallel=sequence_parallel, regather=regather)
    b, s, h, B, t = micro_batch, seq_len, cfg.hidden, dtype_bytes, tp
    act = B * b * s * h  # one [b, s, h] activation
    if t == 1:
        return []
    sp = sequence_parallel

    def c(region, phase, op, size):
        return Collective(region, phase, op, size, sent_bytes(op, size, t))

    enter = "all_gather" if sp else None  # f is the identity forward: no collective
    enter_back = "reduce_scatter" if sp else "all_reduce"
    leave = "reduce_scatter" if sp else "all_reduce"
    leave_back = "all_gather" if sp else None
    out = [c("embedding", "forward", leave, act)]
    for i in range(cfg.n_layers):
        for part in ("attn", "mlp"):
            if enter:
                out.append(c(f"layer{i}.{part}", "forward", enter, act))
            out.append(c(f"layer{i}.{part}", "forward", leave, act))
    if enter:
        out.append(c("head", "forward", enter, act))
    out += [c("loss", "forward", "all_reduce", 4 * b * s), c("loss", "forward", "all_reduce", 2 * 4 * b * s)]
    # backward: the conjugates, in reverse order (the loss's backward needs no communication)
    again = [("all_gather", act)] if regather else []
    out += [c("head", "backward", op, size) for op, size in again + [(enter_back, act)]]
    for i in reversed(range(cfg.n_layers)):
        for part in ("mlp", "attn"):
            if leave_back:
                out.append(c(f"layer{i}.{part}", "backward", leave_back, act))
            if part == "mlp" and recompute == "full":
                redo = [(f"layer{i}.attn", enter), (f"layer{i}.attn", leave), (f"layer{i}.mlp", enter)]
                out += [c(region, "recompute", op, act) for region, op in redo if op]
            out += [c(f"layer{i}.{part}", "backward", op, size) for op, size in again + [(enter_back, act)]]
    if leave_back:
        out.append(c("embedding", "backward", leave_back, act))
    if sp:  # replicated norm weights saw s/t tokens each: sum their gradients (fp32 parameters)
        out.append(c("grad sync", "step", "all_reduce", 4 * (2 * cfg.n_layers + 1) * h))
    return out


def summarize(collectives, *, by=("phase", "op")) -> dict[tuple, dict[str, float]]:
    """Count, buffer bytes and bytes sent, grouped by the given fields of each :class:`Collective`
    (or of each dict with the same keys, as measured)."""
    get = (lambda x, k: x[k]) if collectives and isinstance(collectives[0], dict) else getattr
    out: dict[tuple, dict[str, float]] = {}
    for x in collectives:
        key = tuple(get(x, k) for k in by)
        row = out.setdefault(key, {"count": 0, "bytes": 0, "sent_bytes": 0.0})
        row["count"] += 1
        row["bytes"] += get(x, "bytes")
        row["sent_bytes"] += get(x, "sent_bytes")
    return out


def layer_summary(collectives, layer: int = 0) -> dict[tuple, dict[str, float]]:
    """:func:`summarize` of one layer's collectives (its attention and MLP regions), by (phase, op);
    predicted :class:`Collective` objects or measured dicts alike."""
    region = lambda x: x["region"] if isinstance(x, dict) else x.region  # noqa: E731
    return summarize([x for x in collectives if region(x).startswith(f"layer{layer}.")])


def _layer0(cfg: ModelConfig, **sizes) -> list[Collective]:
    """The collectives of layer 0 (every layer issues the same) among :func:`step_collectives`."""
    return [x for x in step_collectives(cfg, **sizes) if x.region.startswith("layer0.")]


def layer_comm(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool = False,
    regather: bool = False,
    recompute: str = "none",
    dtype_bytes: int = 4,
) -> dict[str, dict[str, int | float]]:
    """One transformer layer, forward and backward: ``{"forward": {op: count, ..., "sent_bytes": x}, ...}``
    (and "recompute" with ``recompute="full"``). TP: 2 all-reduces each way, 4·B·bsh(t−1)/t bytes sent each way."""
    sizes = dict(sequence_parallel=sequence_parallel, regather=regather, recompute=recompute, dtype_bytes=dtype_bytes)
    out = {"forward": {"sent_bytes": 0.0}, "backward": {"sent_bytes": 0.0}}
    for x in _layer0(cfg, seq_len=seq_len, micro_batch=micro_batch, tp=tp, **sizes):
        out.setdefault(x.phase, {"sent_bytes": 0.0})
        out[x.phase][x.op] = out[x.phase].get(x.op, 0) + 1
        out[x.phase]["sent_bytes"] += x.sent_bytes
    return out


def layer_comm_seconds(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int,
    hardware: Hardware,
    sequence_parallel: bool = False,
    regather: bool = False,
    dtype_bytes: int = 2,
    latency: float = 5e-6,
    bandwidth: float | None = None,
) -> float:
    """Predicted seconds of communication per layer, forward + backward (alpha-beta model,
    ``theory.cost.comm.collective_seconds``), collectives not overlapped. The link is ``hardware``'s
    intra-node one while the t ranks fit in one node (``devices_per_node``), its inter-node one
    beyond (which is why TP stays inside a node); ``bandwidth`` (bytes/s) overrides both."""
    sizes = dict(sequence_parallel=sequence_parallel, regather=regather, dtype_bytes=dtype_bytes)
    layer = _layer0(cfg, seq_len=seq_len, micro_batch=micro_batch, tp=tp, **sizes)
    if bandwidth is None:
        bandwidth = hardware.intra_node_bandwidth if tp <= hardware.devices_per_node else hardware.inter_node_bandwidth
    return sum(collective_seconds(x.op, x.bytes, tp, bandwidth, latency) for x in layer)


def layer_flops(cfg: ModelConfig, *, seq_len: int, micro_batch: int) -> float:
    """Matmul FLOPs of one layer, forward + backward (3× forward), whole layer (divide by t per rank):
    2·tokens·(weights of the layer) for the projections plus 2·2·b·a·s²·d for q·kᵀ and probs·v."""
    tokens = micro_batch * seq_len
    weights = cfg.attention_params() + cfg.dense_mlp_params()
    forward = 2 * tokens * weights + 4 * micro_batch * cfg.n_heads * seq_len * seq_len * cfg.dim_head
    return 3.0 * forward


def layer_seconds(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int,
    tp: int,
    hardware: Hardware,
    flops_per_s: float,
    sequence_parallel: bool = False,
    regather: bool = False,
    dtype_bytes: int = 2,
    bandwidth: float | None = None,
) -> dict[str, float]:
    """One layer, forward + backward, on one of t ranks: ``compute`` = layer FLOPs / t at
    ``flops_per_s`` (what a matmul of the local size achieves: measured, or peak × an efficiency),
    ``comm`` = :func:`layer_comm_seconds` (not overlapped). TP pays while the compute it removes
    exceeds the communication it adds."""
    compute = layer_flops(cfg, seq_len=seq_len, micro_batch=micro_batch) / tp / flops_per_s
    comm = layer_comm_seconds(
        cfg,
        seq_len=seq_len,
        micro_batch=micro_batch,
        tp=tp,
        hardware=hardware,
        sequence_parallel=sequence_parallel,
        regather=regather,
        dtype_bytes=dtype_bytes,
        bandwidth=bandwidth,
    )
    return {"tp": tp, "compute": compute, "comm": comm, "total": compute + comm}
