"""The what-if explorer's two figures, drawn into existing ``FigureWidget`` s in place.

1. :func:`draw_efficiency`: predicted scaling efficiency vs P, one line per method (the
   method's colour from :mod:`~gtopk_lab.plotting.figures_base`), a launched study's
   measured points as diamonds of the same colour, the chosen P as a dotted line; the
   title says the setting, the line under it the costs and where they come from
   (:func:`title_and_note`);
2. :func:`draw_breakdown`: compute, selection and communication per method at the chosen
   P, stacked horizontal bars (three traces whatever the methods).

The traces are rebuilt only when the set of shown or measured methods changes; otherwise
their data change in one ``batch_update`` per figure, then the figure's whole state is sent
(:func:`~gtopk_lab.plotting.widget_sync.resync_widget_state`: a front end still loading
plotly would miss the deltas). Cost: O(methods x 11) values per redraw. Client side.
"""

from __future__ import annotations

import html
import math
from typing import Any

import plotly.graph_objects as go

from gtopk_lab.plotting.explorer_model import WORKERS, Prediction
from gtopk_lab.plotting.figures_base import method_color
from gtopk_lab.plotting.widget_sync import editing, resync_widget_state

__all__ = ["EFFICIENCY_LAYOUT", "BREAKDOWN_LAYOUT", "PHASE_COLORS", "title_and_note", "draw_efficiency",
           "draw_breakdown"]

#: Colours of the breakdown's phases (not methods: every bar holds all three).
PHASE_COLORS = {"compute": "#636EFA", "selection": "#FFA15A", "communication": "#EF553B"}
#: The efficiency figure's fixed layout (the title, note and P mark change per redraw).
EFFICIENCY_LAYOUT: dict[str, Any] = {
    "template": "plotly_white", "height": 470, "margin": {"t": 125},
    "xaxis": {"title": {"text": "workers P"}, "type": "log", "dtick": math.log10(2)},
    "yaxis": {"title": {"text": "efficiency (%)"}, "range": [0, 105]},
    "legend": {"orientation": "h", "y": -0.2}}
#: The breakdown's fixed layout (its legend at the right: below, it ran into the axis title).
BREAKDOWN_LAYOUT: dict[str, Any] = {
    "template": "plotly_white", "barmode": "stack", "margin": {"l": 130, "t": 50},
    "xaxis": {"title": {"text": "seconds per iteration (predicted)"}}, "yaxis": {"autorange": "reversed"}}


def title_and_note(p: Prediction) -> tuple[str, str]:
    """The efficiency figure's title (the setting) and the lines under it (the costs)."""
    c = p.costs
    note = [f"costs: {c.source}",
            f"d = {c.numel:,}, t_c = {c.compute_s * 1e3:.3g} ms, t_s = {c.selection_s * 1e3:.3g} ms, "
            f"gamma = {c.gamma_at(p.setting.density):.2g} s/elem"]
    if p.missing:
        note[-1] += f"; no formula without a layer layout: {', '.join(p.missing)}"
    return (f"Predicted scaling efficiency (alpha-beta model): {p.setting.describe()}",
            "<br>".join(html.escape(line) for line in note))


def draw_efficiency(fig: go.Figure, p: Prediction, measured: list[dict[str, Any]],
                    shape: tuple[Any, ...] | None, measured_label: str = "") -> tuple[Any, ...]:
    """Step 1 of the module docstring. ``shape``: the trace set drawn last (the traces are
    rebuilt only when it changed); returns the one drawn now. ``measured_label``: the
    setting the measured study ran (the note says it: the sliders may have moved since)."""
    names = list(p.rows)
    overlay = sorted({m["method"] for m in measured})
    new_shape = (tuple(names), tuple(overlay))
    title, note = title_and_note(p)
    if overlay and measured_label:
        note += "<br>" + html.escape(f"diamonds: measured by the study at {measured_label} (virtual clock)")
    with editing(fig):
        if new_shape != shape:  # the shown methods changed: new traces
            with fig.batch_update():
                fig.data = ()
            traces = [go.Scatter(x=list(WORKERS), mode="lines+markers", name=m, legendgroup=m,
                                 line={"color": method_color(m)}, marker={"size": 6},
                                 hovertemplate=f"{m}<br>P=%{{x}}<br>%{{y:.1f}}%<br>"
                                               "t_iter %{customdata:.4g} s<extra></extra>")
                      for m in names]
            traces += [go.Scatter(mode="markers", name=f"{m} measured", legendgroup=m,
                                  marker={"color": method_color(m), "symbol": "diamond", "size": 11,
                                          "line": {"width": 1, "color": "#333"}},
                                  hovertemplate=f"{m} measured<br>P=%{{x}}<br>%{{y:.1f}}%<extra></extra>")
                       for m in overlay]
            fig.add_traces(traces)
        with fig.batch_update():
            for trace, m in zip(fig.data, names):
                rows = p.rows[m]
                trace.y = [r["scaling_efficiency"] * 100 for r in rows]
                trace.customdata = [r["iteration_s"] for r in rows]
            for trace, m in zip(fig.data[len(names):], overlay):
                points = [q for q in measured if q["method"] == m]
                trace.x = [q["workers"] for q in points]
                trace.y = [q["efficiency"] * 100 for q in points]
            fig.layout.title = {"text": title, "font": {"size": 15}}
            fig.layout.annotations = [{"text": note, "xref": "paper", "yref": "paper", "x": 0, "y": 1.02,
                                       "xanchor": "left", "yanchor": "bottom", "showarrow": False, "align": "left",
                                       "font": {"size": 11, "color": "#555"}}]
            fig.layout.shapes = [{"type": "line", "x0": p.setting.workers, "x1": p.setting.workers, "xref": "x",
                                  "yref": "paper", "y0": 0, "y1": 1,
                                  "line": {"color": "#999", "dash": "dot", "width": 1}}]
        resync_widget_state(fig)
    return new_shape


def draw_breakdown(fig: go.Figure, p: Prediction) -> None:
    """Step 2 of the module docstring."""
    at_p = p.at_p
    names = list(at_p)
    with editing(fig):
        if len(fig.data) != len(PHASE_COLORS):
            fig.add_traces([go.Bar(orientation="h", name=phase, marker={"color": color},
                                   hovertemplate=f"%{{y}}<br>{phase} %{{x:.4g}} s<extra></extra>")
                            for phase, color in PHASE_COLORS.items()])
        with fig.batch_update():
            for trace, key in zip(fig.data, ("compute_s", "selection_s", "comm_s")):
                trace.y = names
                trace.x = [at_p[m][key] for m in names]
            fig.layout.title = f"Iteration time at P = {p.setting.workers}: compute, selection, communication"
            fig.layout.height = 150 + 26 * max(1, len(names))
        resync_widget_state(fig)
