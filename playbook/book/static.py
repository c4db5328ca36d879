"""The live dashboards of the chapters, as figures that work without a kernel.

Each ``static_*`` function builds its dashboard's figure with the same pure builder the live
dashboard calls, over a small grid of control values (:func:`~playbook.book.grid.grid_figure`),
opened at the settings the chapter's cell passes. :data:`STATIC` maps a dashboard's function name to
its static form: the book builder finds a cell whose last line calls that function and shows the
static figure in place of the widget.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import plotly.graph_objects as go

from playbook.book.grid import grid_figure
from playbook.config import Hardware, ModelConfig
from playbook.viz.figures import memory_bars
from playbook.viz.widgets import _count, memory_budgets

MEMORY_MODELS = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b"]
POWERS = [1, 4, 8, 16, 64, 256]


def _once(build: Callable[..., go.Figure]) -> Callable[..., go.Figure]:
    """Build each static figure once per process and settings (a grid costs seconds: the book
    build and the tests that inspect the same figure share it). Callers must not mutate it."""
    cache: dict[tuple, go.Figure] = {}

    @functools.wraps(build)
    def cached(**kwargs) -> go.Figure:
        key = tuple(sorted(kwargs.items(), key=lambda kv: kv[0]))
        try:
            hash(key)
        except TypeError:  # an unhashable setting (a measured timeline): build afresh
            return build(**kwargs)
        if key not in cache:
            cache[key] = build(**kwargs)
        return cache[key]

    return cached


def _nearest(value, options):
    """``value`` if the grid has it, else the grid's closest value (a cell may start anywhere)."""
    return value if value in options else min(options, key=lambda o: abs(o - value))


@_once
def static_memory(
    *,
    model: str = "llama-3.1-70b",
    seq_len: int = 4096,
    micro_batch: int = 1,
    precision: str = "mixed",
    recompute: str = "none",
    zero: int = 0,
    dp: int = 8,
    hardware: str = "h100-sxm",
    unit: str = "GB",
) -> go.Figure:
    """Chapter 0's memory dashboard (:func:`~playbook.viz.widgets.memory_dashboard`): training and
    serving memory per rank over model × ZeRO stage × recomputation × dp, the other settings fixed
    at the cell's values. Same budgets (:func:`memory_budgets`), same figure (:func:`memory_bars`)."""
    models = MEMORY_MODELS if model in MEMORY_MODELS else [*MEMORY_MODELS, model]
    hw = Hardware.preset(hardware)

    def build(model, zero, recompute, dp):
        cfg = ModelConfig.preset(model)
        budgets = memory_budgets(
            cfg, seq_len=seq_len, micro_batch=micro_batch, precision=precision, recompute=recompute, zero=zero, dp=dp
        )
        title = f"{cfg.name}: {_count(cfg.num_params())} params, ZeRO-{zero} over dp={dp}, seq {seq_len:,} × micro-batch {micro_batch}"
        return memory_bars(budgets, unit=unit, capacity=hw.memory_bytes, capacity_label=hw.name, title=title)

    return grid_figure(
        build,
        {"model": models, "zero": [0, 1, 2, 3], "recompute": ["none", "selective", "full"], "dp": POWERS},
        {"model": model, "zero": zero, "recompute": recompute, "dp": _nearest(dp, POWERS)},
        note=f"{precision} precision, {hardware}; the notebook's live dashboard has every setting",
    )


@_once
def static_zero(
    *,
    model: str = "llama-3.1-8b",
    dp: int = 8,
    stage: int = 1,
    precision: str = "mixed",
    seq_len: int = 4096,
    recompute: str = "selective",
) -> go.Figure:
    """Chapter 2's ZeRO dashboard (:func:`~playbook.viz.zero.zero_dashboard`), its memory figure:
    bytes per rank over model × ZeRO stage × dp, against the smallest device that holds them."""
    from playbook.viz.zero import STAGE_NAMES, fitting_devices, zero_budget

    models = [m for m in ZERO_MODELS if m != model][:2] + [model]
    models.sort(key=lambda m: ModelConfig.preset(m).num_params())

    def build(model, stage, dp):
        cfg = ModelConfig.preset(model)
        seq = min(seq_len, cfg.max_seq_len)
        budget = zero_budget(cfg, dp=dp, stage=stage, precision=precision, seq_len=seq, recompute=recompute)
        smallest = next((name for name, _, ok in fitting_devices(budget["total"]) if ok), None)
        return memory_bars(
            {f"{STAGE_NAMES[stage]}, dp={dp}": budget},
            unit="GB",
            capacity=Hardware.preset(smallest).memory_bytes if smallest else None,
            capacity_label=f"smallest device that holds it: {smallest}" if smallest else "",
            title=f"{cfg.name}: memory per rank, seq {seq:,}, micro-batch 1, {recompute} recomputation"
            + ("" if smallest else " (no single device holds it)"),
        )

    return grid_figure(
        build,
        {"model": models, "stage": [0, 1, 2, 3], "dp": POWERS},
        {"model": model, "stage": stage, "dp": _nearest(dp, POWERS)},
        note=f"{precision} precision; the notebook's live dashboard also draws bytes sent per collective",
    )


@_once
def static_dp(
    *,
    model: str = "llama-3.1-8b",
    hardware: str = "h100-sxm",
    world_size: int = 8,
    bucket_mb: float = 25,
    tokens_per_rank: int = 8192,
    seq_len: int = 4096,
    mfu: float = 0.4,
    grad_dtype: str = "bf16",
    measured=None,
) -> go.Figure:
    """Chapter 1's DP dashboard (:func:`~playbook.viz.dp.dp_dashboard`): one rank's predicted step,
    all-reduces after backward vs overlapped in buckets, over model × ranks × bucket size."""
    from playbook.theory.buckets import bucket_cap_bytes
    from playbook.viz.dp import dense_presets, predict_both, predicted_timelines

    models = [m for m in ("gpt-small", "llama-3.1-8b", "llama-3.1-70b") if m in dense_presets()]
    models = models if model in models else [*models, model]
    buckets = sorted({25, 100, 1000, bucket_mb})  # smaller ones: thousands of bars per frame
    ranks = sorted({2, 8, 64, 512, world_size})
    hw = Hardware.preset(hardware)

    def build(model, world_size, bucket_mb):
        both = predict_both(
            ModelConfig.preset(model),
            hw,
            world_size=world_size,
            bucket_bytes=bucket_cap_bytes(bucket_mb),
            tokens=max(tokens_per_rank, seq_len),
            seq_len=seq_len,
            mfu=mfu,
            grad_bytes=2 if grad_dtype == "bf16" else 4,
        )
        return predicted_timelines(
            both,
            title=f"predicted step of one rank: {model}, {world_size} × {hardware}, buckets of {bucket_mb:g} MiB",
        )

    return grid_figure(
        build,
        {"model": models, "world_size": ranks, "bucket_mb": buckets},
        {"model": model, "world_size": world_size, "bucket_mb": bucket_mb},
        kinds={"world_size": "slider", "bucket_mb": "slider"},
        note=f"{tokens_per_rank:,} tokens per rank, MFU {mfu:.0%}, {grad_dtype} gradients",
    )


@_once
def static_pipeline(*, p: int = 4, m: int = 8, v: int = 2, schedule: str = "1f1b", last_run=None) -> go.Figure:
    """Chapter 4's explorer (:func:`~playbook.viz.pp.pipeline_explorer`): the simulated schedule's
    Gantt chart over schedule × p × m (v chunks per rank for the interleaved one)."""
    from playbook.theory.schedules import SCHEDULES, make_schedule, simulate
    from playbook.viz.pp import gantt

    ps, ms = sorted({2, 4, 8, p}), sorted({1, 2, 4, 8, 16, m})

    def build(schedule, p, m):
        vv = v if schedule == "interleaved" else 1
        tl = simulate(make_schedule(schedule, p, m, vv))
        return gantt(tl, title=f"{schedule}: p={p}, m={m}" + (f", v={vv}" if vv > 1 else "") + " (F = 1, B = 1, W = 1)")

    return grid_figure(
        build,
        {"schedule": list(SCHEDULES), "p": ps, "m": ms},
        {"schedule": schedule, "p": p, "m": m},
        kinds={"p": "buttons", "m": "slider"},
        note=f"interleaved: v = {v} chunks per rank",
    )


@_once
def static_tp(
    *,
    model: str = "llama-3.1-70b",
    tp: int = 8,
    sequence_parallel: bool = True,
    regather: bool = False,
    seq_len: int = 4096,
    micro_batch: int = 1,
    hardware: str = "h100-sxm",
    efficiency: float = 0.5,
) -> go.Figure:
    """Chapter 3's TP dashboard (:func:`~playbook.viz.tp.tp_dashboard`), its memory figure: weights
    and activations per rank for every valid t, over model × sequence parallelism × seq_len."""
    from playbook.viz.tp import _dense_presets, tp_numbers

    models = [m for m in ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b") if m in _dense_presets()]
    models = models if model in models else [*models, model]
    seqs = sorted({1024, 4096, 16384, 65536, seq_len})
    hw = Hardware.preset(hardware)

    def build(model, sequence_parallel, seq_len):
        cfg = ModelConfig.preset(model)
        n = tp_numbers(
            cfg,
            tp=tp if tp in (valid := _valid_tp(cfg)) else max(valid),
            sequence_parallel=sequence_parallel,
            seq_len=seq_len,
            micro_batch=micro_batch,
            hardware=hw,
            efficiency=efficiency,
            regather=regather,
        )
        mode = ("TP+SP" + (" (shards saved)" if regather else "")) if sequence_parallel else "TP"
        top = max(sum(b.values()) for b in n["budgets"].values())
        unit = "GB" if top >= 1e9 else "MB" if top >= 1e6 else "KB"
        return memory_bars(
            n["budgets"],
            unit=unit,
            capacity=hw.memory_bytes,
            capacity_label=hw.name,
            title=f"{cfg.name} per rank, bf16 weights + activations ({mode}, seq {seq_len:,} × {micro_batch})",
        )

    return grid_figure(
        build,
        {"model": models, "sequence_parallel": [False, True], "seq_len": seqs},
        {"model": model, "sequence_parallel": sequence_parallel, "seq_len": seq_len},
        kinds={"seq_len": "slider"},
        note=f"{hardware}; the notebook's live dashboard also draws one layer's communication and time",
    )


def _valid_tp(cfg) -> list[int]:
    from playbook.theory.tp import valid_tp

    return valid_tp(cfg)


@_once
def static_cp(
    *,
    model: str = "llama-3.1-8b",
    seq_len: int = 32768,
    n: int = 4,
    variant: str = "ring",
    causal: bool = True,
    zigzag: bool = False,
    hardware: str = "h100-sxm",
) -> go.Figure:
    """Chapter 5's CP dashboard (:func:`~playbook.viz.cp.cp_dashboard`): which rank computes which
    block of the attention scores, over variant × n × zig-zag × ring step."""
    from playbook.theory import cp as th
    from playbook.viz.cp import score_matrix

    def build(variant, n, zigzag, step):
        if step >= n:
            raise ValueError(f"a ring of n={n} ranks has steps 0..{n - 1}")
        return score_matrix(n, zigzag=zigzag, causal=causal, variant=variant, step=step, seq_len=seq_len)

    ns = sorted({2, 4, n})  # a score matrix costs ~0.3 s: the grid stays small
    return grid_figure(
        build,
        {"variant": list(th.VARIANTS), "n": ns, "zigzag": [False, True], "step": list(range(max(ns)))},
        {"variant": variant, "n": n, "zigzag": zigzag, "step": 0},
        kinds={"step": "slider"},
        note=f"{'causal' if causal else 'full'} attention, seq {seq_len:,}; the ring step applies to the ring variant",
    )


@_once
def static_routing(
    *,
    n_experts: int = 8,
    top_k: int = 2,
    capacity_factor: float = 1.25,
    skew: float = 0.0,
    tokens: int = 256,
    steps: int = 10,
    ep: int = 4,
    hidden: int = 64,
    last_run=None,
    layer: int = 0,
) -> go.Figure:
    """Chapter 6's routing dashboard (:func:`~playbook.viz.ep.routing_dashboard`): a simulated
    router's tokens per expert, kept and dropped, over experts × top-k × capacity factor."""
    from playbook.theory.moe import simulate_routing
    from playbook.viz.ep import routing_figure

    def build(n_experts, top_k, capacity_factor):
        if top_k > n_experts:
            raise ValueError(f"top_k={top_k} exceeds n_experts={n_experts}")
        sim = simulate_routing(
            n_experts=n_experts,
            top_k=top_k,
            tokens=tokens,
            capacity_factor=capacity_factor or None,
            skew=skew,
            steps=steps,
        )
        return routing_figure(
            sim.counts, sim.kept, sim.capacity, title=f"simulated router: {n_experts} experts, top-{top_k}"
        )

    return grid_figure(
        build,
        {
            "n_experts": sorted({4, 8, 16, n_experts}),
            "top_k": sorted({1, 2, top_k}),
            "capacity_factor": sorted({0.0, 1.25, 2.0, capacity_factor}),
        },
        {"n_experts": n_experts, "top_k": top_k, "capacity_factor": capacity_factor},
        kinds={"capacity_factor": "slider"},
        note=f"router skew {skew}, {tokens} tokens per step over {steps} steps; capacity factor 0 = no dropping "
        "(a simulated router costs ~0.5 s: the live dashboard also moves the skew)",
    )


ZERO_MODELS = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b"]
STATIC = {
    "memory_dashboard": static_memory,
    "dp_dashboard": static_dp,
    "zero_dashboard": static_zero,
    "pipeline_explorer": static_pipeline,
    "tp_dashboard": static_tp,
    "cp_dashboard": static_cp,
    "routing_dashboard": static_routing,
}

__all__ = [
    "STATIC",
    "static_cp",
    "static_dp",
    "static_memory",
    "static_pipeline",
    "static_routing",
    "static_tp",
    "static_zero",
]
