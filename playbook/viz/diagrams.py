"""Teaching diagrams drawn with plotly shapes: pure functions, data in, figure out.

- :func:`ring_allreduce_figure`: the ring all-reduce as reduce-scatter + all-gather (Patarasuk & Yuan 2009).
"""

from __future__ import annotations

import plotly.graph_objects as go

# light to dark: how many ranks' contributions a chunk holds (1 … n)
_SHADES = ["#deebf7", "#9ecae1", "#6baed6", "#3182bd", "#08519c", "#08306b", "#041f45", "#02122a"]
_SENT = "#e6550d"


def _shade(k: int, n: int) -> str:
    """Colour for a chunk holding k of n contributions; the complete sum always gets the darkest used."""
    if k >= n:
        return "#08306b"
    return _SHADES[min(k - 1, len(_SHADES) - 1)]


def ring_allreduce_figure(steps: list[dict], *, title: str = "") -> go.Figure:
    """One column per moment (start, then each of the 2(n−1) steps), one row per rank; each cell shows
    the rank's n chunks, shaded and labelled by how many ranks' contributions the chunk holds. The
    chunk a rank just received is outlined. ``steps`` comes from
    :func:`playbook.theory.ring.ring_allreduce_steps`."""
    n = len(steps[0]["held"])
    cell_w, gap = n + 1.0, 1.0
    fig = go.Figure()
    shapes, notes = [], []
    for col, st in enumerate(steps):
        x0 = col * (cell_w + gap)
        received = {(dst, c) for _, dst, c in st["sends"]}
        for r, chunks in enumerate(st["held"]):
            y = (n - 1 - r) * 1.6
            for c, contrib in enumerate(chunks):
                k = len(contrib)
                got = (r, c) in received
                shapes.append(
                    dict(
                        type="rect",
                        x0=x0 + c,
                        x1=x0 + c + 0.9,
                        y0=y,
                        y1=y + 0.9,
                        fillcolor=_shade(k, n),
                        line=dict(color=_SENT if got else "white", width=3 if got else 1),
                        name=f"step {col} rank {r} chunk {c}: {k}/{n}",
                    )
                )
                notes.append(
                    dict(
                        x=x0 + c + 0.45,
                        y=y + 0.45,
                        text=str(k),
                        showarrow=False,
                        font=dict(size=11, color="white" if k > n // 2 else "black"),
                    )
                )
        label = "start" if st["phase"] == "start" else f"{'RS' if st['phase'] == 'reduce-scatter' else 'AG'} {col}"
        notes.append(dict(x=x0 + n / 2 - 0.05, y=n * 1.6 + 0.1, text=f"<b>{label}</b>", showarrow=False))
    for r in range(n):
        notes.append(dict(x=-0.4, y=(n - 1 - r) * 1.6 + 0.45, text=f"rank {r}", showarrow=False, xanchor="right"))
    rs_end = (n - 1) * (cell_w + gap) + n + 0.5
    shapes.append(dict(type="line", x0=rs_end, x1=rs_end, y0=-0.4, y1=n * 1.6 + 0.5, line=dict(dash="dot", width=1)))
    width = len(steps) * (cell_w + gap)
    notes.append(
        dict(
            x=rs_end / 2,
            y=-0.7,
            text=f"reduce-scatter: n−1 = {n - 1} steps, each rank adds a received chunk",
            showarrow=False,
        )
    )
    notes.append(
        dict(
            x=(rs_end + width) / 2,
            y=-0.7,
            text=f"all-gather: n−1 = {n - 1} steps, complete chunks travel on",
            showarrow=False,
        )
    )
    fig.update_layout(
        shapes=shapes,
        annotations=notes,
        title=title or f"ring all-reduce on {n} ranks: numbers = contributions summed in each chunk",
        xaxis=dict(visible=False, range=[-2.5, width]),
        yaxis=dict(visible=False, range=[-1.2, n * 1.6 + 0.6], scaleanchor="x"),
        height=170 + 60 * n,
        margin=dict(l=10, r=10, t=50, b=10),
        plot_bgcolor="white",
        showlegend=False,
    )
    return fig
