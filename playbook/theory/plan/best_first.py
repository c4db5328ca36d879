"""One structure's best variant, found best first: the planner's inner loop (pure, no torch).

Within one (dp, tp, pp, cp, ep) the planner wants the fastest variant (micro-batch b, schedule and
v, ZeRO stage, recomputation) that fits, and how many slower ones it skipped. Sorting every variant
by its step time costs each one in full: the data axis for every ZeRO stage and placement, the
schedule's total for every (b, recomputation, schedule, v, ZeRO), though only the first few in that
order are ever tried for memory. Here every variant is reached through two lower bounds, each the
exact float of a sum whose other terms are >= 0:

1. per (b, recomputation): the compute alone (``theory.plan.cost.step_compute``);
2. per (b, recomputation, schedule, v): the schedule's total without the dp axis (the bubble does not
   depend on dp, ``theory.plan.cost.step_cost``; dp's exposed time is added last);
3. per variant: its exact total, ``scheduled_total`` of its cost with the dp axis of its ZeRO stage
   and placement, ordered by (total, −ZeRO, the variant's place in ``theory.plan.search._variants``)
   as the sorted list was.

A heap pops entries in that order; a bound is replaced by what it bounds when it comes first, so
exact totals come out in exactly the sorted order, and only those are tried for memory, as before.
The same candidate, the same counts (``tests/theory/test_plan_best_first.py`` holds it to
:func:`search_exhaustive`, the sort of every variant, kept as the reference).
"""

from __future__ import annotations

import heapq

from playbook.theory.plan.cost import (
    OVERLAP_PRESETS,
    StepCost,
    link,
    scheduled_split,
    scheduled_total,
    step_compute,
    step_cost,
    with_data_axis,
    with_schedule,
)
from playbook.theory.plan.dp import dp_seconds
from playbook.theory.plan.memory import _memory_key, _needs_more, memory_bytes, placement_states
from playbook.theory.plan.schedule import stage_placement
from playbook.theory.plan.search import Candidate, Layout, _modelled, _variants, structure_zeros
from playbook.theory.plan.stage_balance import stage_imbalance
from playbook.theory.pp.schedules import V_SCHEDULES

_MARGIN = 1 - 1e-9  # the compute bound, a hair lower: an imbalance of 1 - ulp must not break the order


class _Search:
    """What one structure's search shares: the plan, the sizes, the memory budget."""

    def __init__(self, cfg, hw, dims, out, *, budget, seq_len, common, timing):
        self.cfg, self.hw, self.dims, self.out, self.budget = cfg, hw, dims, out, budget
        self.seq_len, self.common, self.timing = seq_len, common, timing
        self.degrees = {a: getattr(dims, a) for a in ("dp", "tp", "pp", "cp", "ep")}

    def at(self, layout: Layout) -> dict:
        return self.at_args(layout.microbatches, layout.schedule, layout.v, layout.ends)

    def at_args(self, m: int, schedule: str, v: int, ends: str = "even") -> dict:
        imbalance = stage_imbalance(self.cfg, self.seq_len, self.dims.pp, schedule, v, ends)
        return dict(pp=self.dims.pp, microbatches=m, schedule=schedule, v=v, imbalance=imbalance)

    def layout_args(self, b: int, m: int, rc: str, placement: str) -> dict:
        return dict(**self.degrees, micro_batch=b, microbatches=m, recompute=rc, placement=placement)

    def reject_memory(self, v: Layout, mem: float) -> None:
        gb = self.hw.capacity_bytes / 1e9
        self.out.reject("memory", f"{v} needs {mem / 1e9:.1f} GB per GPU of a {gb:.1f} GB device")

    def try_in_order(self, ordered, total_count: int, base) -> None:
        """Try ``ordered`` (layouts, fastest first) for memory until one fits: the candidate."""
        cfg, out = self.cfg, self.out
        too_big: list[tuple] = []  # (memory key, layout) of variants that did not fit
        states: dict[tuple, tuple] = {}  # each rank's state by ZeRO stage and placement (plan_memory)
        for i, v in enumerate(ordered):
            where = (v.zero, v.schedule in V_SCHEDULES, v.v, v.ends)
            if where not in states:
                states[where] = placement_states(cfg, v, out.activations)
            key = _memory_key(v, states[where])
            for f, _ in too_big:  # grows with b, falls with ZeRO and recomputation
                if _needs_more(key, f):
                    break
            else:
                f = None
            if f is not None:
                seen = "memory" in out.rejected  # the first message is kept: format no other
                out.reject("memory", "" if seen else f"{v} needs more than {too_big[0][1]}, which does not fit")
                continue
            mem = memory_bytes(cfg, v, self.seq_len, out.attention, out.activations)
            if mem <= self.budget:
                cost = with_schedule(base(v), **self.at(v))
                mfu = cost.mfu(out.gpus, self.hw.peak_bf16_flops)
                out.candidates.append(Candidate(v, mem, cost, mfu, out.global_batch * self.seq_len / cost.total))
                out.dominated += total_count - i - 1
                return
            self.reject_memory(v, mem)
            too_big = [(f, w) for f, w in too_big if not _needs_more(f, key)] + [(key, v)]  # keep the minimal


def _least(dims, groups, zeros, recomputes, out, cfg, seq_len):
    """``_modelled`` on the variants that can be the least memory (smallest b, largest ZeRO stage,
    its first schedule, every recomputation): the same refusals, messages and answer as on all of them."""
    b, m, options = groups[0]
    schedule, v = options[0]
    degrees = {a: getattr(dims, a) for a in ("dp", "tp", "pp", "cp", "ep")}
    few = [
        Layout(**degrees, zero=max(zeros), micro_batch=b, microbatches=m, recompute=rc, schedule=schedule, v=v)
        for rc in recomputes
    ]
    kept, need, least = _modelled(cfg, dims, few, seq_len, out)
    return tuple(rc for rc in recomputes if any(x.recompute == rc for x in kept)), need, least


def search_structure(cfg, hw, dims, groups, out, **sizes) -> None:
    """The candidate of one structure (``dims``, its ``groups`` from ``theory.plan.search._variant_groups``),
    best first (module docstring): appended to ``out.candidates``, or its rejections recorded."""
    groups = [g for g in groups if g[2]]
    if not groups:
        return
    zeros = structure_zeros(dims, out)
    recomputes, need, least = _least(dims, groups, zeros, out.recomputes, out, cfg, sizes["seq_len"])
    if not recomputes:
        return
    s = _Search(cfg, hw, dims, out, **sizes)
    if need > s.budget:
        out.reject("memory", f"{least} needs {need / 1e9:.1f} GB per GPU of a {hw.capacity_bytes / 1e9:.1f} GB device")
        if out.smallest is None or need < out.smallest[0]:
            out.smallest = (need, str(least))
        return
    nz, nr = len(zeros), len(recomputes)
    starts, total_count = [], 0  # each b's first place in _variants' order
    for _, _, options in groups:
        starts.append(total_count)
        total_count += len(options) * nz * nr
    timing, common = s.timing, s.common
    plain: dict[tuple, StepCost] = {}  # (b, recompute) -> the step without dp
    full: dict[tuple, float] = {}  # (b, recompute, placement, zero) -> dp's exposed seconds
    split: dict[tuple, tuple] = {}  # (b, recompute, schedule) -> scheduled_split of the step without dp
    ats = [[s.at_args(m, schedule, v) for schedule, v in options] for _, m, options in groups]

    def with_dp(bi, ri, placement, zero) -> StepCost:
        """The step with its data axis: a candidate's cost, as ``with_data_axis`` builds it."""
        b, m, _ = groups[bi]
        args = s.layout_args(b, m, recomputes[ri], placement)
        return with_data_axis(cfg, hw, plain[bi, ri], zero=zero, **args, **timing, **common)

    if dims.dp * dims.cp > 1:  # the data axis's link, for the structure (with_data_axis's own arguments)
        bw, lat, _ = link(hw, "dp", common["gpus_per_node"], timing["mesh_order"], **s.degrees)
        hide = "dp" in OVERLAP_PRESETS[timing["overlap"]]

    def dp_exposed(bi, ri, placement, zero) -> float:
        """The exposed seconds of the data axis ``with_dp`` adds (``theory.plan.dp.dp_seconds``, the same call)."""
        key = (bi, ri, placement, zero)
        if key not in full:
            m = groups[bi][1]
            full[key] = dp_seconds(cfg, bandwidth=bw, latency=lat, zero=zero, compute=plain[bi, ri].compute,
                                   microbatches=m, **s.degrees, grad_bytes=timing["grad_bytes"],
                                   placement=placement, hide=hide)[1]  # fmt: skip
        return full[key]

    def layout(bi, oi, zi, ri) -> Layout:
        b, m, options = groups[bi]
        schedule, v = options[oi]
        return Layout(
            **s.degrees, zero=zeros[zi], micro_batch=b, microbatches=m, recompute=recomputes[ri], schedule=schedule, v=v
        )

    top = -max(zeros)
    heap = []
    for bi, (b, m, _) in enumerate(groups):
        for ri, rc in enumerate(recomputes):
            compute, _ = step_compute(cfg, hw, **s.degrees, micro_batch=b, microbatches=m, recompute=rc,
                                      seq_len=s.seq_len, precision=timing["precision"])  # fmt: skip
            heap.append((compute * _MARGIN, top, -1, 0, (bi, ri)))
    heapq.heapify(heap)
    data = dims.dp * dims.cp > 1

    def ordered():
        while heap:
            _, _, _, kind, item = heapq.heappop(heap)
            if kind == 2:
                yield layout(*item)
            elif kind == 0:  # a (b, recompute): its step without dp, bounding each schedule
                bi, ri = item
                b, m, options = groups[bi]
                args = s.layout_args(b, m, recomputes[ri], "1f1b")
                plain[bi, ri] = step_cost(cfg, hw, zero=zeros[0], data_axis=False, **args, **timing, **common)
                for oi, at in enumerate(ats[bi]):
                    first, rest = split[bi, ri, oi] = scheduled_split(plain[bi, ri], **at)
                    heapq.heappush(heap, (first + rest, top, -1, 1, (bi, ri, oi)))
            else:  # a (b, recompute, schedule): each ZeRO stage's exact total
                bi, ri, oi = item
                first, rest = split[bi, ri, oi]
                placement = stage_placement(groups[bi][2][oi][0])
                for zi, zero in enumerate(zeros):
                    dp = dp_exposed(bi, ri, placement, zero) if data else 0.0
                    idx = starts[bi] + (oi * nz + zi) * nr + ri
                    heapq.heappush(heap, (first + (rest + dp), -zero, idx, 2, (bi, oi, zi, ri)))

    def base(v: Layout):
        bi = next(i for i, g in enumerate(groups) if g[0] == v.micro_batch)
        return with_dp(bi, recomputes.index(v.recompute), stage_placement(v.schedule), v.zero)

    s.try_in_order(ordered(), total_count, base)


def search_exhaustive(cfg, hw, dims, groups, out, **sizes) -> None:
    """The reference for :func:`search_structure`: every variant costed in full and sorted."""
    s = _Search(cfg, hw, dims, out, **sizes)
    variants = list(_variants(dims, out, groups))
    if not variants:
        return
    variants, need, least = _modelled(cfg, dims, variants, s.seq_len, out)
    if not variants:
        return
    if need > s.budget:
        out.reject("memory", f"{least} needs {need / 1e9:.1f} GB per GPU of a {hw.capacity_bytes / 1e9:.1f} GB device")
        if out.smallest is None or need < out.smallest[0]:
            out.smallest = (need, str(least))
        return
    costs: dict[tuple, object] = {}
    for v in variants:
        key = (v.micro_batch, v.recompute, stage_placement(v.schedule), v.zero)
        if key not in costs:
            args = s.layout_args(v.micro_batch, v.microbatches, v.recompute, key[2])
            costs[key] = step_cost(cfg, hw, zero=v.zero, **args, **s.timing, **s.common)

    def base(v: Layout):
        return costs[v.micro_batch, v.recompute, stage_placement(v.schedule), v.zero]

    order = sorted(variants, key=lambda v: (scheduled_total(base(v), **s.at(v)), -v.zero))
    s.try_in_order(order, len(order), base)
