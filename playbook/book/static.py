"""The live dashboards of the chapters, as figures that work without a kernel.

Each ``static_*`` function builds its dashboard's figure with the same pure builder the live
dashboard calls, over a small grid of control values (:func:`~playbook.book.grid.grid_figure`),
opened at the settings the chapter's cell passes. :data:`STATIC` maps a dashboard's function name to
its static form: the book builder finds a cell whose last line calls that function and shows the
static figure in place of the widget.
"""

from __future__ import annotations

import plotly.graph_objects as go

from playbook.book.grid import grid_figure, nearest, once
from playbook.book.static_parallel import static_cp, static_routing, static_tp
from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.viz.memory_figures import memory_bars
from playbook.viz.widgets import params_label, memory_budgets

MEMORY_MODELS = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b"]
POWERS = [1, 4, 8, 16, 64, 256]


@once
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
    """Chapter 0's memory dashboard (:func:`~playbook.viz.memory_dashboard.memory_dashboard`): training and
    serving memory per rank over model × ZeRO stage × recomputation × dp, the other settings fixed
    at the cell's values. Same budgets (:func:`memory_budgets`), same figure (:func:`memory_bars`)."""
    models = MEMORY_MODELS if model in MEMORY_MODELS else [*MEMORY_MODELS, model]
    hw = Hardware.preset(hardware)

    def build(model, zero, recompute, dp):
        cfg = ModelConfig.preset(model)
        budgets = memory_budgets(
            cfg, seq_len=seq_len, micro_batch=micro_batch, precision=precision, recompute=recompute, zero=zero, dp=dp
        )
        title = f"{cfg.name}: {params_label(cfg.num_params())} params, ZeRO-{zero} over dp={dp}, seq {seq_len:,} × micro-batch {micro_batch}"
        return memory_bars(budgets, unit=unit, capacity=hw.usable_bytes, capacity_label=hw.fit_label, title=title)

    return grid_figure(
        build,
        {"model": models, "zero": [0, 1, 2, 3], "recompute": ["none", "selective", "full"], "dp": POWERS},
        {"model": model, "zero": zero, "recompute": recompute, "dp": nearest(dp, POWERS)},
        note=f"{precision} precision, {hardware}; the notebook's live dashboard has every setting",
    )


@once
def static_zero(
    *,
    model: str = "llama-3.1-8b",
    dp: int = 8,
    stage: int = 1,
    precision: str = "mixed",
    seq_len: int = 4096,
    recompute: str = "selective",
) -> go.Figure:
    """Chapter 2's ZeRO dashboard (:func:`~playbook.viz.zero_dashboard.zero_dashboard`), its memory figure:
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
            capacity=Hardware.preset(smallest).usable_bytes if smallest else None,
            capacity_label=f"smallest device that holds it: {Hardware.preset(smallest).fit_label}" if smallest else "",
            title=f"{cfg.name}: memory per rank, seq {seq:,}, micro-batch 1, {recompute} recomputation"
            + ("" if smallest else " (no single device holds it)"),
        )

    return grid_figure(
        build,
        {"model": models, "stage": [0, 1, 2, 3], "dp": POWERS},
        {"model": model, "stage": stage, "dp": nearest(dp, POWERS)},
        note=f"{precision} precision; the notebook's live dashboard also draws bytes sent per collective",
    )


@once
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
    """Chapter 1's DP dashboard (:func:`~playbook.viz.dp_dashboard.dp_dashboard`): one rank's predicted step,
    all-reduces after backward vs overlapped in buckets, over model × ranks × bucket size."""
    from playbook.viz.dp_dashboard import predicted_step
    from playbook.viz.widgets import dense_presets

    models = [m for m in ("gpt-small", "llama-3.1-8b", "llama-3.1-70b") if m in dense_presets()]
    models = models if model in models else [*models, model]
    buckets = sorted({25, 100, 1000, bucket_mb})  # smaller ones: thousands of bars per frame
    ranks = sorted({2, 8, 64, 512, world_size})
    hw = Hardware.preset(hardware)

    def build(model, world_size, bucket_mb):
        settings = dict(tokens_per_rank=tokens_per_rank, seq_len=seq_len, mfu=mfu, grad_dtype=grad_dtype)
        return predicted_step(ModelConfig.preset(model), hw, world_size=world_size, bucket_mb=bucket_mb, **settings)[1]

    return grid_figure(
        build,
        {"model": models, "world_size": ranks, "bucket_mb": buckets},
        {"model": model, "world_size": world_size, "bucket_mb": bucket_mb},
        kinds={"world_size": "slider", "bucket_mb": "slider"},
        note=f"{tokens_per_rank:,} tokens per rank, MFU {mfu:.0%}, {grad_dtype} gradients",
    )


@once
def static_pipeline(
    *, p: int = 4, m: int = 8, v: int = 2, schedule: str = "1f1b", last_run=None, last_run_label: str = ""
) -> go.Figure:
    """Chapter 4's explorer (:func:`~playbook.viz.pp_dashboard.pipeline_explorer`): the simulated schedule's
    Gantt chart over schedule × p × m (v chunks per rank for the interleaved one, two for the V
    schedules; a setting a schedule refuses, DualPipe-V's m < 2p, says why in its title)."""
    from playbook.theory.pp.simulator import simulate
    from playbook.theory.pp.schedules import SCHEDULES, V_SCHEDULES, chunks_per_rank, make_schedule
    from playbook.viz.pp import gantt

    ps, ms = sorted({2, 4, 8, p}), sorted({1, 2, 4, 8, 16, m})

    def build(schedule, p, m):
        vv = chunks_per_rank(schedule, v)
        tl = simulate(make_schedule(schedule, p, m, vv))
        return gantt(tl, title=f"{schedule}: p={p}, m={m}" + (f", v={vv}" if vv > 1 else "") + " (F = 1, B = 1, W = 1)")

    return grid_figure(
        build,
        {"schedule": [*SCHEDULES, *V_SCHEDULES], "p": ps, "m": ms},
        {"schedule": schedule, "p": p, "m": m},
        kinds={"p": "buttons", "m": "slider"},
        note=f"interleaved: v = {v} chunks per rank; zb-v and dualpipe-v: 2, in a V",
    )


@once
def static_goodput(
    *, gpus: int = 16_384, save: float = 3.0, restart: float = 300.0, failures_per_gpu_hour=None
) -> go.Figure:
    """Chapter 10's goodput dashboard (:func:`~playbook.viz.life.goodput_dashboard`): goodput against the
    checkpoint interval over GPUs × failure rate × save time, the restart fixed at the cell's value."""
    from playbook.theory.life import LLAMA3_FAILURES_PER_GPU_HOUR, cluster_mtbf
    from playbook.viz.life import goodput_figure

    base = failures_per_gpu_hour or LLAMA3_FAILURES_PER_GPU_HOUR
    gpu_grid = sorted({4096, 16_384, 65_536, gpus})
    saves = sorted({1.0, 3.0, 30.0, 300.0, save})

    def build(gpus, rate, save):
        mtbf = cluster_mtbf(gpus, base * rate)
        if save >= 2 * mtbf:
            raise ValueError(f"a {save:g} s save is over two MTBFs ({2 * mtbf:,.0f} s): no interval keeps up")
        title = f"{gpus:,} GPUs, MTBF {mtbf / 3600:.3g} h, save {save:g} s, restart {restart:.0f} s"
        return goodput_figure(save, mtbf, restart, title=title)

    return grid_figure(
        build,
        {"gpus": gpu_grid, "rate": [0.5, 1.0, 2.0], "save": saves},
        {"gpus": gpus, "rate": 1.0, "save": save},
        note="rate: × Llama 3's failures per GPU-hour; the notebook's live dashboard has every setting",
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
    "goodput_dashboard": static_goodput,
}

__all__ = [
    "STATIC",
    "static_cp",
    "static_dp",
    "static_goodput",
    "static_memory",
    "static_pipeline",
    "static_routing",
    "static_tp",
    "static_zero",
]
