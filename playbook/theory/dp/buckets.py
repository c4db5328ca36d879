"""Predict: how data parallelism packs gradients into buckets, and when each bucket's all-reduce runs.

Backward produces gradients in roughly the reverse of the order the forward used the parameters,
which for a model built in the order it runs is the reverse of registration order (for our GPT it
is exactly that: ``lm_head``, the final norm, the last block's MLP, ... the embedding). So a bucket
can be all-reduced as soon as its last gradient is ready, while backward continues with earlier
layers (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", VLDB, arXiv:2006.15704, §3.2.3 and §4.2).

The plan, as PyTorch's DDP builds it (``_compute_bucket_assignment_by_size`` on the order in which
gradients arrive): walk the parameters in that order, add each to the open bucket, and close the
bucket as soon as it holds at least ``cap`` bytes. A bucket may therefore exceed the cap by less
than one parameter, a parameter larger than the cap gets a bucket of its own, and the last bucket
holds what is left. Every parameter is in exactly one bucket (:func:`check_plan`).

The step schedule (:func:`predict_dp_step`) then places, on one rank:
forward (2N + 4LHQT FLOPs per token), backward (twice that), each bucket's all-reduce starting
when its gradients are ready (``overlap=True``) or after the whole backward (``overlap=False``),
one all-reduce at a time, and the optimizer once every gradient is reduced. Backward time is
shared out over the parameters in proportion to their size (a weight's gradient costs 2 FLOPs per
element per token); that ignores the attention core and the cheap embedding gradient, which is
good enough to see what overlaps and what does not.

Pure arithmetic: no torch. Sizes in bytes (the cap in MiB = 2**20 bytes, as DDP's ``bucket_cap_mb``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import prod

from playbook.config import ModelConfig, require_positive
from playbook.hardware import Hardware
from playbook.theory.cost.comm import collective_seconds, sent_bytes
from playbook.theory.cost.flops import compute_seconds, link_bandwidth, step_flops

MIB = 2**20
DDP_DEFAULT_CAP_MB = 25  # torch.nn.parallel.DistributedDataParallel's bucket_cap_mb
DDP_DEFAULT_FIRST_CAP_MB = 1  # and its first bucket's, when bucket_cap_mb is left at the default
OPTIMIZER_BYTES_PER_PARAM = 28  # fp32 AdamW reads param, grad, m, v and writes param, m, v: 7 × 4 bytes


def bucket_cap_bytes(bucket_mb: float) -> int:
    """MiB -> bytes, as DDP reads ``bucket_cap_mb``; refuses a cap that is not > 0."""
    if not isinstance(bucket_mb, (int, float)) or isinstance(bucket_mb, bool) or not bucket_mb > 0:
        raise ValueError(
            f"bucket size must be > 0 MiB, got {bucket_mb!r}; try 0.1 (a few buckets for gpt-tiny) "
            f"or {DDP_DEFAULT_CAP_MB} (DDP's default)"
        )
    return max(1, int(bucket_mb * MIB))


def parameter_shapes(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter of ``playbook.model.gpt.GPT(cfg)``, in registration order,
    without building it (a tied output head is the embedding, listed once)."""
    if cfg.is_moe or cfg.attention != "gqa":
        dense = [
            n
            for n in ModelConfig.presets()
            if not ModelConfig.preset(n).is_moe and ModelConfig.preset(n).attention == "gqa"
        ]
        raise ValueError(f"{cfg.name}: only dense GQA models are listed here; try one of {', '.join(dense)}")
    h, f, d = cfg.hidden, cfg.ffn_hidden, cfg.dim_head
    shapes = [("tok_emb.weight", (cfg.vocab_size, h))]
    for i in range(cfg.n_layers):
        b = f"blocks.{i}."
        shapes += [
            (b + "attn_norm.weight", (h,)),
            (b + "attn.q_proj.weight", (cfg.n_heads * d, h)),
            (b + "attn.k_proj.weight", (cfg.kv_heads * d, h)),
            (b + "attn.v_proj.weight", (cfg.kv_heads * d, h)),
            (b + "attn.o_proj.weight", (h, cfg.n_heads * d)),
            (b + "mlp_norm.weight", (h,)),
            (b + "mlp.gate_proj.weight", (f, h)),
            (b + "mlp.up_proj.weight", (f, h)),
            (b + "mlp.down_proj.weight", (h, f)),
        ]
    shapes.append(("norm.weight", (h,)))
    if not cfg.tie_embeddings:
        shapes.append(("lm_head.weight", (cfg.vocab_size, h)))
    return shapes


@dataclass(frozen=True)
class Bucket:
    """One flat buffer of gradients, all-reduced with one call. ``names`` in the order their
    gradients become ready; ``numels`` the element count of each."""

    index: int
    names: tuple[str, ...]
    numels: tuple[int, ...]
    element_bytes: int = 4

    @property
    def numel(self) -> int:
        return sum(self.numels)

    @property
    def bytes(self) -> int:
        return self.numel * self.element_bytes


def _numel(size) -> int:
    return int(prod(size)) if isinstance(size, (tuple, list)) else int(size)


def bucket_plan(
    params: Sequence[tuple[str, int | tuple[int, ...]]],
    cap_bytes: int,
    *,
    element_bytes: int = 4,
    ready_order: str = "reverse",
    first_cap_bytes: int | None = None,
) -> list[Bucket]:
    """Buckets for ``params`` ((name, numel or shape) in registration order), as DDP builds them.

    ``ready_order="reverse"``: gradients arrive in reverse registration order (our GPT, and DDP's
    assumption); ``"given"``: ``params`` are already in arrival order. ``first_cap_bytes``: a
    different cap for the first bucket, the one reduced first (DDP with its default 25 MiB cap uses
    1 MiB there, so that communication starts early; with ``bucket_cap_mb`` given, the same cap).
    """
    require_positive(cap_bytes=cap_bytes, element_bytes=element_bytes)
    if first_cap_bytes is not None:
        require_positive(first_cap_bytes=first_cap_bytes)
    if ready_order not in ("reverse", "given"):
        raise ValueError(f"ready_order must be 'reverse' or 'given', got {ready_order!r}")
    ordered = list(reversed(params)) if ready_order == "reverse" else list(params)
    buckets: list[Bucket] = []
    names: list[str] = []
    numels: list[int] = []
    for name, size in ordered:
        names.append(name)
        numels.append(_numel(size))
        cap = first_cap_bytes if first_cap_bytes is not None and not buckets else cap_bytes
        if sum(numels) * element_bytes >= cap:  # full: close it (DDP's rule)
            buckets.append(Bucket(len(buckets), tuple(names), tuple(numels), element_bytes))
            names, numels = [], []
    if names:
        buckets.append(Bucket(len(buckets), tuple(names), tuple(numels), element_bytes))
    return buckets


def check_plan(plan: Sequence[Bucket], params: Sequence[tuple[str, int | tuple[int, ...]]]) -> None:
    """Raise ``ValueError`` unless every parameter is in exactly one bucket with its own size."""
    want = {name: _numel(size) for name, size in params}
    seen = Counter(n for b in plan for n in b.names)
    twice = sorted(n for n, c in seen.items() if c > 1)
    missing = sorted(set(want) - set(seen))
    unknown = sorted(set(seen) - set(want))
    wrong = sorted(n for b in plan for n, k in zip(b.names, b.numels) if n in want and want[n] != k)
    if twice or missing or unknown or wrong:
        raise ValueError(
            f"bad bucket plan: counted twice {twice}, skipped {missing}, unknown {unknown}, wrong size {wrong}"
        )


@dataclass(frozen=True)
class DPStepPrediction:
    """One rank's predicted step: spans (dicts shaped like tracer spans, seconds from the step's
    start) and the totals in seconds."""

    spans: list[dict] = field(repr=False)
    plan: list[Bucket] = field(repr=False)
    forward: float = 0.0
    backward: float = 0.0
    optimizer: float = 0.0
    comm: float = 0.0  # sum of all-reduce durations
    total: float = 0.0  # step time: end of the optimizer step

    @property
    def exposed_comm(self) -> float:
        """Seconds the rank waits for communication: the step minus its compute."""
        return self.total - (self.forward + self.backward + self.optimizer)

    @property
    def hidden_comm(self) -> float:
        return self.comm - self.exposed_comm


def predict_dp_step(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    world_size: int,
    bucket_bytes: int,
    tokens: int,
    seq_len: int,
    overlap: bool = True,
    mfu: float = 1.0,
    grad_bytes: int = 4,
    latency: float = 5e-6,
) -> DPStepPrediction:
    """The step of one data-parallel rank that processes ``tokens`` tokens, with gradients of
    ``grad_bytes`` bytes each packed into buckets of ``bucket_bytes``; see the module docstring."""
    require_positive(world_size=world_size, tokens=tokens)
    shapes = parameter_shapes(cfg)
    plan = bucket_plan(shapes, bucket_bytes, element_bytes=grad_bytes)
    forward = compute_seconds(step_flops(cfg, tokens=tokens, seq_len=seq_len, training=False), hw.peak_bf16_flops, mfu)
    backward = 2 * forward  # 6N + 12LHQT = 3 × (2N + 4LHQT)
    optimizer = OPTIMIZER_BYTES_PER_PARAM * cfg.num_params() / hw.memory_bandwidth
    total_numel = sum(b.numel for b in plan)
    bw = link_bandwidth(hw, world_size)
    spans = [_span("compute", "forward", 0.0, forward), _span("compute", "backward", forward, forward + backward)]
    done, comm, free_at = 0, 0.0, 0.0
    for b in plan:
        done += b.numel
        ready = forward + backward * done / total_numel if overlap else forward + backward
        seconds = collective_seconds("all_reduce", b.bytes, world_size, bw, latency)
        start = max(ready, free_at)  # one all-reduce at a time, in bucket order
        free_at = start + seconds
        comm += seconds
        spans.append(
            _span("comm", "all_reduce", start, free_at, b.bytes, sent_bytes("all_reduce", b.bytes, world_size))
        )
    opt_start = max(forward + backward, free_at)
    spans.append(_span("compute", "optimizer", opt_start, opt_start + optimizer))
    return DPStepPrediction(spans, plan, forward, backward, optimizer, comm, opt_start + optimizer)


def _span(kind: str, name: str, start: float, end: float, size: int = 0, sent: float = 0.0) -> dict:
    return {"rank": 0, "kind": kind, "name": name, "start": start, "end": end, "bytes": size, "sent_bytes": sent}


__all__ = [
    "Bucket",
    "DDP_DEFAULT_CAP_MB",
    "DDP_DEFAULT_FIRST_CAP_MB",
    "DPStepPrediction",
    "MIB",
    "bucket_cap_bytes",
    "bucket_plan",
    "check_plan",
    "parameter_shapes",
    "predict_dp_step",
]
