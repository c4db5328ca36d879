"""Chapter 4's explorer: a schedule, stages, micro-batches and costs in; its simulated timeline
(``theory.pp.simulator``), bubble and closed form out.
"""

from __future__ import annotations


import ipywidgets as w
import plotly.graph_objects as go

from playbook.theory.pp.simulator import Timeline, simulate
from playbook.theory.pp.schedules import SCHEDULES, V_SCHEDULES, chunks_per_rank, closed_form, make_schedule
from playbook.viz.widgets import fit_controls, is_stale, mark_stale, refusal, show_figure
from playbook.viz.pp import bubble_vs_m, gantt


def pipeline_explorer(
    *,
    p: int = 4,
    m: int = 8,
    v: int = 2,
    schedule: str = "1f1b",
    last_run: Timeline | None = None,
    last_run_label: str = "",
) -> w.VBox:
    """Controls p, m, v, schedule and a time step -> the Gantt chart up to that step, both bubble
    fractions, and the peak activations per rank (1F1B: p − r; GPipe: m); under it bubble vs m,
    and, if given, the last real run's measured Gantt, titled with ``last_run_label`` (what was run,
    e.g. "1f1b, p=2, m=4") so it is not mistaken for the simulation above it.
    ``.controls``, ``.figure``, ``.message``."""
    c = {
        "schedule": w.ToggleButtons(options=[*SCHEDULES, *V_SCHEDULES], value=schedule, description="schedule"),
        "p": w.IntSlider(min=1, max=8, value=p, description="p (ranks)"),
        "m": w.IntSlider(min=1, max=32, value=m, description="m (micro-b.)"),
        "v": w.IntSlider(min=1, max=4, value=v, description="v (chunks)"),
        "t": w.FloatSlider(min=0, max=1, step=0.02, value=1, description="time", readout_format=".0%"),
    }
    fit_controls(c.values(), "110px")
    fig, bubble_fig, message = go.FigureWidget(), go.FigureWidget(), w.HTML()

    def update(_change=None) -> None:
        s = {k: ctl.value for k, ctl in c.items()}
        is_v = s["schedule"] in V_SCHEDULES  # the V placement: always two chunks per rank
        vv = chunks_per_rank(s["schedule"], s["v"])
        c["v"].disabled = s["schedule"] != "interleaved"  # only the interleaved schedule has a choice of chunks
        c["v"].tooltip = "chunks per rank: the interleaved schedule takes any v; zb-v and dualpipe-v have 2"
        try:
            sched = make_schedule(s["schedule"], s["p"], s["m"], vv)
        except ValueError as e:
            message.value = refusal("Not a valid schedule", e)
            mark_stale(fig)
            if _change is None or _change["owner"] in (c["p"], c["v"]):  # bubble vs m not redrawn for them
                mark_stale(bubble_fig)
            return
        tl = simulate(sched)
        new = gantt(
            tl,
            upto=s["t"] * tl.makespan + 1e-9,
            title=f"{s['schedule']}: p={s['p']}, m={s['m']}"
            + (f", v={vv}" if vv > 1 else "")
            + " (F = 1, B = 1, W = 1)",
        )
        show_figure(fig, new)
        unit = "chunk activations" if vv > 1 else "micro-batches"
        message.value = (
            f"bubble: idle/total <b>{tl.bubble_over_total:.1%}</b>, bubble/ideal <b>{tl.bubble_over_ideal:.1%}</b> "
            + (
                "(V placement: 2p stages, rank r holds r and 2p − 1 − r; no closed form, simulated)<br>"
                if is_v
                else f"(closed form {closed_form(s['schedule'], s['p'], s['m'], vv)['bubble_over_ideal']:.1%})<br>"
            )
            + f"peak activations held per rank ({unit}): until B {tl.peak_in_flight}"
            + (f", until W {tl.peak_held}" if sched.split_backward else "")
            + (
                f"<br><i>{c['v'].description}: off, "
                + ("the V has 2 per rank.</i>" if is_v else "only the interleaved schedule has chunks.</i>")
                if c["v"].disabled
                else ""
            )
        )
        if _change is None or _change["owner"] in (c["p"], c["v"]) or is_stale(bubble_fig):  # depends on p, v only
            show_figure(bubble_fig, bubble_vs_m(s["p"], [1, 2, 4, 8, 16, 32], v=max(2, vv)))

    for ctl in c.values():
        ctl.observe(update, names="value")
    update()
    # the schedules' buttons take a row of their own: beside them the sliders' readouts were cut off
    sliders = w.HBox([w.VBox([c["p"], c["m"]]), w.VBox([c["v"], c["t"]])])
    parts = [c["schedule"], sliders, fig, message, bubble_fig]
    if last_run is not None:
        what = last_run_label or f"p={last_run.p}"
        title = f"measured on real ranks: {what} (fixed; the controls drive the simulation above)"
        parts.append(go.FigureWidget(gantt(last_run, unit="ms", title=title)))
    box = w.VBox(parts)
    box.controls, box.figure, box.bubble_figure, box.message, box.update = c, fig, bubble_fig, message, update
    return box
