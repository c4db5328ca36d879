"""Chapter 7's speculative decoding figures: acceptance and speed-up against k (measured beside
predicted), and where speculation stops paying as the batch grows (a 70B model on 8 H100s).

Pure: rows in, a plotly figure out. Rows come from ``serve.spec_bench.measure`` and
``theory.serving.speculative.batch_curves``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.viz.figures import figure_layout
from playbook.viz.mesh_layout import PALETTE

MEASURED, PREDICTED = "#2f6db5", "#e8893a"


def acceptance_and_speedup(rows: Sequence[Mapping], *, title: str = "") -> go.Figure:
    """Left: tokens per verify against k, measured (markers) and (1 − α^{k+1}) / (1 − α) from the run's α
    (dashed), and the acceptance rate (accepted ÷ drafted) on the right axis; right: speed-up against k, measured and predicted, and the line at 1 below which
    speculation loses. Rows: ``serve.spec_bench.measure(...)["rows"]``."""
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("tokens per verify (and acceptance rate)", "speed-up over plain decoding"),
        horizontal_spacing=0.17,
        specs=[[{"secondary_y": True}, {}]],
    )
    ks = [r["k"] for r in rows]
    fig.add_trace(
        go.Scatter(
            x=ks,
            y=[r["acceptance_rate"] for r in rows],
            name="acceptance rate (right axis)",
            mode="markers+lines",
            marker=dict(symbol="diamond", size=8),
            line=dict(color="#7f7f7f", width=1, dash="dot"),
            hovertemplate="k=%{x}: %{y:.0%} of drafts accepted<extra></extra>",
        ),
        row=1,
        col=1,
        secondary_y=True,
    )
    measured = dict(color=MEASURED, mode="markers+lines", line=dict(width=1))
    predicted = dict(color=PREDICTED, mode="lines", line=dict(dash="dash", width=2))
    pairs = (  # (column, key, the curve's name, its style, its hover)
        (1, "tokens_per_verify", "tokens per verify, measured", measured, "%{y:.2f} tokens"),
        (1, "tokens_per_verify_from_alpha", "tokens per verify, from α (Leviathan §3.1)", predicted, "%{y:.2f} tokens"),
        (2, "speedup_measured", "speed-up, measured", measured, "×%{y:.2f}"),
        (2, "speedup_predicted", "speed-up, predicted from α, c, v", predicted, "×%{y:.2f}"),
    )
    for col, key, name, style, hover in pairs:
        fig.add_trace(
            go.Scatter(
                x=ks,
                y=[r[key] for r in rows],
                name=name,
                line=dict(style["line"], color=style["color"]),
                mode=style["mode"],
                hovertemplate=f"k=%{{x}}: {hover} ({name.split(', ', 1)[1]})<extra></extra>",
            ),
            row=1,
            col=col,
        )
    fig.add_hline(y=1, line=dict(color="#7f7f7f", dash="dot"), row=1, col=2)
    fig.update_xaxes(title_text="draft tokens per step k", tickvals=ks)
    fig.update_yaxes(title_text="tokens", rangemode="tozero", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="accepted", tickformat=".0%", range=[0, 1], row=1, col=1, secondary_y=True)
    fig.update_yaxes(title_text="× plain tokens/s", rangemode="tozero", row=1, col=2)
    return figure_layout(fig, title=title, height=430, legend=dict(orientation="h", y=-0.25))


def batch_crossover(rows: Sequence[Mapping], crossovers: Mapping[int, int | None], *, title: str = "") -> go.Figure:
    """Predicted speed-up against the batch (log) for each k, the line at 1, and each k's crossover
    batch marked. Rows: ``{"k", "batch", "speedup", "verify_bound"}`` (``theory.serving.speculative.batch_curves``)."""
    fig = go.Figure()
    for i, k in enumerate(sorted({r["k"] for r in rows})):
        pts = sorted((r["batch"], r["speedup"], r["verify_bound"]) for r in rows if r["k"] == k)
        color = PALETTE[i % len(PALETTE)]
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in pts],
                y=[p[1] for p in pts],
                name=f"k={k}",
                mode="lines",
                line=dict(color=color, width=2),
                customdata=[p[2] for p in pts],
                hovertemplate=f"k={k}<br>batch %{{x}}: ×%{{y:.2f}}, verify %{{customdata}}-bound<extra></extra>",
            )
        )
        cross = crossovers.get(k)
        if cross is not None:
            fig.add_trace(
                go.Scatter(
                    x=[cross],
                    y=[1],
                    mode="markers+text",
                    marker=dict(color=color, size=9, symbol="x"),
                    text=[f"{cross}"],
                    textposition="top center",
                    showlegend=False,
                    hovertemplate=f"k={k}: stops paying at batch {cross}<extra></extra>",
                )
            )
    fig.add_hline(y=1, line=dict(color="#7f7f7f", dash="dot"))
    fig.update_xaxes(title_text="sequences decoded together (batch)", type="log")
    fig.update_yaxes(title_text="speed-up over plain decoding", rangemode="tozero")
    return figure_layout(fig, title=title, height=430)
