"""Plan a training run: every layout of N GPUs, why each rejected one fails, and the fastest that fits.

A layout is dp × tp × pp × cp (ep inside dp·cp, ``playbook.dims``), a ZeRO stage, a micro-batch size
b, a number of micro-batches m (global batch = dp·b·m) and a recomputation choice. For each
candidate: memory per GPU from ``playbook.theory.hybrid.memory.training_memory`` (every degree together,
mixed precision, sequence parallelism whenever tp > 1, the most loaded 1F1B stage; by default a
fused FlashAttention kernel, Dao et al. 2022, arXiv:2205.14135, as production runs use: no [s, s]
scores kept, only an fp32 log-sum-exp; ``attention="eager"`` counts our teaching model's softmax),
activations counted by ``activations=``: "production" (the default, ``theory.inventory.prod_activations``) or
"ours"; step time from ``playbook.theory.plan.cost`` (compute + exposed communication per axis, less
what the ``overlap`` preset hides, + the bubble of each schedule of ``theory.plan.schedule``),
MFU (model FLOPs / (step time · GPUs · peak), Chowdhery et al. 2022, arXiv:2204.02311, Appendix B)
and tokens per second. The shape follows Narayanan et al. 2021 (arXiv:2104.04473, §3.2: tp inside a node, pp
across nodes, dp for the rest) and Llama 3 (Dubey et al. 2024, arXiv:2407.21783, §3.3.2).

Degrees: every divisor of the GPUs (384 GPUs plan: dp 3·2^k, pp 12, ...). Pruned (and said so):
tp ≤ GPUs per node is a rejection; m ≥ pp (1F1B fills its pipeline); b ≤ ``MAX_MICRO_BATCH`` (16, as published
runs used; past it ``theory.cost.gemm_efficiency`` gains under 1 % per doubling on the profiles shipped) and
interleaved v up to 12 (``theory.plan.schedule.V_CHOICES``). Within one (dp, tp, pp, cp, ep), the variant with the least
memory (largest ZeRO stage, full recomputation, smallest b) is tried first: if even it does not fit,
the layout is rejected for memory at once; otherwise variants are tried fastest first and the first
that fits is the layout's candidate, the slower ones counted as dominated. Pure: no torch.
"""

from __future__ import annotations


from playbook.config import ModelConfig, require_positive
from playbook.hardware import MEM_UTIL, Hardware
from playbook.theory.hybrid.memory import ATTENTION
from playbook.theory.inventory.model_state import ZERO_STAGES
from playbook.theory.inventory.inventory import RECOMPUTE_MODES
from playbook.theory.plan.advice import batch_advice, nothing_fits, nothing_plans
from playbook.theory.plan.dp import GRAD_REDUCE_BYTES
from playbook.theory.plan.cost import DEFAULT_OVERLAP, OVERLAP_PRESETS
from playbook.theory.plan.schedule import PLAN_SCHEDULES, check_schedules
from playbook.theory.plan.best_first import search_exhaustive, search_structure
from playbook.theory.plan.search import Plan, _structures, _variant_groups, check_search_size
from playbook.theory.inventory.prod_activations import check_activations

# MEM_UTIL (imported above, and from here by the notebooks): the share of the device's memory
# (``Hardware.capacity_bytes``: what the driver reports where the profile knows it, e.g. 81,559 MiB on
# an "80 GB" H100) a plan may fill: the product's one rule (``playbook.hardware.MEM_UTIL``).


def plan(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    gpus: int,
    seq_len: int,
    global_batch: int,
    gpus_per_node: int | None = None,
    mem_util: float = MEM_UTIL,
    attention: str = "flash",
    activations: str = "production",
    schedules: tuple[str, ...] = PLAN_SCHEDULES,
    overlap: str = DEFAULT_OVERLAP,
    precision: str = "bf16",
    mesh_order: str = "tp-cp-dp-pp",
    zeros: tuple[int, ...] = ZERO_STAGES,
    recomputes: tuple[str, ...] = RECOMPUTE_MODES,
    exhaustive: bool = False,
) -> Plan:
    """Every layout of ``gpus`` GPUs for ``cfg`` on ``hw``: candidates fastest first, rejections by reason.
    ``attention``: "flash" (a fused kernel, what production runs use) or "eager" (our model's
    softmax, [b, a, s, s] kept per layer); see ``theory.inventory.activations``. ``activations``: "production"
    (fused kernels as Megatron-LM runs them, ``theory.inventory.prod_activations``) or "ours" (our GPT's);
    ``precision``: "bf16" or "fp8" (``theory.plan.precision``); ``mesh_order``: ``theory.plan.cost.MESH_ORDERS``;
    ``zeros``, ``recomputes``: the ZeRO stages and recomputation choices searched (a stack's options);
    ``exhaustive``: cost and sort every variant of a structure (``theory.plan.best_first.search_exhaustive``,
    the reference the default best-first search is tested against: the same plan).
    Raises ``ValueError`` (one line) on bad input, when no layout divides, the global batch splits over
    none, or nothing fits (naming the smallest memory found)."""
    g = hw.devices_per_node if gpus_per_node is None else gpus_per_node
    require_positive(gpus=gpus, gpus_per_node=g, seq_len=seq_len, global_batch=global_batch)
    if gpus > g and gpus % g:
        raise ValueError(
            f"--gpus {gpus} is not a whole number of nodes of {g}; try --gpus {gpus // g * g} or {(gpus // g + 1) * g}"
        )
    if not 0 < mem_util <= 1:
        raise ValueError(f"mem_util must be in (0, 1], got {mem_util}; try 0.9")
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, got {attention!r}; try flash")
    check_activations(activations)
    check_search_size(cfg)
    out = Plan(cfg.name, hw.name, gpus, g, seq_len, global_batch, hw.capacity_bytes, attention, activations)
    out.schedules, out.n_layers = check_schedules(schedules), cfg.n_layers
    out.rope_scaling = cfg.rope_scaling_note(seq_len)  # past max_position_embeddings: what the run assumes
    if overlap not in OVERLAP_PRESETS:
        raise ValueError(f"overlap must be one of {', '.join(OVERLAP_PRESETS)}, got {overlap!r}; try {DEFAULT_OVERLAP}")
    out.overlap, out.precision, out.mesh_order = overlap, precision, mesh_order  # a bad one: the first step costed says
    if not set(zeros) <= set(ZERO_STAGES) or not set(recomputes) <= set(RECOMPUTE_MODES) or not zeros or not recomputes:
        raise ValueError(f"zeros among {ZERO_STAGES} and recomputes among {RECOMPUTE_MODES}; got {zeros}, {recomputes}")
    out.zeros, out.recomputes = tuple(zeros), tuple(recomputes)
    budget, common = hw.capacity_bytes * mem_util, dict(seq_len=seq_len, gpus_per_node=g)
    timing = dict(
        overlap=overlap, precision=precision, mesh_order=mesh_order, grad_bytes=GRAD_REDUCE_BYTES[activations]
    )
    structures = list(_structures(cfg, out))
    if not structures:
        if "global batch split" in out.rejected:  # some layout divides the model; the batch splits over none
            raise ValueError(batch_advice(cfg, gpus=gpus, gpus_per_node=g, seq_len=seq_len, global_batch=global_batch))
        first = next((msg for k, (_, msg) in out.rejected.items() if k.endswith("vs the model")), "")
        raise ValueError(f"no layout of {gpus} GPUs divides {cfg.name}: {first}")
    search = search_exhaustive if exhaustive else search_structure
    sizes = dict(budget=budget, seq_len=seq_len, common=common, timing=timing)
    for dims in structures:
        search(cfg, hw, dims, _variant_groups(dims, out), out, **sizes)
    if not out.candidates:
        if out.smallest is None:
            raise ValueError(nothing_plans(cfg, out))
        advice = dict(smallest=out.smallest, attention=attention, activations=activations)

        raise ValueError(
            nothing_fits(cfg, hw, **common, gpus=gpus, global_batch=global_batch, mem_util=mem_util, **advice)
        )
    out.candidates.sort(key=lambda c: (c.cost.total, c.memory))
    return out
