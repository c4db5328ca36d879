"""What would work when the planner finds nothing: one line each, with numbers the search found.

- The global batch splits over no dp: the dp values the GPUs allow (``dp = gpus / (tp·pp·cp)``
  for the layouts that divide the model) and the nearest global batches that split.
- No layout can be planned at all (every pipeline short of micro-batches, ...): the reasons by
  kind, and the smallest global batch, doubling, at which one can.
- Nothing fits in memory: the least memory any layout needs (its least-memory variant: the largest
  ZeRO stage, full recomputation, micro-batch 1), and the same scan repeated at 2, 4, ... 64 times
  the GPUs and at 1/2, 1/4, ... of the sequence: the first GPU count and the longest sequence at
  which a layout fits. The scan is ``playbook.theory.plan.planner``'s own (its ``_structures``,
  ``_variants`` and ``_modelled``), so "would fit" means the planner would then find a candidate.
Pure: no torch.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.plan.search import Plan, _modelled, _structures, _variants

GPU_FACTORS = (2, 4, 8, 16, 32, 64)
MIN_SEQ_LEN = 128


def allowed_dps(cfg: ModelConfig, *, gpus: int, gpus_per_node: int, seq_len: int) -> list[int]:
    """Every dp some layout of ``gpus`` GPUs that divides the model has, ascending."""
    scratch = Plan(cfg.name, "", gpus, gpus_per_node, seq_len, gpus, 0.0)  # every dp divides gpus
    return sorted({dims.dp for dims in _structures(cfg, scratch)})


def batch_advice(cfg: ModelConfig, *, gpus: int, gpus_per_node: int, seq_len: int, global_batch: int) -> str:
    """One line: the global batch splits over no dp, which dp values there are, which batches would split."""
    dps = allowed_dps(cfg, gpus=gpus, gpus_per_node=gpus_per_node, seq_len=seq_len)
    d = dps[0]
    below, above = global_batch // d * d, (global_batch // d + 1) * d
    near = f"--global-batch {below} or {above}" if below else f"--global-batch {above}"
    return (
        f"global batch {global_batch} does not split over any dp of {gpus} GPUs (dp can be "
        f"{', '.join(map(str, dps))}); use a multiple of {d}, e.g. {near}"
    )


def nothing_plans(cfg: ModelConfig, plan) -> str:
    """One line: why no layout of ``plan.gpus`` GPUs can be planned, and a global batch that would plan."""
    reasons = ", ".join(f"{kind} {count}" for kind, (count, _) in plan.rejected.items())
    common = dict(gpus=plan.gpus, gpus_per_node=plan.gpus_per_node, seq_len=plan.seq_len)
    batch = plan.global_batch * 2
    while batch <= plan.gpus * GPU_FACTORS[-1] and least_memory(cfg, **common, global_batch=batch) is None:
        batch *= 2
    fix = f"--global-batch {batch} would give layouts" if batch <= plan.gpus * GPU_FACTORS[-1] else "try fewer GPUs"
    return (
        f"no layout of {plan.gpus} GPUs can be planned for {cfg.name} with global batch {plan.global_batch} "
        f"(dp must divide it, and a pipeline of pp stages needs m >= pp micro-batches); rejected: {reasons}; {fix}"
    )


def least_memory(
    cfg: ModelConfig,
    *,
    gpus: int,
    gpus_per_node: int,
    seq_len: int,
    global_batch: int,
    attention: str = "flash",
    activations: str = "production",
) -> tuple[float, str] | None:
    """(bytes per GPU, layout) of the layout of ``gpus`` GPUs that needs the least memory, or None
    when no layout of that many GPUs can be planned (the batch splits over none, ...)."""
    if gpus > gpus_per_node and gpus % gpus_per_node:
        return None
    scratch = Plan(cfg.name, "", gpus, gpus_per_node, seq_len, global_batch, 0.0, attention, activations)
    best = None
    for dims in _structures(cfg, scratch):
        variants, need, least = _modelled(cfg, dims, list(_variants(dims, scratch)), seq_len, scratch)
        if variants and (best is None or need < best[0]):
            best = (need, str(least))
    return best


def nothing_fits(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    gpus: int,
    gpus_per_node: int,
    seq_len: int,
    global_batch: int,
    mem_util: float,
    smallest: tuple[float, str],
    attention: str = "flash",
    activations: str = "production",
) -> str:
    """One line: the least memory found, what it already uses, and what would make a layout fit."""
    need, where = smallest
    budget = hw.capacity_bytes * mem_util
    common = dict(gpus_per_node=gpus_per_node, global_batch=global_batch, attention=attention, activations=activations)
    hints = []
    for k in GPU_FACTORS:
        found = least_memory(cfg, gpus=gpus * k, seq_len=seq_len, **common)
        if found and found[0] <= budget:
            hints.append(f"--gpus {gpus * k} ({found[1]}: {found[0] / 1e9:.1f} GB)")
            break
    else:
        hints.append(f"more than {gpus * GPU_FACTORS[-1]} GPUs")
    s = seq_len // 2
    while s >= MIN_SEQ_LEN:
        found = least_memory(cfg, gpus=gpus, seq_len=s, **common)
        if found and found[0] <= budget:
            hints.append(f"--seq-len {s} ({found[1]}: {found[0] / 1e9:.1f} GB)")
            break
        s //= 2
    hints.append(f"a device of {need / mem_util / 1e9:.0f} GB")
    recompute = "full recomputation" if where.endswith(" full") else "the recomputation it allows"
    return (
        f"nothing fits: the least memory a layout of {gpus} GPUs needs is {need / 1e9:.1f} GB per GPU ({where}: "
        f"{recompute}, the largest ZeRO stage, micro-batch 1) of a {hw.capacity_bytes / 1e9:.1f} GB device at "
        f"{mem_util:g} use; it would fit with {' or '.join(hints)}"
    )
