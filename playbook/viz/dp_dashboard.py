"""Chapter 1's dashboard: controls (model, device, ranks, bucket size, tokens, MFU, gradient dtype)
-> one data-parallel rank's predicted step with and without overlap (``predicted_step``: ``playbook.viz.dp``'s
``predict_both`` and ``predicted_timelines``), and a line of numbers under it.
"""

from __future__ import annotations


import ipywidgets as w
import plotly.graph_objects as go

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.dp.buckets import bucket_cap_bytes
from playbook.viz.dp import predict_both, predicted_timelines
from playbook.viz.figures import format_value
from playbook.viz.widgets import dense_presets, fit_controls, mark_stale, refusal, show_figure


def _summary(cfg, hw, world_size, both) -> str:
    late, early = both["after backward"], both["overlapped"]
    ms = lambda s: f"{s * 1e3:,.2f} ms" if s >= 1e-3 else f"{s * 1e6:,.1f} µs"  # noqa: E731
    buf = sum(b.bytes for b in early.plan)
    size = f"{format_value(buf / 1e9)} GB" if buf >= 1e9 else f"{format_value(buf / 1e6)} MB"
    return "<br>".join(
        [
            f"<b>{cfg.name}</b> on {world_size} × {hw.name}: {len(early.plan)} bucket{'s' if len(early.plan) != 1 else ''}, {size} of gradients all-reduced per step.",
            f"Compute {ms(early.forward + early.backward + early.optimizer)}; all-reduce {ms(early.comm)} in total.",
            f"Step <b>{ms(late.total)}</b> with the all-reduces after backward, <b>{ms(early.total)}</b> overlapped "
            f"({ms(early.exposed_comm)} of communication left exposed).",
        ]
    )


def predicted_step(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    world_size: int,
    bucket_mb: float,
    tokens_per_rank: int,
    seq_len: int,
    mfu: float,
    grad_dtype: str,
) -> tuple[dict, go.Figure]:
    """One rank's step for the dashboard's control values (``predict_both``: buckets of ``bucket_mb``
    MiB, at least one sequence per rank, 2- or 4-byte gradients) and its figure (``predicted_timelines``)."""
    both = predict_both(
        cfg,
        hw,
        world_size=world_size,
        bucket_bytes=bucket_cap_bytes(bucket_mb),
        tokens=max(tokens_per_rank, seq_len),
        seq_len=seq_len,
        mfu=mfu,
        grad_bytes=2 if grad_dtype == "bf16" else 4,
    )
    title = f"predicted step of one rank: {cfg.name}, {world_size} × {hw.name}, buckets of {bucket_mb:g} MiB"
    return both, predicted_timelines(both, title=title)


def dp_dashboard(
    *,
    model: str = "llama-3.1-8b",
    hardware: str = "h100-sxm",
    world_size: int = 8,
    bucket_mb: float = 25,
    tokens_per_rank: int = 8192,
    seq_len: int = 4096,
    mfu: float = 0.4,
    grad_dtype: str = "bf16",
    measured: go.Figure | None = None,
) -> w.VBox:
    """Predicted step of one data-parallel rank, with and without overlap, for a model preset, a
    hardware profile, a world size and a bucket size; below it, ``measured`` (e.g. the timeline of
    the last real run, from :func:`compare_timelines`). Returns a ``VBox`` with ``figure``,
    ``controls`` (name -> widget) and ``message`` attributes."""
    c = {
        "model": w.Dropdown(options=dense_presets(), value=model, description="model"),
        "hardware": w.Dropdown(options=Hardware.presets(), value=hardware, description="device"),
        "world_size": w.SelectionSlider(options=[2**k for k in range(0, 11)], value=world_size, description="ranks"),
        "bucket_mb": w.SelectionSlider(
            options=[0.01, 0.1, 0.5, 1, 5, 25, 100, 1000], value=bucket_mb, description="bucket MiB"
        ),
        "tokens_per_rank": w.SelectionSlider(
            options=[2**k for k in range(6, 18)], value=tokens_per_rank, description="tokens/rank"
        ),
        "seq_len": w.SelectionSlider(options=[2**k for k in range(5, 16)], value=seq_len, description="seq_len"),
        "mfu": w.FloatSlider(min=0.05, max=1.0, step=0.05, value=mfu, description="MFU"),
        "grad_dtype": w.ToggleButtons(options=["bf16", "fp32"], value=grad_dtype, description="gradients"),
    }
    fit_controls(c.values())
    fig, message = go.FigureWidget(), w.HTML()

    def update(_change=None) -> None:
        v = {k: ctl.value for k, ctl in c.items()}
        try:
            cfg, hw = ModelConfig.preset(v.pop("model")), Hardware.preset(v.pop("hardware"))
            both, new = predicted_step(cfg, hw, **v)
        except ValueError as e:
            message.value = refusal("Cannot predict", e)
            mark_stale(fig)
            return
        show_figure(fig, new)
        message.value = _summary(cfg, hw, v["world_size"], both)

    for ctl in c.values():
        ctl.observe(update, names="value")
    update()
    left = w.VBox([c["model"], c["hardware"], c["world_size"], c["bucket_mb"]])
    right = w.VBox([c["tokens_per_rank"], c["seq_len"], c["mfu"], c["grad_dtype"]])
    children = [w.HBox([left, right]), fig, message]
    if measured is not None:
        children += [w.HTML("<b>Measured</b>: the last real run on this machine"), go.FigureWidget(measured)]
    box = w.VBox(children)
    box.figure, box.controls, box.message, box.update = fig, c, message, update
    return box
