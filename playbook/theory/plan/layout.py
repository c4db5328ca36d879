"""Cost ONE given layout, as ``playbook plan --layout "dp=64 tp=8 pp=16 ..."`` does: memory by
category, step time by part, MFU, whether it fits and by what margin, and where it ranks among the
planner's candidates for the same GPUs, sequence and batch. The same functions as the search
(``theory.plan.memory``, ``theory.plan.cost``, ``theory.plan.schedule``): no second model. No torch.
"""

from __future__ import annotations

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.plan.cost import DEFAULT_OVERLAP, step_cost, with_schedule
from playbook.theory.plan.dp import GRAD_REDUCE_BYTES
from playbook.theory.plan.memory import memory_breakdown
from playbook.theory.plan.schedule import ENDS, stage_placement
from playbook.theory.pp import V_SCHEDULES
from playbook.hardware import MEM_UTIL
from playbook.theory.plan.search import MAX_UNITS, Layout, planned_units
from playbook.theory.plan.planner import plan
from playbook.theory.plan.stage_balance import stage_imbalance

_KEYS = {"dp", "tp", "pp", "cp", "ep", "zero", "b", "m", "recompute", "schedule", "v", "ends"}
_EXAMPLE = "dp=64 tp=8 pp=16 zero=1 b=1 m=32 recompute=none schedule=interleaved v=2"


def parse_layout(text: str, *, global_batch: int) -> Layout:
    """``"dp=64 tp=8 pp=16 ..."`` (any order; cp, ep, zero default 0/1, b 1, m from the batch,
    recompute none, schedule 1f1b, v 1, ends even) as a :class:`Layout`; one line naming what is wrong."""
    fields: dict[str, str] = {}
    for part in text.replace(",", " ").split():
        key, _, value = part.partition("=")
        if key not in _KEYS or not value:
            raise ValueError(
                f"--layout: {part!r} is not key=value with key in {', '.join(sorted(_KEYS))}; e.g. {_EXAMPLE}"
            )
        fields[key] = value
    try:
        ints = {k: int(fields.get(k, d)) for k, d in (("dp", 1), ("tp", 1), ("pp", 1), ("cp", 1), ("ep", 1))}
        zero, b, v = int(fields.get("zero", 0)), int(fields.get("b", 1)), int(fields.get("v", 1))
    except ValueError:
        raise ValueError(f"--layout: degrees, zero, b, m and v are integers; e.g. {_EXAMPLE}") from None
    schedule = fields.get("schedule", "1f1b")
    v = chunks_in_layout(schedule, v if "v" in fields else None, ints["pp"])
    for key, value in (*ints.items(), ("b", b), ("m", int(fields.get("m", 1)))):
        if value < 1:
            raise ValueError(f"--layout: {key} must be a positive integer, got {key}={value}; e.g. {_EXAMPLE}")
    if global_batch % (ints["dp"] * b):
        raise ValueError(f"--layout: global batch {global_batch} does not split into dp={ints['dp']} × b={b}")
    m = int(fields.get("m", global_batch // (ints["dp"] * b)))
    if ints["dp"] * b * m != global_batch:
        raise ValueError(f"--layout: dp·b·m = {ints['dp'] * b * m} but the global batch is {global_batch}")
    ends = fields.get("ends", "even")
    if ends not in ENDS:
        raise ValueError(f"--layout: ends is {' or '.join(ENDS)} (light: Llama 3's lighter first and last stages)")
    return Layout(
        **ints,
        zero=zero,
        micro_batch=b,
        microbatches=m,
        recompute=fields.get("recompute", "none"),
        schedule=schedule,
        v=v,
        ends=ends,
    )


def chunks_in_layout(schedule: str, v: int | None, pp: int) -> int:
    """The v a layout's schedule holds (``v``: as given, None when not), or one line saying what would:
    interleaved needs pp >= 2 and v >= 2 (v = 1 is 1f1b), a V shape holds 2 (the default), others 1."""
    if schedule == "interleaved":
        if pp < 2 or v is None or v < 2:
            raise ValueError(
                f"--layout: schedule=interleaved needs pp >= 2 and v >= 2 model chunks per rank, got pp={pp} "
                f"v={'(none)' if v is None else v}; e.g. pp={max(pp, 2)} v=2 (or schedule=1f1b)"
            )
        return v
    want = 2 if schedule in V_SCHEDULES else 1
    if v not in (None, want):
        raise ValueError(f"--layout: schedule={schedule} holds v={want} model chunks per rank, got v={v}; omit v")
    return want


def cost_layout(
    cfg: ModelConfig,
    hw: Hardware,
    lay: Layout,
    *,
    seq_len: int,
    gpus_per_node: int | None = None,
    activations: str = "production",
    overlap: str = DEFAULT_OVERLAP,
    mem_util: float = MEM_UTIL,
    rank: bool = True,
    precision: str = "bf16",
    mesh_order: str = "tp-cp-dp-pp",
    search: dict | None = None,
) -> dict:
    """The layout's memory (bytes by category), step (seconds by part), MFU, fit and margin, and its
    rank: 1 + the planner's candidates that are faster, ``rank`` of the ``of`` layouts that fit for the
    same GPUs, sequence and batch, and ``rank_recompute`` of ``of_recompute`` among those that fit with
    this layout's recomputation setting (a layout that does not fit gets the rank its time would have);
    ``search``: ``plan``'s options that narrow the layouts ranked against (schedules, zeros, recomputes)."""
    g = hw.devices_per_node if gpus_per_node is None else gpus_per_node
    gpus = lay.dp * lay.tp * lay.pp * lay.cp
    memory = memory_breakdown(cfg, lay, seq_len, "flash", activations)
    base = step_cost(
        cfg,
        hw,
        **lay.degrees,
        zero=lay.zero,
        micro_batch=lay.micro_batch,
        microbatches=lay.microbatches,
        recompute=lay.recompute,
        seq_len=seq_len,
        gpus_per_node=g,
        overlap=overlap,
        precision=precision,
        mesh_order=mesh_order,
        grad_bytes=GRAD_REDUCE_BYTES[activations],
        placement=stage_placement(lay.schedule),
    )
    imbalance = stage_imbalance(cfg, seq_len, lay.pp, lay.schedule, lay.v, lay.ends)
    cost = with_schedule(
        base, pp=lay.pp, microbatches=lay.microbatches, schedule=lay.schedule, v=lay.v, imbalance=imbalance
    )
    total, budget = sum(memory.values()), hw.capacity_bytes * mem_util
    out = {
        "layout": str(lay),
        "gpus": gpus,
        "memory_bytes": memory,
        "memory_total": total,
        "fits": total <= budget,
        "margin_bytes": budget - total,
        "step": cost.as_dict(),
        "mfu": cost.mfu(gpus, hw.peak_bf16_flops),
        "rope_scaling": cfg.rope_scaling_note(seq_len),  # past max_position_embeddings: what is assumed
    }
    if rank and planned_units(cfg) > MAX_UNITS:  # too many units to search: this layout alone
        out["unranked"] = f"{planned_units(cfg):,} units, past the {MAX_UNITS:,} a search takes"
    elif rank:
        batch = lay.dp * lay.micro_batch * lay.microbatches
        options = dict(gpus_per_node=g, mem_util=mem_util, activations=activations, overlap=overlap)
        options |= dict(precision=precision, mesh_order=mesh_order, **(search or {}))
        for suffix, narrow in (("", {}), ("_recompute", {"recomputes": (lay.recompute,)})):
            p = plan(cfg, hw, gpus=gpus, seq_len=seq_len, global_batch=batch, **(options | narrow))
            out["rank" + suffix] = 1 + sum(c.cost.total < cost.total for c in p.candidates)
            out["of" + suffix] = len(p.candidates)
            if not suffix and p.candidates:  # what would work instead, on the same GPUs
                best = p.candidates[0]
                out["fastest_that_fits"] = {"layout": str(best.layout), "step_s": best.cost.total}
    return out
