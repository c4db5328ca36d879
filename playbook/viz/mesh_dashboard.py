"""The hybrid chapter's dashboard: pick the degrees of an 8-rank layout, see it predicted, run it.

Controls for dp, tp, pp, cp and ep (their product must be the 8 ranks; ep borrows ranks from dp·cp
and adds none), the model (``gpt-tiny`` or the mixture of experts ``gpt-tiny-moe``), sequence
parallelism and the ZeRO stage. Every change redraws three figures of ``playbook.viz.mesh`` with the
predictions of ``playbook.theory.hybrid.hybrid``: the rank grid (``rank_grid``), bytes each rank sends per
step on every mesh axis (``comm_per_axis`` into ``bytes_per_axis``) and memory per rank by category
(``memory_per_rank``). A layout that ``Plan.check`` refuses is explained in one red line (its
``ValueError``) and the figures keep the last valid layout, marked stale. The button runs the layout
on 8 real ranks (``train_hybrid``) and overlays what each rank measured (``comm_table``).

Nothing is computed here that ``theory/`` and ``parallel/`` do not already do; the layout order and
the per-axis bytes follow Narayanan et al. 2021 (arXiv:2104.04473, §3.3) as the chapter does.
"""

from __future__ import annotations

import html
import os
import time
from dataclasses import replace

import ipywidgets as w
import plotly.graph_objects as go

from playbook.dims import ParallelDims
from playbook.theory.hybrid.plan import Plan
from playbook.parallel.hybrid.parallelize import train_hybrid
from playbook.parallel.training import TrainSetup
from playbook.theory.hybrid.hybrid import comm_per_axis
from playbook.theory.hybrid.hybrid import memory_per_rank as predict_memory
from playbook.viz.figures import FIT_WIDTH
from playbook.viz.mesh import bytes_per_axis, memory_per_rank
from playbook.viz.mesh_layout import rank_grid
from playbook.viz.widgets import GREY, RED, fit_controls, mark_stale, show_figure

WORLD = 8
MODELS = ("gpt-tiny", "gpt-tiny-moe")
DEGREES = ("dp", "tp", "pp", "cp", "ep")
WIDTH = FIT_WIDTH  # the narrowest cell a chapter is read in (1280 px, file browser open)


def plan_from(setup: TrainSetup, values: dict) -> Plan:
    """The ``Plan`` of the controls' ``values`` ({dp, tp, pp, cp, ep, zero, sequence_parallel}),
    checked for ``setup``: raises one ``ValueError`` naming the constraint and what works."""
    d = {k: values[k] for k in DEGREES}
    world = d["dp"] * d["tp"] * d["pp"] * d["cp"]
    if world != WORLD:
        raise ValueError(
            f"dp·tp·pp·cp = {d['dp']}·{d['tp']}·{d['pp']}·{d['cp']} = {world}: the degrees must multiply to the "
            f"{WORLD} ranks (ep borrows from dp·cp), e.g. dp2·tp2·pp2 or dp8"
        )
    plan = Plan(ParallelDims(**d), zero=values["zero"], sequence_parallel=values["sequence_parallel"])
    plan.check(setup)
    return plan


def predicted_rows(setup: TrainSetup, plan: Plan) -> list[dict]:
    """Per rank, ``comm_table``'s shape with predictions only: ``{rank, coords, predicted, measured: {},
    memory}``, ``memory`` the predicted bytes by category (a MoE's activations need the routing of a
    run: None)."""
    cfg, dims = setup.config(), plan.dims
    rows = []
    for r in range(dims.world):
        layout = dict(
            rank=r,
            global_batch=setup.global_batch,
            seq_len=setup.seq_len,
            sequence_parallel=plan.sequence_parallel,
            cp_variant=plan.cp_variant,
            schedule=plan.schedule,
            microbatches=plan.m,
        )
        rows.append(
            {
                "rank": r,
                "coords": dims.coords(r),
                "predicted": comm_per_axis(cfg, dims, zero=plan.zero, **layout),
                "measured": {},
                "memory": predict_memory(cfg, dims, zero=plan.zero, **layout),
            }
        )
    return rows


# What each ZeRO stage shards (Rajbhandari et al. 2020, §5: P_os, P_os+g, P_os+g+p).
SHARDED = {1: "Adam's state", 2: "Adam's state and gradients", 3: "Adam's state, gradients and weights"}


def notes(setup: TrainSetup, plan: Plan, measured: bool) -> list[str]:
    """What the predicted figures leave out for this layout, one sentence each."""
    cfg, out = setup.config(), []
    if plan.zero:
        out.append(
            f"ZeRO-{plan.zero}: {SHARDED[plan.zero]} sharded over dp×cp as chapter 2 shards them; "
            "its data-axis bytes are one reduce-scatter and "
            + (
                "two all-gathers (parameters forward and backward)"
                if plan.zero == 3 and plan.dims.pp == 1
                else "one all-gather per step"
            )
            + (", the same for stages 1 and 2" if plan.zero < 3 or plan.dims.pp > 1 else "")
            + ("; routed experts over the ranks holding the same experts" if plan.dims.ep > 1 else "")
        )
    if plan.dims.dp * plan.dims.cp == 1 and plan.zero:
        out.append("with dp·cp = 1 ZeRO has no ranks to shard over: nothing changes")
    if cfg.is_moe and not measured:
        out.append(
            "a mixture of experts routes tokens at run time: its all-to-all (ep) bytes and its activations "
            "need the routing of a run; press the button"
        )
    return out


def _drop_measured(fig: go.Figure) -> go.Figure:
    fig.data = [t for t in fig.data if t.name != "measured"]
    return fig


def hybrid_dashboard(cluster=None, setup: TrainSetup | None = None) -> w.VBox:
    """Degrees of an 8-rank layout -> the rank grid, bytes per rank per axis and memory per rank.

    ``cluster``: what the button runs on (``playbook.cluster.ranks(8)``, or anything with
    ``run(fn, *args, **kwargs)`` returning every rank's answer); if it is missing or not 8 ranks, the
    button asks ``ranks(8)`` for the notebook's shared set when pressed. ``setup``: steps, batch and
    sequence (default ``TrainSetup()``); its model is the model control's value.

    Returns a ``VBox`` with extra attributes: ``controls`` (dp, tp, pp, cp, ep, model,
    sequence_parallel, zero), ``figures`` (grid, bytes, memory: live ``go.FigureWidget``), ``message``
    (the red line of a refused layout, else empty), ``notes``, ``status`` (the button's), ``button``,
    ``run`` (the button's callback) and ``measurements`` (``comm_table`` rows by layout).
    """
    base = setup or TrainSetup()
    style = {"description_width": "60px", "button_width": "44px"}
    wide = lambda: w.Layout(width="300px")  # noqa: E731  (narrower, the label wraps above the buttons)
    degree = lambda name, v: w.ToggleButtons(  # noqa: E731
        options=[1, 2, 4, 8], value=v, description=name, style=style, layout=wide()
    )
    c = {
        "dp": degree("dp", 2),
        "tp": degree("tp", 2),
        "pp": degree("pp", 2),
        "cp": degree("cp", 1),
        "ep": degree("ep", 1),
        "model": w.Dropdown(
            options=MODELS, value=base.model if base.model in MODELS else MODELS[0], description="model"
        ),
        "sequence_parallel": w.Checkbox(value=False, description="sequence parallel (with tp)"),
        "zero": w.ToggleButtons(options=[0, 1, 2, 3], value=0, description="ZeRO", style=style, layout=wide()),
    }
    c["model"].style = {"description_width": "60px"}
    fit_controls([c["sequence_parallel"]])
    figs = {"grid": go.FigureWidget(), "bytes": go.FigureWidget(), "memory": go.FigureWidget()}
    message, note_box, status = w.HTML(), w.HTML(), w.HTML()
    button = w.Button(description=f"run on {WORLD} real ranks", icon="play", button_style="primary")
    button.layout.width = "200px"
    measurements: dict[tuple, list[dict]] = {}
    state: dict = {"plan": None, "setup": None}

    def key(s: TrainSetup, plan: Plan) -> tuple:
        return (s, plan)

    def draw() -> None:
        s, plan = state["setup"], state["plan"]
        rows = measurements.get(key(s, plan))
        name = (
            f"{plan.dims}, {s.model}"
            + (", SP" if plan.sequence_parallel else "")
            + (f", ZeRO-{plan.zero}" if plan.zero else "")
        )
        show_figure(figs["grid"], rank_grid(plan.dims, devices_per_node=WORLD, title=f"{name}: where each rank sits"))
        lines = notes(s, plan, measured=rows is not None)
        if rows is None:
            sent = _drop_measured(bytes_per_axis(predicted_rows(s, plan), title=f"{name}: bytes per step, predicted"))
        else:
            sent = bytes_per_axis(rows, title=f"{name}: bytes per step, predicted beside measured on {WORLD} ranks")
        if rows is None or not any(v is not None for r in rows for v in r["memory"]["measured"].values()):
            held = memory_per_rank(predicted_rows(s, plan), title=f"{name}: memory per rank, predicted")
            held.update_yaxes(title_text="bytes (KB), predicted")
            if rows is not None:  # a run that measured no memory by category: say so, keep the prediction
                lines.append("this run measured no memory by category: memory predicted")
        else:
            held = memory_per_rank(rows, title=f"{name}: memory per rank measured (◆ predicted total)")
        if not sent.data:
            sent.add_annotation(text="no communication", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
        show_figure(figs["bytes"], sent.update_layout(width=WIDTH))  # wide enough for the title beside the legend
        show_figure(figs["memory"], held.update_layout(width=WIDTH))
        note_box.value = "".join(f"<div style='color:{GREY}'>• {html.escape(t)}</div>" for t in lines)

    def update(_change=None) -> None:
        v = {k: ctl.value for k, ctl in c.items()}
        try:
            s = replace(base, model=v["model"])
            plan = plan_from(s, v)
        except ValueError as e:
            message.value = (
                f"<span style='color:{RED}'><b>Cannot lay out:</b> {html.escape(str(e))}</span>"
                f"<span style='color:{GREY}'> (the figures show the last valid layout)</span>"
            )
            mark_stale(*figs.values())
            button.disabled = True
            return
        message.value = ""
        button.disabled = False
        state.update(plan=plan, setup=s)
        draw()

    def run(_button=None) -> None:
        """Run the current layout on the ranks and overlay what they measured."""
        from playbook.parallel.hybrid.merge import comm_table

        s, plan = state["setup"], state["plan"]
        if plan is None or button.disabled:
            status.value = f"<span style='color:{RED}'>pick a valid layout first (see the red line)</span>"
            return
        ranks = cluster
        if ranks is None or getattr(ranks, "world_size", WORLD) != WORLD:
            from playbook.cluster import ranks as shared_ranks

            ranks = shared_ranks(WORLD)
        status.value = f"running {plan.dims} ({s.model}, {s.steps} steps) on {WORLD} ranks…"
        t0, load = time.perf_counter(), os.getloadavg()[0]
        try:
            answers = ranks.run(train_hybrid, s, plan, progress=False)
        except Exception as e:  # the ranks say why (RankError, RankTimeout): show it, keep the dashboard
            status.value = f"<span style='color:{RED}'><b>run failed:</b> {html.escape(str(e).splitlines()[0])}</span>"
            return
        rows = comm_table(answers, s, plan)
        measurements[key(s, plan)] = rows
        pairs = [(r["predicted"].get(a, 0), r["measured"].get(a, 0)) for r in rows for a in set(r["measured"])]
        exact = sum(p == m for p, m in pairs)
        status.value = (
            f"last run: {plan.dims}, {s.model}, in {time.perf_counter() - t0:.1f} s (load average {load:.2f} on "
            f"{os.cpu_count()} cores): predicted == measured on {exact} of {len(pairs)} rank·axis pairs"
        )
        if state["plan"] == plan and state["setup"] == s:
            draw()

    for ctl in c.values():
        ctl.observe(update, names="value")
    button.on_click(run)
    update()

    degrees = w.VBox([c[k] for k in DEGREES])
    options = w.VBox([c["model"], c["sequence_parallel"], c["zero"], button, status])
    box = w.VBox(
        [w.HBox([degrees, options]), message, note_box, figs["grid"], figs["bytes"], figs["memory"]],
    )
    box.controls, box.figures, box.message, box.notes, box.status = c, figs, message, note_box, status
    box.button, box.run, box.update, box.measurements = button, run, update, measurements
    return box


__all__ = ["hybrid_dashboard", "notes", "plan_from", "predicted_rows"]
