"""Show data parallelism: step timelines (measured and predicted), the bucket plan, scaling, and a
dashboard that predicts a step from a model, a device and a bucket size.

Figures are pure functions from plain data (span dicts as the tracer records them, or as
``playbook.theory.dp.buckets.predict_dp_step`` predicts them; ``Bucket`` objects; rows of numbers) to a
plotly figure. ``playbook.viz.dp_dashboard`` wires controls to them. Times in the figures are milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory.dp.buckets import MIB, Bucket, predict_dp_step
from playbook.viz.figures import fitted_title

# One colour per span name in every DP figure, so naive, bucketed, DDP and predictions read alike.
COLORS = {
    "forward": "#3b7dd8",
    "backward": "#52a852",
    "wait": "#b0b0b0",
    "optimizer": "#8a63b8",
    "all_reduce": "#e4572e",
}
LABELS = {"wait": "waiting for all-reduces", "all_reduce": "all-reduce (comm)"}


# ---- picking spans -----------------------------------------------------------------------------
def step_spans(spans: Iterable[Mapping], window: tuple[float, float], zero: float | None = None) -> list[dict]:
    """The spans that start inside ``window`` (one step's (start, end)), with times in seconds
    since ``zero`` (default: the window's start)."""
    a, b = window
    zero = a if zero is None else zero
    return [
        {**s, "start": s["start"] - zero, "end": s["end"] - zero}
        for s in spans
        if s.get("end") is not None and a <= s["start"] <= b
    ]


def measured_rows(results: Sequence, step: int = -1, label: str = "") -> dict[str, list[dict]]:
    """One row per rank for one step of a DP run (``DPResult`` per rank), on a shared clock that
    starts when the first rank started the step (``perf_counter`` is one clock for every process
    on a machine; ranks are only lined up by their collectives, so they start steps apart)."""
    zero = min(r.windows[step][0] for r in results)
    prefix = f"{label} · " if label else ""
    return {f"{prefix}rank {i}": step_spans(r.spans, r.windows[step], zero) for i, r in enumerate(results)}


# ---- figures -----------------------------------------------------------------------------------
def gantt(rows: Mapping[str, Iterable[Mapping]], *, title: str = "", height: int | None = None) -> go.Figure:
    """Horizontal bars, one row per key of ``rows``, for span dicts with ``kind``, ``name``,
    ``start`` and ``end`` in seconds (and ``bytes`` for communication). One trace per span name
    (colours in :data:`COLORS`); communication drawn thinner on top of compute, so where an
    all-reduce runs *during* backward the two overlap on screen."""
    fig = go.Figure()
    by_name: dict[tuple[str, str], list[tuple[str, Mapping]]] = {}
    for row, spans in rows.items():
        for s in spans:
            by_name.setdefault((s.get("kind", "compute"), s["name"]), []).append((row, s))
    for (kind, name), items in sorted(by_name.items(), key=lambda kv: kv[0][0] == "comm"):
        comm = kind == "comm"
        fig.add_trace(
            go.Bar(
                name=LABELS.get(name, name),
                orientation="h",
                width=0.38 if comm else 0.8,
                y=[row for row, _ in items],
                base=[s["start"] * 1e3 for _, s in items],
                x=[(s["end"] - s["start"]) * 1e3 for _, s in items],
                marker=dict(color=COLORS.get(name, "#7f7f7f"), line=dict(width=0.6, color="white")),
                customdata=[[s.get("bytes", 0) or 0] for _, s in items],
                hovertemplate=f"<b>{name}</b> (%{{y}})<br>start %{{base:.3f}} ms, %{{x:.3f}} ms"
                + ("<br>%{customdata[0]:,} bytes" if comm else "")
                + "<extra></extra>",
            )
        )
    labels = list(rows)
    # the legend's row sits on the plot's top edge: the title hangs above it, a line of margin higher
    head, top = fitted_title(title, 60) if title else (None, 30)
    if head:
        head.update(y=1, yref="container", yanchor="top", pad=dict(t=12))
    fig.update_layout(
        barmode="overlay",
        height=(height or max(240, 110 + 38 * len(labels))) + (top - 60 + 26 if title else 0),
        title=head,
        margin=dict(l=130, r=30, t=top + 26 if title else 30, b=50),
        xaxis=dict(title="time since the step started (ms)", rangemode="tozero"),
        yaxis=dict(categoryorder="array", categoryarray=labels, autorange="reversed"),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
    )
    return fig


def compare_timelines(runs: Mapping[str, Sequence], step: int = -1, title: str = "") -> go.Figure:
    """``{"naive": [DPResult per rank], "bucketed": [...]}`` -> one Gantt chart, one row per
    (run, rank), each run on its own clock starting at its step's start."""
    rows: dict[str, list[dict]] = {}
    for label, results in runs.items():
        rows.update(measured_rows(results, step, label))
    return gantt(
        rows, title=title or f"one training step (step {step if step >= 0 else 'last'}), measured on every rank"
    )


def predicted_timelines(predictions: Mapping[str, object], title: str = "") -> go.Figure:
    """``{"no overlap": DPStepPrediction, "bucketed, overlapped": ...}`` -> a Gantt chart with a
    compute row and a communication row per prediction."""
    rows: dict[str, list[dict]] = {}
    for label, p in predictions.items():
        rows[f"{label} · compute"] = [s for s in p.spans if s["kind"] == "compute"]
        rows[f"{label} · comm"] = [s for s in p.spans if s["kind"] == "comm"]
    return gantt(rows, title=title)


def bucket_plan_figure(
    plan: Sequence[Bucket], cap_bytes: int, measured: Sequence[Sequence[str]] | None = None, title: str = ""
) -> go.Figure:
    """Bytes per bucket as planned (and as measured: the names each all-reduce carried, sized from
    the plan), with the cap as a dashed line; hover lists the parameters in each bucket."""
    numel = {n: k for b in plan for n, k in zip(b.names, b.numels)}
    elt = plan[0].element_bytes if plan else 4
    fig = go.Figure()
    sets = [("planned", [list(b.names) for b in plan], "#9fb7d9")]
    if measured is not None:
        sets.append(("measured", [list(m) for m in measured], "#2f4b7c"))
    for name, buckets, color in sets:
        fig.add_trace(
            go.Bar(
                name=name,
                x=[f"bucket {i}" for i in range(len(buckets))],
                y=[sum(numel[n] for n in b) * elt for b in buckets],
                marker_color=color,
                text=[f"{len(b)} tensors" for b in buckets],
                textposition="outside",
                customdata=["<br>".join(b) for b in buckets],
                hovertemplate="<b>%{x}</b> (" + name + ")<br>%{y:,} bytes<br>%{customdata}<extra></extra>",
            )
        )
    fig.add_hline(
        y=cap_bytes,
        line_dash="dash",
        line_color="#444",
        annotation_text=f"cap {cap_bytes / MIB:.3g} MiB = {cap_bytes:,} bytes",
        annotation_position="top right",
    )
    fig.update_layout(
        barmode="group",
        height=380,
        title=dict(text=title, x=0.01) if title else None,
        yaxis=dict(title="bytes", rangemode="tozero"),
        margin=dict(l=70, r=30, t=60, b=40),
        xaxis_title="in the order the all-reduces start (gradients ready: last layer first)",
    )
    return fig


def scaling_figure(
    strong: Sequence[Mapping], weak: Sequence[Mapping], *, cores: int | None = None, title: str = ""
) -> go.Figure:
    """Throughput (tokens/s of the global batch) against ranks, measured and ideal (baseline ×
    ranks), for strong and weak scaling side by side; a dotted line marks the CPU core count."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("strong: global batch fixed", "weak: batch per rank fixed"))
    for col, rows in ((1, strong), (2, weak)):
        n = [r["ranks"] for r in rows]
        base = rows[0]["tokens_per_s"] / (rows[0]["ranks"] if col == 2 else 1)
        ideal = [base * k for k in n] if col == 2 else [rows[0]["tokens_per_s"] * k / rows[0]["ranks"] for k in n]
        fig.add_trace(
            go.Scatter(
                x=n,
                y=ideal,
                name="ideal (baseline × ranks)",
                mode="lines",
                line=dict(dash="dash", color="#999"),
                showlegend=col == 1,
            ),
            row=1,
            col=col,
        )
        fig.add_trace(
            go.Scatter(
                x=n,
                y=[r["tokens_per_s"] for r in rows],
                name="measured",
                mode="lines+markers",
                line=dict(color="#2f4b7c"),
                showlegend=col == 1,
                text=[f"efficiency {r['efficiency']:.0%}" for r in rows],
                hovertemplate="%{x} ranks: %{y:,.0f} tokens/s, %{text}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        if cores:
            top = max(ideal + [r["tokens_per_s"] for r in rows])
            fig.add_trace(
                go.Scatter(
                    x=[cores, cores],
                    y=[0, top],
                    mode="lines",
                    name=f"ranks = CPU cores ({cores})",
                    line=dict(dash="dot", color="#c62828"),
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(
            title_text="ranks", type="log", tickvals=n, range=[-0.1, math.log10(max(n)) + 0.1], row=1, col=col
        )
        fig.update_yaxes(title_text="tokens / s" if col == 1 else None, rangemode="tozero", row=1, col=col)
    fig.update_layout(
        height=380,
        title=dict(text=title, x=0.01) if title else None,
        margin=dict(l=70, r=30, t=70, b=50),
    )
    return fig


def predict_both(cfg: ModelConfig, hw: Hardware, **kwargs) -> dict[str, object]:
    """The same step predicted without overlap (all-reduces after backward) and with it."""
    return {
        "after backward": predict_dp_step(cfg, hw, overlap=False, **kwargs),
        "overlapped": predict_dp_step(cfg, hw, overlap=True, **kwargs),
    }


__all__ = [
    "COLORS",
    "bucket_plan_figure",
    "compare_timelines",
    "gantt",
    "measured_rows",
    "predict_both",
    "predicted_timelines",
    "scaling_figure",
    "step_spans",
]
