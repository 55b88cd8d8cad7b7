"""The ControlPanel's *Compare selected*: the convergence of runs chosen in its runs table
and their numbers side by side.

:func:`compare_runs`:

1. the chosen runs' metric rows from the Lab's results folder (``load_metrics``), their
   numbers from ``lab.runs()`` (:func:`~gtopk_lab.plotting.runs_table.compare_frame`);
2. :func:`~gtopk_lab.plotting.figures.convergence_figure` of those rows, made readable at the
   panel's width by :func:`side_by_side` (the accuracy axis on the right of its panel, the
   legend below, a dash per run of one colour);
3. a one-line reason instead when nothing is selected or no rows are stored yet.

Cost: reading the chosen runs' rows once. Client side only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from gtopk_lab.orchestration.results import load_metrics
from gtopk_lab.plotting import figures
from gtopk_lab.plotting.runs_table import compare_frame

__all__ = ["DASHES", "side_by_side", "compare_runs"]

#: Line dashes that tell apart compared runs of one colour (one method).
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def side_by_side(figure: go.Figure) -> go.Figure:
    """The comparison's two panels (train loss | test accuracy) readable at any width: the
    accuracy axis on the right of its panel and the legend below, so the second axis title
    never runs into the first panel (it did at the ~500 px plot width of the panel's tab);
    and runs of one method (one colour) get distinct dashes in both panels."""
    figure.update_yaxes(side="right", row=1, col=2)
    figure.update_layout(legend={"orientation": "h", "x": 0, "y": -0.22, "yanchor": "top"},
                         margin={"b": 110})
    seen: dict[str, dict[str, str]] = {}  # colour -> {run: dash}
    for trace in figure.data:
        color, run = str(trace.line.color), str(trace.legendgroup or trace.name)
        dashes = seen.setdefault(color, {})
        dashes.setdefault(run, DASHES[len(dashes) % len(DASHES)])
        trace.line.dash = dashes[run]
    return figure


def compare_runs(lab: Any, chosen: Sequence[str], x: str = "iteration") -> tuple[go.Figure, pd.DataFrame] | str:
    """Steps 1-3 of the module docstring: ``(figure, numbers)``, or the line saying why not."""
    chosen = list(chosen)
    if not chosen:
        return "select runs in the runs table first (click rows), then Compare selected"
    metrics = load_metrics(lab.out, run_ids=chosen) if hasattr(lab, "out") else lab.load()[1]
    metrics = metrics[metrics["run_id"].isin(chosen)] if len(metrics) else metrics
    if not len(metrics):
        return f"no metric rows stored yet for {len(chosen)} selected run(s)"
    numbers = compare_frame(lab.runs(), chosen)
    fig = side_by_side(figures.convergence_figure(metrics, x=x, title=f"{len(chosen)} run(s) side by side"))
    return fig, numbers
