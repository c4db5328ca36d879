"""Show context parallelism: who computes which attention block at which ring step, per-rank work,
memory and bytes as the sequence and the number of ranks change.

Figures are pure (data -> plotly figure; they read ``playbook.theory.cp``); ``playbook.viz.cp_dashboard``
wires controls to them, as ``playbook.viz.widgets`` does for memory.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.config import ModelConfig
from playbook.theory import cp as th
from playbook.viz.figures import format_value

RANK_COLORS = ["#3b7dd8", "#e4572e", "#52a852", "#f1c453", "#8a63b8", "#2aa198", "#d36fa5", "#9c6b30"]
LATER, ALL_RANKS = "#e6e6e6", "#7f8fa6"
VARIANT_COLORS = {"ring": "#3b7dd8", "allgather": "#e4572e", "ulysses": "#52a852"}


def _rank_color(r: int) -> str:
    return RANK_COLORS[r % len(RANK_COLORS)]


def _cells(n: int, zigzag: bool, causal: bool, variant: str) -> list[tuple[int, int, int | None, int, str, bool]]:
    """(q_chunk, k_chunk, rank or None for "every rank", step, label, wasted) per block computed;
    ``wasted``: fully masked, computed and thrown away (all-gather and Ulysses do not skip)."""
    chunks = th.shard_chunks(n, zigzag)
    owner = {c: r for r, cs in enumerate(chunks) for c in cs}
    m = 2 * n if zigzag else n
    if variant == "ring":
        return [
            (b.q_chunk, b.k_chunk, b.rank, b.step, f"r{b.rank} t{b.step}" + (" ◺" if b.diagonal else ""), False)
            for b in th.ring_schedule(n, zigzag, causal)
        ]
    if variant == "allgather":  # one step: each rank's queries against every gathered key
        return [(p, q, owner[p], 0, f"r{owner[p]}", causal and q > p) for p in range(m) for q in range(m)]
    return [(p, q, None, 0, "all", causal and q > p) for p in range(m) for q in range(m)]


def score_matrix(
    n: int,
    *,
    zigzag: bool = False,
    causal: bool = True,
    variant: str = "ring",
    step: int | None = None,
    seq_len: int | None = None,
    title: str = "",
) -> go.Figure:
    """The attention score matrix in chunks (rows: query chunks, columns: key chunks, in sequence
    order), each computed block coloured by the rank that computes it. Ring: blocks of ring steps
    before ``step`` are faded, those after it grey, those at it bright; blank cells are skipped
    (fully masked). All-gather computes every block of its query rows at once, masked ones too
    (pale); Ulysses computes every block on every rank, for heads/n heads each.

    One ``go.Heatmap`` per (rank, phase): ``trace.name`` says which, ``z`` is 1 on its cells."""
    if variant not in th.VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(th.VARIANTS)}; got {variant!r}")
    m = 2 * n if zigzag else n
    step = n - 1 if step is None else step
    groups: dict[tuple[str, int | None], list] = {}
    for p, q, rank, t, label, wasted in _cells(n, zigzag, causal, variant):
        if wasted:
            phase = "masked, computed anyway"
        else:
            phase = "now" if t == step or variant != "ring" else ("earlier" if t < step else "later")
        groups.setdefault((phase, rank), []).append((p, q, label))
    fig = go.Figure()
    order = {"later": 0, "masked, computed anyway": 1, "earlier": 2, "now": 3}
    for (phase, rank), cells in sorted(
        groups.items(), key=lambda kv: (order[kv[0][0]], -1 if kv[0][1] is None else kv[0][1])
    ):
        color = LATER if phase == "later" else (ALL_RANKS if rank is None else _rank_color(rank))
        who = "every rank (heads/n each)" if rank is None else f"rank {rank}"
        z = [[None] * m for _ in range(m)]
        text = [[""] * m for _ in range(m)]
        for p, q, label in cells:
            z[p][q], text[p][q] = 1, label
        fig.add_trace(
            go.Heatmap(
                z=z,
                text=text,
                texttemplate="%{text}",
                textfont=dict(size=max(7, 13 - m // 2)),
                colorscale=[[0, color], [1, color]],
                showscale=False,
                xgap=2,
                ygap=2,
                opacity={"earlier": 0.45, "masked, computed anyway": 0.3}.get(phase, 1.0),
                name=f"{who}, {phase}" if variant == "ring" or phase != "now" else who,
                hovertemplate=f"{who}, {phase}<br>query chunk %{{y}}, key chunk %{{x}}<br>%{{text}}<extra></extra>",
            )
        )
    shown = sorted({r for (_, r) in groups}, key=lambda r: -1 if r is None else r)
    for rank in shown:
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name="every rank, heads/n each" if rank is None else f"rank {rank}",
                marker=dict(symbol="square", size=12, color=ALL_RANKS if rank is None else _rank_color(rank)),
            )
        )
    if variant == "ring" and any(ph == "later" for ph, _ in groups):
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name="later steps",
                marker=dict(symbol="square", size=12, color=LATER),
            )
        )
    chunk = f" ({seq_len // m:,} tokens each)" if seq_len else ""
    what = f"step {step} of 0..{n - 1} (bright), earlier steps faded" if variant == "ring" else "one step, no ring"
    ticks = list(range(m))
    fig.update_layout(
        height=480,
        width=620,
        title=dict(
            text=title
            or f"{variant}, n={n}, {'zig-zag' if zigzag else 'contiguous'}, "
            f"{'causal' if causal else 'no mask'}: {what}",
            x=0.01,
            xanchor="left",
            font=dict(size=14),
        ),
        xaxis=dict(title=f"key chunk{chunk}", tickvals=ticks, range=[-0.5, m - 0.5], showgrid=False, zeroline=False),
        yaxis=dict(
            title="query chunk", tickvals=ticks, range=[m - 0.5, -0.5], showgrid=False, zeroline=False, scaleanchor="x"
        ),
        margin=dict(l=60, r=20, t=50, b=50),
        legend=dict(orientation="v", x=1.02, y=1),
        plot_bgcolor="white",
        showlegend=True,
    )
    return fig


def work_bars(work: dict[str, list[float]], *, unit: str = "blocks", title: str = "") -> go.Figure:
    """Per-rank work for several series (e.g. ``{"contiguous, predicted": [...], "contiguous,
    measured": [...], ...}``): grouped bars, one group per rank. Series whose name contains
    "measured" are hatched, so predicted and measured pairs read side by side."""
    fig = go.Figure()
    for i, (name, values) in enumerate(work.items()):
        layout = name.split(",")[0]
        color = "#3b7dd8" if "zig" in layout else "#e4572e"
        fig.add_trace(
            go.Bar(
                x=[f"rank {r}" for r in range(len(values))],
                y=values,
                name=name,
                marker_color=color,
                marker_pattern_shape="/" if "measured" in name else "",
                text=[format_value(v) for v in values],
                textposition="outside",
                hovertemplate=f"{name}<br>%{{x}}: %{{y}} {unit}<extra></extra>",
            )
        )
    fig.update_layout(
        height=380,
        barmode="group",
        yaxis=dict(title=unit),
        title=dict(text=title, x=0.01, xanchor="left"),
        margin=dict(l=70, r=30, t=60, b=50),
    )
    return fig


def cp_scaling(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch: int = 1,
    ns=(1, 2, 4, 8, 16),
    dtype_bytes: int = 2,
    measured: dict | None = None,
    title: str = "",
) -> go.Figure:
    """Two panels against n: activation GB per rank (whole model, ``cp_activation_bytes``) and
    attention MB sent per layer per step (``comm_bytes_per_layer``; none at n = 1), one line per
    variant. Points a variant cannot do (Ulysses with n not dividing the heads, a seq_len that does
    not split) are left out. ``measured``: {variant: {n: (activation bytes, bytes per layer)}},
    drawn as black crosses on top."""
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("activations per rank (GB)", "attention MB sent per layer per step")
    )
    for variant in th.VARIANTS:
        pts = []
        for n in ns:
            try:
                a = th.cp_activation_bytes(
                    cfg, seq_len=seq_len, micro_batch=micro_batch, cp=n, variant=variant, dtype_bytes=dtype_bytes
                )
                c = th.comm_bytes_per_layer(
                    cfg, seq_len=seq_len, micro_batch=micro_batch, cp=n, variant=variant, dtype_bytes=dtype_bytes
                )
            except ValueError:
                continue
            pts.append((n, a / 1e9, sum(c.values()) / 1e6))
        color = VARIANT_COLORS[variant]
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in pts], y=[p[1] for p in pts], name=variant, legendgroup=variant, line=dict(color=color)
            ),
            1,
            1,
        )
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in pts if p[0] > 1],
                y=[p[2] for p in pts if p[0] > 1],
                name=variant,
                legendgroup=variant,
                line=dict(color=color),
                showlegend=False,
            ),
            1,
            2,
        )
    first = True
    for variant, points in (measured or {}).items():
        for n, (a, c) in sorted(points.items()):
            for col, y in ((1, a / 1e9), (2, c / 1e6)):
                fig.add_trace(
                    go.Scatter(
                        x=[n],
                        y=[y],
                        mode="markers",
                        marker=dict(symbol="x", size=10, color="black"),
                        name="measured",
                        legendgroup="measured",
                        showlegend=first,
                        hovertemplate=f"{variant} measured, n=%{{x}}: %{{y}}<extra></extra>",
                    ),
                    1,
                    col,
                )
                first = False
    for col in (1, 2):
        fig.update_xaxes(type="log", tickvals=list(ns), title="cp ranks n", row=1, col=col)
        fig.update_yaxes(type="log", exponentformat="power", row=1, col=col)
    fig.update_layout(
        height=400,
        title=dict(text=title, x=0.01, xanchor="left"),
        margin=dict(l=70, r=30, t=80, b=50),
    )
    return fig


__all__ = ["cp_scaling", "score_matrix", "work_bars"]
