"""Show the planner: the ranked layouts, why the top ones win, and why the others were rejected.

Pure functions from a :class:`playbook.theory.plan.planner.Plan` (or its candidates) to rows for
``viz.table.table`` and to plotly figures; no processes, no widgets. The step time is the planner's
own breakdown (``playbook.theory.plan.cost.StepCost``): compute, the *exposed* communication of
each mesh axis (what overlap with compute does not hide), and the pipeline bubble (Narayanan et
al. 2021, arXiv:2104.04473, §2.2, §3.3): fill and drain, and the wait on the busiest stage
(``theory.plan.stage_balance``). The bars of a candidate sum to its predicted step time.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.theory.plan.search import Candidate, Plan
from playbook.viz.figures import figure_layout
from playbook.viz.mesh_layout import AXIS_COLORS

COMPUTE, BUBBLE = "#3b7dd8", "#9e9e9e"
AXES = ("tp", "cp", "ep", "pp", "dp")  # the planner's axes, listed in its rank order (dp last: outermost)
REASONS = {
    "memory": "does not fit: weights, gradients, optimizer state and activations exceed the device",
    "tp crosses nodes": "tensor parallelism would cross nodes: its per-layer collectives need NVLink",
    "pipeline not filled": "fewer micro-batches than stages: 1F1B never fills its pipeline",
    "global batch split": "the global batch does not split evenly over the data-parallel ranks",
    "ep without experts": "expert parallelism on a model without experts",
    "not modelled": "a combination the memory model does not cover yet",
}


def _candidates(plan_or_candidates: Plan | Sequence[Candidate], top: int | None) -> list[Candidate]:
    cands = plan_or_candidates.candidates if isinstance(plan_or_candidates, Plan) else list(plan_or_candidates)
    return cands[:top]


def candidate_rows(plan: Plan | Sequence[Candidate], top: int | None = 8) -> list[dict]:
    """One row per candidate, fastest first: layout, memory on the fullest GPU, step time and its
    parts, MFU and tokens per second."""
    return [
        {
            "layout": f"#{i + 1} {c.layout}",
            "memory / GPU (GB)": c.memory / 1e9,
            "step (s)": c.cost.total,
            "compute (s)": c.cost.compute,
            "exposed comm (s)": c.cost.exposed,
            "bubble (s)": c.cost.bubble,
            "MFU": f"{c.mfu:.1%}",
            "tokens / s": round(c.tokens_per_s),
        }
        for i, c in enumerate(_candidates(plan, top))
    ]


def rejected_rows(plan: Plan) -> list[dict]:
    """The layouts the planner turned down, grouped by reason (most first), with one example each;
    and the slower variants of kept layouts, which are not rejections but are not shown."""

    def why(kind: str) -> str:
        if kind == "seq_len vs the model":
            return "the sequence does not split into equal chunks over the cp ranks"
        if kind == "pp vs the model":  # stages may be uneven: pp need not divide the layers
            return "more pipeline stages than the model has layers"
        if kind == "tp vs the model":
            return "tp does not divide the heads, KV heads, ffn width or vocabulary"
        if kind == "ep vs the model":
            return "ep does not divide the experts (or the model has none)"
        return REASONS.get(kind, kind)

    rows = [
        {"reason": why(kind), "kind": kind, "layouts": n, "for example": example}
        for kind, (n, example) in sorted(plan.rejected.items(), key=lambda kv: -kv[1][0])
    ]
    if plan.dominated:
        rows.append(
            {
                "reason": "fits, but a faster variant of the same degrees also fits",
                "kind": "dominated",
                "layouts": plan.dominated,
                "for example": "another ZeRO stage, micro-batch size or recomputation of the same degrees runs faster",
            }
        )
    return rows


def breakdown(c: Candidate) -> dict[str, float]:
    """Seconds of ``c``'s step by part: compute, exposed communication per axis, bubble (sum = total)."""
    parts = {"compute": c.cost.compute}
    for axis in AXES:
        if axis in c.cost.axes:
            parts[f"exposed {axis}"] = c.cost.axes[axis][1]
    parts["bubble"] = c.cost.bubble
    return parts


def step_breakdown(plan: Plan | Sequence[Candidate], *, top: int | None = 8, title: str = "") -> go.Figure:
    """Stacked horizontal bars, one per candidate (fastest on top). Left, the whole step: compute,
    each axis's exposed communication, the bubble (they add up to the step). Right, the same parts
    but compute, on their own scale: at real scale compute is most of every step, and what ranks the
    candidates is the rest. The label at the end gives the step time and MFU; hover shows each
    axis's whole communication beside its exposed part."""
    cands = _candidates(plan, top)
    labels = [f"#{i + 1} {c.layout}" for i, c in enumerate(cands)]
    parts = [breakdown(c) for c in cands]
    names = ["compute"] + [f"exposed {a}" for a in AXES if any(f"exposed {a}" in p for p in parts)] + ["bubble"]
    fig = make_subplots(
        rows=1,
        cols=2,
        shared_yaxes=True,
        column_widths=[0.4, 0.6],
        horizontal_spacing=0.03,
        subplot_titles=("the whole step", "beyond compute: what tells them apart"),
    )
    for name in names:
        axis = name.split()[-1]
        comm = [c.cost.axes.get(axis, (0.0, 0.0))[0] for c in cands]
        hover = (
            "%{y}<br>"
            + name
            + ": %{x:.3g} s"
            + ("<br>all of its communication: %{customdata:.3g} s" if name.startswith("exposed") else "")
            + "<extra></extra>"
        )
        color = COMPUTE if name == "compute" else BUBBLE if name == "bubble" else AXIS_COLORS[axis]
        for col in (1, 2) if name != "compute" else (1,):
            bar = go.Bar(
                name=name,
                y=labels,
                x=[p.get(name, 0.0) for p in parts],
                orientation="h",
                marker_color=color,
                customdata=comm,
                hovertemplate=hover,
                legendgroup=name,
                showlegend=col == 1,
            )
            fig.add_trace(bar, row=1, col=col)
    rest = [c.cost.total - c.cost.compute for c in cands]
    for label, c, r in zip(labels, cands, rest):
        fig.add_annotation(
            x=r, y=label, text=f" {c.cost.total:.3g} s, MFU {c.mfu:.0%}", showarrow=False, xanchor="left", row=1, col=2
        )
    figure_layout(fig, title=title or "predicted step time, by part", height=170 + 34 * len(cands))
    fig.update_layout(barmode="stack", legend=dict(x=1.02, y=1, traceorder="normal"), margin=dict(l=10, r=10))
    fig.update_xaxes(title_text="seconds per step", row=1, col=1)
    fig.update_xaxes(title_text="seconds beyond compute", range=[0, max(rest, default=1.0) * 1.6], row=1, col=2)
    # fastest on top by the category order, not autorange="reversed" (a live widget lost that on redraw)
    return fig.update_yaxes(categoryorder="array", categoryarray=labels[::-1], automargin=True)


def replay_rows(rows: Sequence[dict], what: str) -> list[dict]:
    """A replay's rows (``parallel.hybrid.replay.Replay.rows``) of one kind (``"bytes sent"`` or
    ``"memory"``) as one table row per rank, each cell "predicted / measured" in bytes; † marks a
    prediction that needed the run's routing (a mixture of experts)."""
    out: dict[int, dict] = {}
    for r in rows:
        if r["what"] == what:
            cell = " / ".join("—" if x is None else f"{x:,}" for x in (r["predicted"], r["measured"]))
            cell += "" if r.get("before_run", True) else " †"
            out.setdefault(r["rank"], {"rank": r["rank"]})[r["key"]] = cell
    return [out[k] for k in sorted(out)]


__all__ = ["breakdown", "candidate_rows", "rejected_rows", "replay_rows", "step_breakdown"]
