"""Show context parallelism: who computes which attention block at which ring step, per-rank work,
memory and bytes as the sequence and the number of ranks change.

Figures are pure (data -> plotly figure; they read ``playbook.theory.cp``); ``cp_dashboard`` only
wires controls to them, as ``playbook.viz.widgets`` does for memory.
"""

from __future__ import annotations

import html

import ipywidgets as w
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.config import Hardware, ModelConfig
from playbook.theory import cp as th
from playbook.viz.figures import format_value
from playbook.viz.widgets import fit_controls, page_height

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


# ---- the dashboard -----------------------------------------------------------------------------
def cp_summary(
    cfg: ModelConfig,
    hw: Hardware,
    *,
    seq_len: int,
    n: int,
    variant: str,
    causal: bool,
    zigzag: bool,
    micro_batch: int = 1,
    dtype_bytes: int = 2,
) -> str:
    """The numbers beside the score matrix, as HTML: per-rank work, memory, bytes, overlap."""
    th.check_layout(seq_len, n, zigzag)
    if variant == "ulysses":
        th.check_ulysses(n, cfg.n_heads, cfg.kv_heads)
    gb = lambda x: f"{x / 1e9:,.2f} GB"  # noqa: E731
    mb = lambda x: f"{x / 1e6:,.1f} MB"  # noqa: E731
    sizes = dict(seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes)
    acts = th.cp_activation_bytes(cfg, cp=n, variant=variant, causal=causal, **sizes)
    plain = th.cp_activation_bytes(cfg, cp=1, variant="allgather", causal=causal, **sizes)  # n=1: plain attention
    blockwise = th.cp_activation_bytes(cfg, cp=1, variant="ring", causal=causal, **sizes)  # n=1: ring kernel alone
    comm = th.comm_bytes_per_layer(cfg, cp=n, variant=variant, **sizes)
    lines = [
        f"<b>Activations per rank</b> ({cfg.name}, bf16, micro-batch {micro_batch}): {gb(acts)}; "
        f"one device would hold {gb(plain)} with plain attention, {gb(blockwise)} with the ring's "
        f"blockwise kernel (no s² tensors)."
    ]
    if variant == "ring":
        work = th.ring_work_per_rank(seq_len, n, zigzag, causal)
        blocks = th.ring_blocks_per_rank(n, zigzag, causal)
        lines.append(
            f"<b>Blocks per rank</b>: {blocks}; slowest rank does {max(work) / (sum(work) / n):.2f}× "
            f"the mean (imbalance {th.imbalance(work):.0%})."
        )
        kv = th.kv_shard_bytes(cfg, cp=n, seq_len=seq_len, micro_batch=micro_batch, dtype_bytes=dtype_bytes)
        lines.append(f"<b>Bytes per ring step</b>: one K/V shard, {mb(kv)} per layer; {n - 1} steps forward.")
        o = th.overlap(
            cfg,
            cp=n,
            seq_len=seq_len,
            micro_batch=micro_batch,
            peak_flops=hw.peak_bf16_flops,
            bandwidth=hw.intra_node_bandwidth,
            dtype_bytes=dtype_bytes,
            zigzag=zigzag,
        )
        verdict = (
            "<span style='color:#2e7d32'>hidden: compute ≥ transfer</span>"
            if o.hidden
            else "<span style='color:#c62828'>exposed: the ring waits for the link</span>"
        )
        lines.append(
            f"<b>Overlap on {hw.name}</b> ({format_value(hw.intra_node_bandwidth / 1e9)} GB/s): one step computes "
            f"{o.compute_seconds * 1e6:,.1f} µs, sends {o.transfer_seconds * 1e6:,.1f} µs: {verdict}. "
            f"Needs s/n ≥ {o.min_shard_tokens:,.0f} tokens (have {seq_len // n:,})."
        )
    lines.append(
        f"<b>Attention bytes sent per layer per step</b>: {mb(sum(comm.values()))} "
        f"({', '.join(f'{k} {mb(v)}' for k, v in comm.items()) or 'none'})."
    )
    return "<br>".join(lines)


def cp_dashboard(
    *,
    model: str = "llama-3.1-8b",
    seq_len: int = 32768,
    n: int = 4,
    variant: str = "ring",
    causal: bool = True,
    zigzag: bool = False,
    hardware: str = "h100-sxm",
) -> w.VBox:
    """Controls (model, hardware, seq_len, n, variant, causal, zig-zag, ring step) -> the score
    matrix (``score_matrix``) and the summary (``cp_summary``). Returns a VBox with ``figure``,
    ``controls`` and ``message`` attributes, like ``playbook.viz.widgets.memory_dashboard``."""
    c = {
        "model": w.Dropdown(
            options=[p for p in ModelConfig.presets() if not ModelConfig.preset(p).is_moe],
            value=model,
            description="model",
        ),
        "hardware": w.Dropdown(options=Hardware.presets(), value=hardware, description="device"),
        "seq_len": w.SelectionSlider(options=[2**k for k in range(6, 21)], value=seq_len, description="seq_len"),
        "n": w.SelectionSlider(options=[1, 2, 4, 8], value=n, description="cp ranks n"),
        "variant": w.ToggleButtons(options=list(th.VARIANTS), value=variant, description="variant"),
        "causal": w.Checkbox(value=causal, description="causal mask"),
        "zigzag": w.Checkbox(value=zigzag, description="zig-zag layout"),
        "step": w.IntSlider(min=0, max=n - 1, value=0, description="ring step"),
    }
    fit_controls(c.values())
    fig, message = go.FigureWidget(), w.HTML()

    def update(_change=None) -> None:
        v = {k: ctl.value for k, ctl in c.items()}
        c["step"].max = v["n"] - 1
        c["step"].disabled = v["variant"] != "ring"
        try:
            cfg, hw = ModelConfig.preset(v["model"]), Hardware.preset(v["hardware"])
            message.value = cp_summary(
                cfg, hw, seq_len=v["seq_len"], n=v["n"], variant=v["variant"], causal=v["causal"], zigzag=v["zigzag"]
            )
        except ValueError as e:
            message.value = f"<span style='color:#c62828'><b>Cannot do:</b> {html.escape(str(e))}</span>"
            return
        new = score_matrix(
            v["n"],
            zigzag=v["zigzag"],
            causal=v["causal"],
            variant=v["variant"],
            step=min(c["step"].value, v["n"] - 1),
            seq_len=v["seq_len"],
        )
        new.layout.title.text = (
            f"{new.layout.title.text or ''}<br><sup>the numbers below: {cfg.name} on {hw.name}</sup>"
        )
        fig.data = ()
        with fig.batch_update():
            fig.add_traces(new.data)
            fig.layout = page_height(new).layout

    for ctl in c.values():
        ctl.observe(update, names="value")
    update()
    # model and device change only the numbers under the figure (the score matrix is the same for
    # every model), so they sit there, with a line that says so
    numbers_for = w.HTML("<i>the numbers below are for:</i>")
    box = w.VBox(
        [
            w.HBox([w.VBox([c["seq_len"], c["n"]]), w.VBox([c["variant"], c["causal"], c["zigzag"], c["step"]])]),
            fig,
            w.HBox([numbers_for, c["model"], c["hardware"]]),
            message,
        ]
    )
    box.figure, box.controls, box.message, box.update = fig, c, message, update
    return box


__all__ = ["cp_dashboard", "cp_scaling", "cp_summary", "score_matrix", "work_bars"]
