"""Activation memory per layer: the paper's GPT-3 formula beside our exact count, against sequence length.

Pure: rows from ``playbook.theory.inventory.activations.korthikanti_vs_exact`` -> a plotly figure.
"""

from __future__ import annotations

import plotly.graph_objects as go

from playbook.viz.figures import figure_layout, unit_scale

SERIES = {  # row key -> legend
    "korthikanti": "Korthikanti et al. (GPT-3 block, dropout): 34sbh + 5as²b",
    "ours": "ours, exact (Llama-style, no dropout)",
    "ours_selective": "ours, attention recomputed (selective)",
}


def activation_formulas_figure(rows: list[dict], *, unit: str = "GB", title: str = "") -> go.Figure:
    """One line per series, bytes per layer (in ``unit``) against sequence length on a log2 axis."""
    scale = unit_scale(unit)
    x = [r["seq_len"] for r in rows]
    fig = go.Figure()
    for key, name in SERIES.items():
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[r[key] / scale for r in rows],
                name=name,
                mode="lines+markers",
                hovertemplate=f"s=%{{x}}: %{{y:.3g}} {unit}<extra></extra>",
            )
        )
    return figure_layout(
        fig,
        title=title,
        xaxis=dict(title="sequence length s", type="log", tickvals=x),
        yaxis=dict(title=f"activations per layer ({unit}, log scale)", type="log"),
        legend=dict(x=0.01, y=0.99),
    )


__all__ = ["SERIES", "activation_formulas_figure"]
