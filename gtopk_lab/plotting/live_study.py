"""Live figures of a :class:`~gtopk_lab.orchestration.study.Study`: scaling efficiency vs P
that fills in while the cluster runs, and convergence faceted by method and P.

``live_scaling(study)``:

1. one line per method (and per network / density / source when the study has several,
   named by :mod:`~gtopk_lab.plotting.legend_names`: only the fields that vary), efficiency on the virtual clock by the paper's definition (dense P = 1 of the same
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

The figures themselves are :mod:`~gtopk_lab.plotting.figures_studies`' (one study here; the
ControlPanel draws every study it launched or overlaid, each a legend group).

Cost per refresh: the study's tables (O(points)) and one figure rebuild.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import pandas as pd
import plotly.graph_objects as go

from gtopk_lab.plotting.figures_studies import (PANELS_PER_ROW, ShownStudy, convergence_studies_figure,
                                                scaling_studies_figure)
from gtopk_lab.plotting.live import live_frontend_present
from gtopk_lab.plotting.static_figures import display_static
from gtopk_lab.plotting.widget_sync import ThreadSafeFigureWidget, copy_into

__all__ = ["StudyFigure", "live_scaling", "live_convergence_study", "scaling_study_figure",
           "convergence_study_figure", "PANELS_PER_ROW"]


def scaling_study_figure(points: pd.DataFrame, time: str = "virtual") -> go.Figure:
    """Steps 1-3 of the module docstring from a study's :meth:`Study.points` frame (one study
    of :func:`~gtopk_lab.plotting.figures_studies.scaling_studies_figure`)."""
    return scaling_studies_figure([ShownStudy(points=points)], time)


def convergence_study_figure(metrics: pd.DataFrame, status: pd.DataFrame | None = None) -> go.Figure:
    """Train loss vs iteration: one panel per method, one line per P, seeds averaged (one
    study of :func:`~gtopk_lab.plotting.figures_studies.convergence_studies_figure`;
    ``status``: the study's :meth:`Study.status`, whose run configs split the lines by link
    and pattern too)."""
    return convergence_studies_figure([ShownStudy(metrics=metrics,
                                                  status=pd.DataFrame() if status is None else status)])


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
    return StudyFigure(study, lambda s: convergence_study_figure(s.metrics(), s.status()), live=live)
