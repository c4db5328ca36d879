"""Static forms of the tensor-, context- and expert-parallel dashboards (chapters 3, 5 and 6); see
:mod:`playbook.book.static` for the idea and the registry that the book builder reads."""

from __future__ import annotations

import plotly.graph_objects as go

from playbook.book.grid import grid_figure, once
from playbook.config import ModelConfig
from playbook.hardware import Hardware


@once
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
    """Chapter 3's TP dashboard (:func:`~playbook.viz.tp_dashboard.tp_dashboard`), its memory figure: weights
    and activations per rank for every valid t, over model × sequence parallelism × seq_len."""
    from playbook.theory.tp.layout import valid_tp
    from playbook.viz.tp_dashboard import tp_memory_bars, tp_mode, tp_numbers
    from playbook.viz.widgets import dense_presets

    models = [m for m in ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b") if m in dense_presets()]
    models = models if model in models else [*models, model]
    seqs = sorted({1024, 4096, 16384, 65536, seq_len})
    hw = Hardware.preset(hardware)

    def build(model, sequence_parallel, seq_len):
        cfg = ModelConfig.preset(model)
        n = tp_numbers(
            cfg,
            tp=tp if tp in (valid := valid_tp(cfg)) else max(valid),
            sequence_parallel=sequence_parallel,
            seq_len=seq_len,
            micro_batch=micro_batch,
            hardware=hw,
            efficiency=efficiency,
            regather=regather,
        )
        mode = tp_mode(sequence_parallel, regather)
        return tp_memory_bars(cfg, n, hw, f" ({mode}, seq {seq_len:,} × {micro_batch})")

    return grid_figure(
        build,
        {"model": models, "sequence_parallel": [False, True], "seq_len": seqs},
        {"model": model, "sequence_parallel": sequence_parallel, "seq_len": seq_len},
        kinds={"seq_len": "slider"},
        note=f"{hardware}; the notebook's live dashboard also draws one layer's communication and time",
    )


@once
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
    """Chapter 5's CP dashboard (:func:`~playbook.viz.cp_dashboard.cp_dashboard`): which rank computes which
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


@once
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
    """Chapter 6's routing dashboard (:func:`~playbook.viz.ep_dashboard.routing_dashboard`): a simulated
    router's tokens per expert, kept and dropped, over experts × top-k × capacity factor."""
    from playbook.theory.moe.capacity import simulate_routing
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
        note=f"router skew {skew} (the live dashboard moves it too), {tokens} tokens × {steps} steps; capacity 0 = no drops",
    )


__all__ = ["static_cp", "static_routing", "static_tp"]
