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
    :func:`playbook.theory.cost.ring.ring_allreduce_steps`."""
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
        height=110 + 48 * n,
        margin=dict(l=10, r=10, t=50, b=10),
        plot_bgcolor="white",
        showlegend=False,
    )
    return fig


# ---- chapter 3: where f and g sit in a transformer layer ---------------------------------------
_REGION_COLORS = {"replicated": "#d9d9d9", "split by heads / channels": "#9ecae1", "split by sequence": "#a1d99b"}


def tp_block_layout(*, sequence_parallel: bool) -> list[dict]:
    """The ops of one transformer layer in order, as data: compute boxes with the layout of their
    activations, and the communication operators between them with their forward and backward.

    Tensor parallelism: Shoeybi et al. 2019 (Megatron-LM, arXiv:1909.08053), Figure 3, operators f and
    g. Sequence parallelism: Korthikanti et al. 2022 (arXiv:2205.05198), Figure 5, operators g
    (all-gather forward, reduce-scatter backward) and ḡ (its conjugate)."""
    if sequence_parallel:
        enter = {"kind": "comm", "label": "g", "forward": "all-gather (s)", "backward": "reduce-scatter (s)"}
        leave = {"kind": "comm", "label": "ḡ", "forward": "reduce-scatter (s)", "backward": "all-gather (s)"}
        outside = "split by sequence"
    else:
        enter = {"kind": "comm", "label": "f", "forward": "identity", "backward": "all-reduce"}
        leave = {"kind": "comm", "label": "g", "forward": "all-reduce", "backward": "identity"}
        outside = "replicated"
    ops = []
    for norm, body in (("RMSNorm", "attention<br>(QKV col, out row)"), ("RMSNorm", "MLP<br>(gate/up col, down row)")):
        ops.append({"kind": "compute", "label": norm, "region": outside})
        ops.append(dict(enter))
        ops.append({"kind": "compute", "label": body, "region": "split by heads / channels"})
        ops.append(dict(leave))
        ops.append({"kind": "compute", "label": "+ residual", "region": outside})
    return ops


def tp_block_diagram(*, title: str = "") -> go.Figure:
    """Two rows: the tensor-parallel layer (f and g around attention and the MLP) and the
    sequence-parallel one (g and ḡ), boxes coloured by how their activations are split across t ranks."""
    shapes, notes = [], []
    rows = (("tensor parallel (Megatron)", False), ("+ sequence parallel (Korthikanti Fig. 5)", True))
    for row, (name, sp) in enumerate(rows):
        y = (1 - row) * 3.2
        notes.append(dict(x=-0.2, y=y + 1.55, text=f"<b>{name}</b>", showarrow=False, xanchor="left"))
        x = 0.0
        for op in tp_block_layout(sequence_parallel=sp):
            if op["kind"] == "compute":
                w = 1.9 if "<br>" in op["label"] else 1.2
                shapes.append(
                    dict(
                        type="rect",
                        x0=x,
                        x1=x + w,
                        y0=y,
                        y1=y + 1,
                        fillcolor=_REGION_COLORS[op["region"]],
                        line=dict(color="#555", width=1),
                        name=f"{name}: {op['label']}",
                    )
                )
                notes.append(dict(x=x + w / 2, y=y + 0.5, text=op["label"], showarrow=False, font=dict(size=10)))
            else:
                w = 1.1
                shapes.append(
                    dict(
                        type="circle",
                        x0=x + 0.3,
                        x1=x + 0.8,
                        y0=y + 0.25,
                        y1=y + 0.75,
                        fillcolor="#fdae6b",
                        line=dict(color="#e6550d", width=2),
                        name=f"{name}: {op['label']}",
                    )
                )
                notes.append(dict(x=x + 0.55, y=y + 0.5, text=f"<b>{op['label']}</b>", showarrow=False))
                notes.append(
                    dict(
                        x=x + 0.55,
                        y=y - 0.35,
                        showarrow=False,
                        font=dict(size=9),
                        text=f"fwd: {op['forward']}<br>bwd: {op['backward']}",
                    )
                )
            x += w + 0.25
        shapes.append(dict(type="line", x0=-0.1, x1=x - 0.2, y0=y + 0.5, y1=y + 0.5, layer="below", line=dict(width=1)))
    for i, (region, color) in enumerate(_REGION_COLORS.items()):
        shapes.append(
            dict(type="rect", x0=i * 5.5, x1=i * 5.5 + 0.4, y0=-1.9, y1=-1.5, fillcolor=color, line=dict(width=1))
        )
        notes.append(dict(x=i * 5.5 + 0.55, y=-1.7, text=f"activations {region}", showarrow=False, xanchor="left"))
    fig = go.Figure()
    fig.update_layout(
        shapes=shapes,
        annotations=notes,
        title=title or "one transformer layer on t ranks: where the communication operators sit",
        xaxis=dict(visible=False, range=[-0.4, x + 0.2]),
        yaxis=dict(visible=False, range=[-2.2, 5.0]),
        height=380,
        margin=dict(l=10, r=10, t=50, b=10),
        plot_bgcolor="white",
        showlegend=False,
    )
    return fig


# ---- chapter 5: Ulysses' all-to-all ------------------------------------------------------------
_RANK_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def ulysses_owners(n: int, heads: int) -> dict[str, list[list[int]]]:
    """Which rank holds block (sequence chunk i, head j) before and after Ulysses' all-to-all
    (Jacobs et al. 2023, *DeepSpeed Ulysses*, arXiv:2309.14509, §3.1): sequence-sharded before,
    head-sharded after. Each rank keeps 1/n of its data and sends 1/n to each of the others."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(_RANK_COLORS):
        raise ValueError(f"n must be an integer rank count from 1 to {len(_RANK_COLORS)}, got {n!r}")
    if heads % n:
        raise ValueError(
            f"Ulysses needs the head count divisible by n: {heads} heads over {n} ranks; try n in "
            f"{[d for d in range(1, len(_RANK_COLORS) + 1) if heads % d == 0]}"
        )
    per = heads // n
    return {
        "before": [[i for _ in range(heads)] for i in range(n)],
        "after": [[j // per for j in range(heads)] for i in range(n)],
    }


def ulysses_figure(n: int = 4, heads: int = 8, *, title: str = "") -> go.Figure:
    """Two grids (rows: sequence chunks, columns: heads), each block coloured by the rank holding it:
    before the all-to-all (rank i has chunk i of every head) and after (rank r has every chunk of
    heads r·a/n … (r+1)·a/n − 1)."""
    owners = ulysses_owners(n, heads)
    shapes, notes = [], []
    for panel, (key, label) in enumerate((("before", "before: split by sequence"), ("after", "after: split by heads"))):
        x0 = panel * (heads + 3)
        notes.append(dict(x=x0 + heads / 2, y=n + 0.5, text=f"<b>{label}</b>", showarrow=False))
        for i, row in enumerate(owners[key]):
            for j, r in enumerate(row):
                shapes.append(
                    dict(
                        type="rect",
                        x0=x0 + j,
                        x1=x0 + j + 0.92,
                        y0=n - 1 - i,
                        y1=n - 0.08 - i,
                        fillcolor=_RANK_COLORS[r],
                        line=dict(width=0),
                        name=f"{key} chunk {i} head {j}: rank {r}",
                    )
                )
            if panel == 0:
                notes.append(dict(x=-0.2, y=n - 0.5 - i, text=f"tokens {i}·s/{n}…", showarrow=False, xanchor="right"))
        notes.append(dict(x=x0 + heads / 2, y=-0.4, text=f"heads 0 … {heads - 1}", showarrow=False))
    notes.append(dict(x=heads + 1.5, y=n / 2, text="<b>all-to-all</b><br>→", showarrow=False, font=dict(size=13)))
    for r in range(n):
        notes.append(
            dict(
                x=heads + 1.5,
                y=n / 2 - 0.9 - 0.45 * r,
                text=f"rank {r}",
                showarrow=False,
                font=dict(color=_RANK_COLORS[r]),
            )
        )
    fig = go.Figure()
    fig.update_layout(
        shapes=shapes,
        annotations=notes,
        title=title or f"Ulysses on {n} ranks, {heads} heads: the all-to-all before attention",
        xaxis=dict(visible=False, range=[-4.5, 2 * heads + 3.5]),
        yaxis=dict(visible=False, range=[-0.9, n + 0.9], scaleanchor="x"),
        height=100 + 50 * n,
        margin=dict(l=10, r=10, t=50, b=10),
        plot_bgcolor="white",
        showlegend=False,
    )
    return fig
