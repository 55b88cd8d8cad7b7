"""Live figures of a :class:`~gtopk_lab.orchestration.study.Study`: scaling efficiency vs P
that fills in while the cluster runs, and convergence faceted by method and P.

``live_scaling(study)``:

1. one line per method (and per network / density / source when the study has several),
   efficiency on the virtual clock by the paper's definition (dense P = 1 of the same
   network, seed and source is the baseline), mean over seeds with error bars of its 95%
   Student-t confidence interval (:mod:`~gtopk_lab.analysis.intervals`; none with one seed)
2. the alpha-beta(-gamma) prediction of the same points dashed
   (:func:`~gtopk_lab.analysis.study_tables.predicted_efficiency`)
3. a point appears as soon as its run's throughput is stable (after warm-up) and moves
   while it runs; provisional points (the run or its baseline still going) are hollow
   markers, and the title says how many there are
4. refreshed from the study's watcher thread (:meth:`Study.subscribe`, at most every
   ``refresh_s``); in a front end with widgets the ``FigureWidget`` updates in place,
   headless (papermill, CI) nothing is shown until :meth:`StudyFigure.finish`, which waits
   for the study and displays the static figure (:mod:`gtopk_lab.plotting.live` decides);
   a headless figure does not subscribe, so it costs the running study nothing

``live_convergence_study(study)``: train loss per iteration, one panel per method, one line
per P (mean over seeds with a band of its 95% Student-t confidence interval when there are
several seeds).

Cost per refresh: the study's tables (O(points)) and one figure rebuild.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gtopk_lab.analysis.intervals import CONFIDENCE, interval_bounds, interval_columns, interval_note
from gtopk_lab.analysis.study_tables import point_efficiency, predicted_efficiency, aggregate_seeds
from gtopk_lab.network.model import format_bandwidth
from gtopk_lab.plotting.figures_base import method_color
from gtopk_lab.plotting.live import live_frontend_present
from gtopk_lab.plotting.static_figures import display_static
from gtopk_lab.plotting.widget_sync import ThreadSafeFigureWidget, copy_into

#: Panels per row of the convergence figure (one per method).
PANELS_PER_ROW = 5

__all__ = ["StudyFigure", "live_scaling", "live_convergence_study", "scaling_study_figure",
           "convergence_study_figure"]


def _series_label(row: Any, several: dict[str, bool]) -> str:
    parts = [str(row.method)]
    if several["density"] and row.density >= 0:  # -1: a method without density
        parts.append(f"rho={row.density:g}")
    if several["network"]:
        parts.append(format_bandwidth(row.bandwidth_bps) if math.isfinite(row.bandwidth_bps) else "unthrottled")
    if several["source"]:
        parts.append(str(row.source))
    return " ".join(parts)


def scaling_study_figure(points: pd.DataFrame, time: str = "virtual") -> go.Figure:
    """Steps 1-3 of the module docstring from a study's :meth:`Study.points` frame."""
    table = aggregate_seeds(point_efficiency(points, time), time) if len(points) else pd.DataFrame()
    predicted = predicted_efficiency(points) if len(points) else pd.DataFrame()
    fig = go.Figure()
    provisional = int(table["provisional"].sum()) if len(table) else 0
    seeds = int(table["n"].max()) if len(table) else 0
    if len(table):
        table = table[table["efficiency_mean"].notna()]
        several = {"density": table["density"].nunique() > 1,
                   "network": table[["bandwidth_bps", "latency_s"]].drop_duplicates().shape[0] > 1,
                   "source": table["source"].nunique() > 1}
        keys = ["method", "density", "bandwidth_bps", "latency_s", "source"]
        for _, group in table.assign(density=table["density"].fillna(-1.0)).groupby(keys, sort=True):
            group = group.sort_values("workers")
            row = group.iloc[0]
            label = _series_label(row, several)
            color = method_color(str(row.method))
            dash = "dot" if row.source == "simulated" else "solid"
            up, down = interval_bounds(group["efficiency_mean"], group["efficiency_ci_low"],
                                       group["efficiency_ci_high"])
            fig.add_trace(go.Scatter(
                x=group["workers"], y=group["efficiency_mean"] * 100, mode="lines+markers", name=label,
                line={"color": color, "dash": dash},
                marker={"symbol": ["circle-open" if p else "circle" for p in group["provisional"]],
                        "size": 9},
                error_y={"type": "data", "symmetric": False, "array": (up * 100).tolist(),
                         "arrayminus": (down * 100).tolist(), "visible": bool(group["n"].max() > 1)},
                customdata=list(zip(group["n"], group["provisional"], group["efficiency_ci_low"] * 100,
                                    group["efficiency_ci_high"] * 100)),
                hovertemplate="P=%{x}<br>%{y:.1f}%"
                              + (" [%{customdata[2]:.1f}, %{customdata[3]:.1f}]" if seeds > 1 else "")
                              + "<br>n=%{customdata[0]}<br>provisional=%{customdata[1]}"))
            if len(predicted):
                pred = predicted[(predicted["method"] == row.method) & (predicted["source"] == row.source)
                                 & (predicted["bandwidth_bps"] == row.bandwidth_bps)]
                if row.density >= 0:
                    pred = pred[pred["density"] == row.density]
                if len(pred):
                    pred = pred.groupby("workers", as_index=False)["predicted"].mean()
                    fig.add_trace(go.Scatter(x=pred["workers"], y=pred["predicted"] * 100, mode="lines",
                                             name=f"{label} (alpha-beta)", showlegend=False,
                                             line={"color": color, "dash": "dash", "width": 1}))
    title = f"Scaling efficiency ({time} clock; dense P=1 = 100%)"
    if seeds > 1:
        title += f"<br><sup>{interval_note(seeds, short=True)}</sup>"
    if provisional:
        title += f" - {provisional} provisional (hollow: still running)"
    fig.update_layout(title=title, template="plotly_white", height=420,
                      xaxis={"title": "workers P", "type": "log", "dtick": math.log10(2)},
                      yaxis={"title": "efficiency (%)", "rangemode": "tozero"},
                      legend={"orientation": "h", "y": -0.25})
    return fig


def convergence_study_figure(metrics: pd.DataFrame) -> go.Figure:
    """Train loss vs iteration: one panel per method, one line per P, seeds averaged."""
    if metrics.empty or "kind" not in metrics.columns:
        return go.Figure().update_layout(title="Convergence (no rows yet)", template="plotly_white")
    rows = metrics[(metrics["kind"] == "iter") & (metrics["rank"] == 0)]
    methods = sorted(rows["method"].unique())
    # at most PANELS_PER_ROW panels side by side: ten methods in one row leave no room for
    # their titles or lines
    cols = max(1, min(len(methods), PANELS_PER_ROW))
    n_rows = max(1, math.ceil(len(methods) / cols))
    fig = make_subplots(rows=n_rows, cols=cols, subplot_titles=methods, shared_yaxes=True,
                        vertical_spacing=0.3 / n_rows if n_rows > 1 else 0.0)
    seeds = 1
    for i, method in enumerate(methods):
        row, col = divmod(i, cols)
        row += 1
        col += 1
        sub = rows[rows["method"] == method]
        for p, by_p in sub.groupby("workers"):
            stats = by_p.groupby("iteration")["train_loss"].agg(["mean", "std", "count"]).reset_index()
            seeds = max(seeds, int(stats["count"].max()))
            color = method_color(method)
            fig.add_trace(go.Scatter(x=stats["iteration"], y=stats["mean"], mode="lines",
                                     name=f"{method} P={p}", line={"color": color,
                                                                    "width": 1 + math.log2(max(p, 1)) / 2}),
                          row=row, col=col)
            if stats["count"].max() > 1:
                lower, upper = interval_columns(stats["mean"], stats["std"], stats["count"])
                lower, upper = lower.fillna(stats["mean"]), upper.fillna(stats["mean"])
                fig.add_trace(go.Scatter(x=list(stats["iteration"]) + list(stats["iteration"][::-1]),
                                         y=list(upper) + list(lower[::-1]), fill="toself", mode="none",
                                         fillcolor=color, opacity=0.15, showlegend=False), row=row, col=col)
    band = (f"mean over seeds, band: {100 * CONFIDENCE:g}% Student-t confidence interval" if seeds > 1
            else "one seed: no confidence interval")
    fig.update_layout(title=f"Convergence (train loss, rank 0; {band})",
                      template="plotly_white", height=380 + 260 * (n_rows - 1))
    fig.update_xaxes(title_text="iteration", row=n_rows)
    fig.update_yaxes(title_text="train loss", col=1)
    return fig


class StudyFigure:
    """A figure built from a study by ``build(study)``, refreshed while it runs."""

    def __init__(self, study: Any, build: Callable[[Any], go.Figure], live: bool | None = None) -> None:
        self.study = study
        self.build = build
        self.live = live_frontend_present() if live is None else bool(live)
        initial = build(study)
        self.figure: go.Figure = ThreadSafeFigureWidget(initial) if self.live else initial
        self.refreshes = 0
        self._lock = threading.Lock()
        self._finished = False
        if self.live:
            self._display()
        # Headless, nothing shows the figure before finish(): rebuilding it on every update
        # would only take CPU from the runs (on a small machine they share its cores).
        self._unsubscribe = study.subscribe(self._refresh) if self.live else (lambda: None)

    def _display(self) -> None:
        try:
            from IPython.display import display

            display(self.figure)
        except Exception:  # noqa: BLE001 - no IPython: nothing to display into
            pass

    def _refresh(self, study: Any, final: bool = False) -> None:
        # The build reads the study inside the lock: a watcher refresh that read the study
        # before finish() did must not be applied after it (seen: the finished figure lost
        # its last point to a refresh built while that run was ending). The final one is
        # sent whole (see finish) and is the last.
        with self._lock:
            if self._finished:
                return
            copy_into(self.figure, self.build(study), replace=final)
            self.refreshes += 1
            self._finished = final

    def finish(self, timeout_s: float | None = None) -> go.Figure:
        """Wait for the study, refresh once more, and (headless) display the static figure.

        The last refresh re-sends the figure whole (``copy_into(replace=True)``): a view
        that missed a delta while it was drawing is made whole, as the ControlPanel does.
        No refresh is applied after it."""
        self.study.wait(timeout_s)
        self._unsubscribe()
        self._refresh(self.study, final=True)
        if not self.live:
            display_static(self.figure)
        return self.figure

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from gtopk_lab.plotting.static_figures import kernel_bundle

        return kernel_bundle(self.figure)


def live_scaling(study: Any, time: str = "virtual", *, live: bool | None = None) -> StudyFigure:
    """The live scaling-efficiency figure of ``study`` (see the module docstring)."""
    if time not in ("virtual", "wall"):
        raise ValueError(f"time={time!r} is invalid: expected 'virtual' or 'wall'")
    return StudyFigure(study, lambda s: scaling_study_figure(s.points(), time), live=live)


def live_convergence_study(study: Any, *, live: bool | None = None) -> StudyFigure:
    """Live convergence of every run of ``study``, faceted by method, one line per P."""
    return StudyFigure(study, lambda s: convergence_study_figure(s.metrics()), live=live)
