"""Chapter 5's dashboard: controls (model, device, sequence length, ranks, variant, causal mask,
zig-zag, ring step) -> the score matrix of ``playbook.viz.cp`` and the numbers beside it
(``cp_summary``: per-rank work, memory, bytes, overlap, from ``playbook.theory.cp``).
"""

from __future__ import annotations


import ipywidgets as w
import plotly.graph_objects as go

from playbook.config import ModelConfig
from playbook.hardware import Hardware
from playbook.theory import cp as th
from playbook.viz.cp import score_matrix
from playbook.viz.figures import format_value
from playbook.viz.widgets import fit_controls, mark_stale, refusal, show_figure


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
    ``controls`` and ``message`` attributes, like ``playbook.viz.memory_dashboard.memory_dashboard``."""
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
            message.value = refusal("Cannot do", e)
            mark_stale(fig)
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
        show_figure(fig, new)

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
