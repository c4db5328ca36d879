"""A dashboard without a kernel: one figure builder evaluated over a small grid of control values,
packed into one plotly figure with a frame per grid point and a plotly control per setting.

Plotly's own sliders and menus each jump to one fixed state, so two of them cannot combine by
themselves. Here every control is inert (``method="skip"``) and names its setting in
``layout.meta``; the book's page script (:data:`COMPOSER_JS`) reads the active value of every
control after any change and shows the frame for that combination. Frames carry only what changes
between grid points (trace data, title, annotations, shapes, axis ranges), so a page stays small.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

SEP = "|"  # frame name = the control labels joined by SEP, in control order
TRACE_KEYS = (
    "type",
    "x",
    "y",
    "base",
    "text",
    "customdata",
    "visible",
    "width",
    "marker",
    "orientation",
)  # hovertemplate: from the base trace
LAYOUT_KEYS = ("title", "annotations", "shapes")
AXES = ("xaxis", "yaxis", "yaxis2")
META_KEY = "playbook_grid"  # layout.meta[META_KEY] = {"controls": [...], "sep": SEP}


def _label(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _frame_data(fig: go.Figure, types: Mapping[str, str]) -> list[dict]:
    """One partial trace update per trace name in ``types`` (the union over the grid, name -> trace
    type); a trace absent from this grid point is hidden rather than dropped, so every frame
    addresses the same traces. (A frame's trace without its type would be drawn as a scatter.)"""
    by_name = {t.name: t for t in fig.data}
    out = []
    for name in types:
        trace = by_name.get(name)
        if trace is None:
            out.append({"type": types[name], "visible": False})
            continue
        plain = trace.to_plotly_json()
        out.append({"visible": plain.get("visible", True), **{k: plain[k] for k in TRACE_KEYS if k in plain}})
    return out


def _frame_layout(fig: go.Figure) -> dict:
    """Title, annotations, shapes and whole axes (so an autoranged axis autoranges again)."""
    plain = fig.layout.to_plotly_json()
    out = {k: plain.get(k, [] if k != "title" else {"text": ""}) for k in LAYOUT_KEYS}
    for axis in AXES:
        if axis in plain:
            out[axis] = {"autorange": "range" not in plain[axis], **plain[axis]}
    return out


def grid_figure(
    build: Callable[..., go.Figure],
    controls: Mapping[str, Sequence[Any]],
    start: Mapping[str, Any],
    *,
    kinds: Mapping[str, str] | None = None,
    note: str = "",
) -> go.Figure:
    """``build(**settings)`` for every combination of ``controls`` (setting name -> the values to
    offer), as one figure opened at ``start`` with a control per setting and a frame per combination.

    ``kinds`` picks ``"slider"``, ``"buttons"`` or ``"dropdown"`` per setting (default: buttons for
    up to 4 values, beyond that a dropdown for names and a slider for numbers). A combination ``build`` refuses with ``ValueError`` or ``NotImplementedError``
    gets a frame that says so in its title, as the live dashboard does. ``note`` is written under
    the title (what the grid leaves out, e.g. "the live dashboard in the notebook offers more").
    """
    names = list(controls)
    missing = [n for n in names if start.get(n) not in controls[n]]
    if missing:
        raise ValueError(f"start values must be among the grid's values; not so for {missing}")
    figures: dict[tuple, go.Figure | str] = {}
    for combo in itertools.product(*(controls[n] for n in names)):
        try:
            figures[combo] = build(**dict(zip(names, combo)))
        except (ValueError, NotImplementedError) as e:
            figures[combo] = str(e)
    first = figures[tuple(start[n] for n in names)]
    if isinstance(first, str):
        raise ValueError(f"the start settings {dict(start)} cannot be computed: {first}")
    trace_names: list[str] = []
    templates: dict[str, Any] = {}
    for fig in figures.values():
        for t in fig.data if not isinstance(fig, str) else ():
            if t.name not in templates:
                trace_names.append(t.name)
                templates[t.name] = t
    base = go.Figure(layout=first.layout)
    # one height for the whole grid (the controls sit at fixed pixel offsets): the tallest figure's
    base.layout.height = max((f.layout.height or 450) for f in figures.values() if not isinstance(f, str))
    shown = {t.name for t in first.data}
    for name in trace_names:
        trace = templates[name] if name in shown else templates[name].update(visible=False)
        base.add_trace(next((t for t in first.data if t.name == name), trace))
    frames = []
    for combo, fig in figures.items():
        label = SEP.join(_label(v) for v in combo)
        if isinstance(fig, str):
            data = [{"type": templates[n].type, "visible": False} for n in trace_names]
            layout = {"title": {"text": f"<b>Cannot compute:</b> {fig}"[:160]}, "annotations": [], "shapes": []}
        else:
            data, layout = _frame_data(fig, {n: templates[n].type for n in trace_names}), _frame_layout(fig)
        frames.append(go.Frame(name=label, data=data, layout=layout))
    base.frames = frames
    _add_controls(base, names, controls, start, kinds or {}, note)
    return base


MENU_ROW, SLIDER_ROW, NOTE_ROW = (
    38,
    80,
    44,
)  # the note clears subplot titles  # pixels per control row above / below the plot


def _kind(values: Sequence[Any], kind: str | None) -> str:
    return kind or ("buttons" if len(values) <= 4 else "dropdown" if isinstance(values[0], str) else "slider")


def _add_controls(fig, names, controls, start, kinds, note) -> None:
    """One row per control: menus and buttons above the plot, each named on its left; sliders below."""
    kind = {n: _kind(list(controls[n]), kinds.get(n)) for n in names}
    n_menus = sum(k != "slider" for k in kind.values())
    n_sliders = len(names) - n_menus
    base_t, base_b = fig.layout.margin.t or 60, fig.layout.margin.b or 50
    left = max(fig.layout.margin.l or 70, max((8 * len(n) + 24 for n in names if kind[n] != "slider"), default=0))
    top = base_t + MENU_ROW * n_menus + (NOTE_ROW if note else 0)
    bottom = base_b + SLIDER_ROW * n_sliders
    height = (fig.layout.height or 450) + top - base_t + bottom - base_b
    plot_h = height - top - bottom
    sliders, menus, meta, fixed = [], [], [], []
    for name in names:
        values = list(controls[name])
        labels = [_label(v) for v in values]
        active = values.index(start[name])
        if kind[name] == "slider":
            meta.append({"name": name, "kind": "slider", "index": len(sliders), "labels": labels})
            sliders.append(
                dict(
                    active=active,
                    currentvalue=dict(prefix=f"{name}: ", font=dict(size=13)),
                    y=-(base_b + SLIDER_ROW * len(sliders)) / plot_h,
                    yanchor="top",
                    pad=dict(t=0, b=0),
                    len=0.9,
                    x=0.05,
                    steps=[dict(label=lab, method="skip", args=[]) for lab in labels],
                )
            )
            continue
        y = 1 + (MENU_ROW * (n_menus - len(menus)) + (NOTE_ROW if note else 0) - 4) / plot_h
        meta.append({"name": name, "kind": "menu", "index": len(menus), "labels": labels})
        menus.append(
            dict(
                type="dropdown" if kind[name] == "dropdown" else "buttons",
                direction="down" if kind[name] == "dropdown" else "right",
                active=active,
                showactive=True,
                x=0,
                xanchor="left",
                y=y,
                yanchor="top",
                pad=dict(t=0, b=0, l=0, r=0),
                buttons=[dict(label=lab, method="skip", args=[]) for lab in labels],
            )
        )
        fixed.append(
            dict(
                text=f"<b>{name}</b>",
                xref="paper",
                yref="paper",
                x=0,
                xanchor="right",
                xshift=-10,
                y=y,
                yanchor="top",
                yshift=-6,
                showarrow=False,
            )
        )
    if note:
        fixed.append(
            dict(text=note, xref="paper", yref="paper", x=0, y=1.0, yanchor="bottom", yshift=24, showarrow=False)
        )
    title = fig.layout.title.to_plotly_json() if fig.layout.title else {}
    fig.update_layout(
        sliders=sliders,
        updatemenus=menus,
        height=height,
        margin=dict(t=top, b=bottom, l=left),
        title={**title, "y": 1 - 12 / height, "yanchor": "top", "yref": "container"},
        meta={META_KEY: {"controls": meta, "sep": SEP, "owned": [*LAYOUT_KEYS, *AXES]}},
    )
    # the control names and the note stay put: every frame's annotations end with them
    for target in (fig.layout, *(f.layout for f in fig.frames)):
        target.annotations = [*(target.annotations or ()), *fixed]
        if target.title and target.title.text is not None:
            target.title.update(y=1 - 12 / height, yanchor="top", yref="container")
    if n_sliders and fig.layout.legend.orientation == "h" and (fig.layout.legend.y or 1) < 0:
        fig.layout.legend.update(orientation="v", x=1.02, xanchor="left", y=1, yanchor="top")  # not over a slider


def frame_for(fig: go.Figure, settings: Mapping[str, Any]) -> go.Frame:
    """The frame a reader sees with the controls at ``settings`` (setting -> value)."""
    controls = fig.layout.meta[META_KEY]["controls"]
    name = SEP.join(_label(settings[c["name"]]) for c in controls)
    return next(f for f in fig.frames if f.name == name)


# Shows the frame named by every control's active label (plotly keeps `active` on each control).
# Plotly.react, not Plotly.animate: animate merges layout arrays element by element, so a frame
# with fewer annotations or shapes would keep the previous frame's extra ones.
COMPOSER_JS = """
function playbookGrid(gd, frames) {
  var grid = gd.layout.meta && gd.layout.meta.%(key)s;
  if (!grid || gd._playbookGrid) return;
  gd._playbookGrid = true;
  var byName = {};
  frames.forEach(function (f) { byName[f.name] = f; });
  function show() {
    var labels = grid.controls.map(function (c) {
      var ctl = c.kind === "slider" ? gd.layout.sliders[c.index] : gd.layout.updatemenus[c.index];
      return c.labels[ctl.active || 0];
    });
    var frame = byName[labels.join(grid.sep)];
    if (!frame) return;
    var data = gd.data.map(function (trace, i) { return Object.assign({}, trace, frame.data[i]); });
    var layout = Object.assign({}, gd.layout);
    grid.owned.forEach(function (key) { delete layout[key]; });  // empty arrays do not reach the JSON
    Plotly.react(gd, data, Object.assign(layout, frame.layout));
  }
  gd.on("plotly_sliderchange", show);
  gd.on("plotly_buttonclicked", function () { setTimeout(show, 0); });
}
""" % {"key": META_KEY}


def once(build: Callable[..., go.Figure]) -> Callable[..., go.Figure]:
    """Build each static figure once per process and settings (a grid costs seconds: the book
    build and the tests that inspect the same figure share it). Callers must not mutate it."""
    cache: dict[tuple, go.Figure] = {}

    @functools.wraps(build)
    def cached(**kwargs) -> go.Figure:
        key = tuple(sorted(kwargs.items(), key=lambda kv: kv[0]))
        try:
            hash(key)
        except TypeError:  # an unhashable setting (a measured timeline): build afresh
            return build(**kwargs)
        if key not in cache:
            cache[key] = build(**kwargs)
        return cache[key]

    return cached


def nearest(value, options):
    """``value`` if the grid has it, else the grid's closest value (a cell may start anywhere)."""
    return value if value in options else min(options, key=lambda o: abs(o - value))


__all__ = ["COMPOSER_JS", "SEP", "frame_for", "grid_figure", "nearest", "once"]
