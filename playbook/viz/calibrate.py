"""Show a calibration: measured collective times, the fitted α–β line, and the residuals per collective.

Pure functions from a profile dict (what ``playbook calibrate`` writes, or
``playbook.measure.calibrate.calibrate`` returns) to a plotly figure. Times in microseconds.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from playbook.theory.cost.alpha_beta import model_terms

LABELS = {
    "all_reduce": "all-reduce",
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "all_to_all": "all-to-all",
    "send": "send/recv",
}


def measured_on(profile: Mapping) -> tuple[str, int | None]:
    """(host name, CPUs) of the machine a profile was measured on: its ``host`` and ``cpus`` fields
    (``playbook calibrate`` writes them), else what its ``source`` line says ("… on vm (2 CPUs): …"),
    else ("an unnamed machine", None)."""
    if profile.get("host"):
        return str(profile["host"]), profile.get("cpus")
    said = re.search(r" on (\S+) \((\d+) CPUs\)", str(profile.get("source", "")))
    return (said[1], int(said[2])) if said else ("an unnamed machine", None)


def measured_where(profile: Mapping, here: tuple[str, int | None] | None = None) -> str:
    """One line saying where, when and under what load ``profile`` was measured, and whether that is
    the machine reading it (``here``: (host name, CPUs), this one's by default): a profile shipped from
    another machine is never labelled as this one's."""
    host, cpus = measured_on(profile)
    here = (platform.node(), os.cpu_count()) if here is None else here
    load = profile.get("load_average", {})
    before, after = (load.get(k, [None])[0] for k in ("before", "after"))
    under = (
        f"load average {before:.1f} before, {after:.1f} after"
        if before is not None and after is not None
        else "load not recorded"
    )
    machine = f"{host} ({cpus} CPUs)" if cpus else host
    if (host, cpus) == tuple(here):
        whose = "a machine of this one's name and CPU count"
    else:
        whose = f"not this machine ({here[0] or 'unnamed'}, {here[1]} CPUs): `playbook calibrate --out mine.json` measures it"
    return f"measured on {machine}, {profile.get('date') or 'date not recorded'}, {under}; {whose}"


def fit_rows(profile: Mapping) -> list[dict]:
    """One row per measured point: op, bytes, measured and fitted seconds, relative residual."""
    rows = []
    for op, f in profile["collectives"].items():
        for p in f["points"]:
            steps, wire = model_terms(op, p["bytes"], f["group_size"])
            fitted = steps * f["alpha"] + wire * f["beta"]
            rows.append(
                {
                    "op": op,
                    "bytes": p["bytes"],
                    "measured": p["seconds"],
                    "fitted": fitted,
                    "residual": (p["seconds"] - fitted) / fitted if fitted > 0 else float("nan"),
                }
            )
    return rows


def calibration_figure(profile: Mapping) -> go.Figure:
    """Top: measured time per call (markers) and the α–β fit (line) against buffer size, log–log,
    one colour per collective. Bottom: (measured − fitted) / fitted per point."""
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        row_heights=[0.68, 0.32],
        vertical_spacing=0.06,
        subplot_titles=("time per call: measured (dots) and α–β fit (line)", "residual (measured − fit) / fit"),
    )
    rows = fit_rows(profile)
    colors = ["#e4572e", "#3b7dd8", "#52a852", "#8a63b8", "#f0a202"]
    for i, op in enumerate(profile["collectives"]):
        mine = [r for r in rows if r["op"] == op]
        f = profile["collectives"][op]
        name = f"{LABELS.get(op, op)}: α {f['alpha'] * 1e6:.0f} µs, {f['bandwidth'] / 1e9:.2f} GB/s"
        color = colors[i % len(colors)]
        x = [r["bytes"] for r in mine]
        fig.add_scatter(
            x=x,
            y=[r["measured"] * 1e6 for r in mine],
            mode="markers",
            marker={"color": color, "size": 8},
            name=name,
            legendgroup=op,
            hovertemplate="%{x:,.0f} B: %{y:,.0f} µs measured<extra></extra>",
            row=1,
            col=1,
        )
        fig.add_scatter(
            x=x,
            y=[r["fitted"] * 1e6 for r in mine],
            mode="lines",
            line={"color": color},
            showlegend=False,
            legendgroup=op,
            hovertemplate="%{x:,.0f} B: %{y:,.0f} µs fitted<extra></extra>",
            row=1,
            col=1,
        )
        fig.add_scatter(
            x=x,
            y=[r["residual"] for r in mine],
            mode="markers+lines",
            marker={"color": color},
            line={"color": color, "dash": "dot"},
            showlegend=False,
            legendgroup=op,
            hovertemplate="%{x:,.0f} B: %{y:+.0%}<extra></extra>",
            row=2,
            col=1,
        )
    load = profile.get("load_average", {}).get("before", [float("nan")])[0]
    fig.update_xaxes(type="log", title_text="buffer size (bytes)", row=2, col=1)
    fig.update_xaxes(type="log", row=1, col=1)
    fig.update_yaxes(type="log", title_text="µs per call", row=1, col=1)
    fig.update_yaxes(tickformat="+.0%", zeroline=True, row=2, col=1)
    fig.update_layout(
        height=620,
        title=f"Collectives on {profile.get('ranks', '?')} gloo ranks of {measured_on(profile)[0]}, measured "
        f"{profile.get('date', '')} (load average {load:.2f})",
    )
    return fig
