"""Live figures: a plotly ``FigureWidget`` updated in place while runs train.

A :class:`LiveFigure` subscribes to one or more ``RunHandle`` objects
(``handle.subscribe(callback)``, ``handle.metrics``, ``handle.result()``; see
gtopk_lab.orchestration.lab). On every batch of new metric rows it rebuilds the figure
with the same pure builder as the static figures (:mod:`gtopk_lab.plotting.figures`) and
copies the new trace data into the widget inside ``with fig.batch_update():``, so the
browser receives one message per refresh. Refreshes are throttled to one per
``min_interval_s``; the last batch is never lost (a timer flushes it).

Live frontend or static figure
------------------------------
A ``FigureWidget`` only renders in a front end that runs the widget manager (JupyterLab,
Notebook 7, VS Code). Executed headless (papermill / nbclient, ``jupyter nbconvert
--execute``) it saves only widget state, so the executed notebook and its HTML export
show nothing. :func:`live_frontend_present` decides, in this order:

1. ``GTOPK_LAB_STATIC=1`` (tests, CI, papermill runs) -> static;
   ``GTOPK_LAB_LIVE=1`` -> live (forces widgets, e.g. in an unusual front end);
2. no IPython kernel, or a kernel without a comm manager (plain Python, terminal
   IPython) -> static;
3. a kernel started by a Jupyter server (it sets ``JPY_SESSION_NAME``), by VS Code
   (``VSCODE_PID``) or in Colab -> live;
4. any other kernel (papermill / nbclient start kernels themselves) -> static.

In static mode the same call displays nothing until :meth:`LiveFigure.finish`, which
waits for the runs and displays a plain ``go.Figure`` as an output bundle with
``application/vnd.plotly.v1+json`` (JupyterLab) and ``text/html`` (nbconvert's HTML, VS
Code). In live mode :meth:`LiveFigure.finish` does a last refresh.

Static bundles (plotly.js embedded once per kernel, for offline HTML exports) live in
:mod:`gtopk_lab.plotting.static_figures`; this module re-exports them.

Client side only; never imported by worker code.

Example::

    handle = lab.submit(RunConfig(method="gtopk", workers=4))
    view = live_convergence(handle, x="iteration")   # live widget appears here
    metrics, summary = handle.result()
    view.finish()                                      # static figure when headless
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from gtopk_lab.plotting import figures
from gtopk_lab.plotting.static_figures import (
    PLOTLYJS_ENV,
    PLOTLYJS_MODES,
    display_static,
    kernel_bundle,
    plotlyjs_mode,
    show,
    static_bundle,
)
from gtopk_lab.plotting.widget_sync import ThreadSafeFigureWidget, copy_into

__all__ = [
    "STATIC_ENV",
    "LIVE_ENV",
    "PLOTLYJS_ENV",
    "PLOTLYJS_MODES",
    "live_frontend_present",
    "static_bundle",
    "kernel_bundle",
    "plotlyjs_mode",
    "display_static",
    "show",
    "LiveFigure",
    "live_convergence",
]

#: Set to 1 to force static figures (headless execution); papermill tests set it.
STATIC_ENV = "GTOPK_LAB_STATIC"
#: Set to 1 to force live widgets.
LIVE_ENV = "GTOPK_LAB_LIVE"
_TRUE = ("1", "true", "yes", "on")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def live_frontend_present() -> bool:
    """True when a widget-capable Jupyter front end is (very likely) attached.

    See the module docstring for the decision order (env vars, kernel, comm manager,
    who started the kernel). Cheap: O(1), no messages to the front end.
    """
    if _env_flag(STATIC_ENV):
        return False
    if _env_flag(LIVE_ENV):
        return True
    if "IPython" not in sys.modules:
        return False
    from IPython import get_ipython

    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return False
    if getattr(kernel, "comm_manager", None) is None:
        try:
            import comm

            if comm.get_comm_manager() is None:
                return False
        except Exception:  # noqa: BLE001 - no comm package / manager: no widgets
            return False
    return any(os.environ.get(name) for name in ("JPY_SESSION_NAME", "VSCODE_PID", "COLAB_RELEASE_TAG"))


def _as_frame(rows: Any) -> pd.DataFrame:
    if rows is None:
        return pd.DataFrame()
    if isinstance(rows, pd.DataFrame):
        return rows
    return pd.DataFrame.from_records(list(rows))


class LiveFigure:
    """A figure that follows the metric rows of running ``RunHandle`` objects.

    ``builder(metrics) -> go.Figure`` is any pure figure builder (default:
    :func:`figures.convergence_figure`). ``figure`` is a ``go.FigureWidget`` in live mode
    and a ``go.Figure`` otherwise (see :func:`live_frontend_present`; ``live`` overrides).

    Cost per refresh: the builder's O(rows) plus sending the changed traces; refreshes
    happen at most every ``min_interval_s`` seconds.
    """

    def __init__(self, handles: Any | Sequence[Any] = (), builder: Callable[[pd.DataFrame], go.Figure] | None = None,
                 *, live: bool | None = None, min_interval_s: float = 0.5, display: bool = True) -> None:
        if min_interval_s < 0:
            raise ValueError(f"min_interval_s={min_interval_s!r} is invalid: expected a number >= 0")
        self.builder = builder or figures.convergence_figure
        self.live = live_frontend_present() if live is None else bool(live)
        self.min_interval_s = float(min_interval_s)
        self.handles: list[Any] = []
        self._frames: dict[str, pd.DataFrame] = {}
        self._lock = threading.RLock()
        self._last_refresh = 0.0
        self._timer: threading.Timer | None = None
        self._display_handle: Any = None
        self._finished = False
        self.refreshes = 0
        initial = self._build()
        self.figure: go.Figure = ThreadSafeFigureWidget(initial) if self.live else initial
        if self.live and display:
            from IPython.display import display as ipy_display

            ipy_display(self.figure)
        for handle in ([handles] if not isinstance(handles, (list, tuple)) else handles):
            self.add(handle)

    # --- data ---------------------------------------------------------------------------
    def add(self, handle: Any) -> None:
        """Follow one more run: take its rows so far and subscribe to new ones."""
        for attr in ("subscribe", "metrics"):
            if not hasattr(handle, attr):
                raise TypeError(f"handle has type {type(handle).__name__}: expected a RunHandle with "
                                f".subscribe() and .metrics (missing .{attr})")
        key = str(getattr(handle, "run_id", None) or id(handle))
        with self._lock:
            self.handles.append(handle)
            self._frames[key] = pd.DataFrame()
        # Subscribe before reading the rows so far; rows already in .metrics are replaced
        # by the full snapshot on every refresh, so nothing is counted twice.
        handle.subscribe(lambda new_rows, _key=key, _h=handle: self._on_rows(_key, _h, new_rows))
        self._on_rows(key, handle, None)

    def _on_rows(self, key: str, handle: Any, new_rows: Any) -> None:
        # Called from the Lab's monitor thread (RunHandle subscribers): never raise into it.
        try:
            snapshot = _as_frame(getattr(handle, "metrics", None))
            if not len(snapshot) and new_rows is not None:
                snapshot = pd.concat([self._frames.get(key, pd.DataFrame()), _as_frame(new_rows)],
                                     ignore_index=True)
            if len(snapshot) and "run_id" not in snapshot.columns:
                snapshot = snapshot.assign(run_id=key)
            with self._lock:
                self._frames[key] = snapshot
            self._schedule()
        except Exception as exc:  # noqa: BLE001 - a plotting error must not kill the run
            print(f"gtopk_lab.plotting.live: refresh failed: {exc!r}", file=sys.stderr)

    def metrics(self) -> pd.DataFrame:
        """All rows seen so far, one frame (with a ``run_id`` column)."""
        with self._lock:
            frames = [f for f in self._frames.values() if len(f)]
        return pd.concat(frames, ignore_index=True, sort=False) if frames else pd.DataFrame()

    # --- refresh ------------------------------------------------------------------------
    def _schedule(self) -> None:
        with self._lock:
            wait = self._last_refresh + self.min_interval_s - time.monotonic()
            if wait <= 0:
                self._cancel_timer()
                self.refresh()
            elif self._timer is None:
                self._timer = threading.Timer(wait, self._timer_fired)
                self._timer.daemon = True
                self._timer.start()

    def _timer_fired(self) -> None:
        with self._lock:
            self._timer = None
            self.refresh()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _build(self) -> go.Figure:
        metrics = self.metrics()
        if not len(metrics):
            fig = go.Figure()
            fig.update_layout(title="waiting for the first metric rows ...", template="plotly_white",
                              height=420)
            return fig
        return self.builder(metrics)

    def refresh(self, replace: bool = False) -> None:
        """Rebuild from all rows so far and push the change into :attr:`figure` in one batch
        (``replace``: the whole figure, see :func:`~gtopk_lab.plotting.widget_sync.copy_into`)."""
        try:
            with self._lock:
                new = self._build()
                self._last_refresh = time.monotonic()
                self.refreshes += 1
                copy_into(self.figure, new, replace=replace)
        except Exception as exc:  # noqa: BLE001 - see _on_rows
            print(f"gtopk_lab.plotting.live: refresh failed: {exc!r}", file=sys.stderr)

    def finish(self, timeout_s: float | None = None) -> go.Figure:
        """Wait for every run (``handle.result()``), refresh once more and, in static mode,
        display the final figure. Returns the final figure (a ``go.Figure`` copy)."""
        for handle in self.handles:
            if hasattr(handle, "result"):
                try:
                    handle.result(timeout_s=timeout_s)
                except Exception as exc:  # noqa: BLE001 - a failed run still gets plotted
                    print(f"gtopk_lab.plotting.live: run {getattr(handle, 'run_id', '?')} ended with "
                          f"{type(exc).__name__}: {exc}", file=sys.stderr)
            key = str(getattr(handle, "run_id", None) or id(handle))
            self._on_rows(key, handle, None)
        with self._lock:
            self._cancel_timer()
            self.refresh(replace=True)  # whole: a view that missed a delta is made whole
            final = go.Figure(self.figure)
        if not self.live and not self._finished:
            self._display_handle = display_static(final)
        self._finished = True
        return final

    def close(self) -> None:
        """Stop pending refreshes (subscriptions end with the runs)."""
        with self._lock:
            self._cancel_timer()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        if self.live:
            return self.figure._repr_mimebundle_(include, exclude)  # type: ignore[union-attr]
        return kernel_bundle(self.figure)


def live_convergence(handles: Any | Sequence[Any] = (), x: str = "iteration", *, live: bool | None = None,
                     min_interval_s: float = 0.5, **figure_kwargs: Any) -> LiveFigure:
    """Live train-loss / test-accuracy figure of one or more runs (see :class:`LiveFigure`).

    ``x`` as in :func:`figures.convergence_figure`; extra keyword arguments go to it.
    With no handles the figure is displayed empty and runs join it with
    :meth:`LiveFigure.add`: in JupyterLab plotly's widget takes the browser seconds to
    load (each ``FigureWidget`` carries its own ~5 MB copy of plotly.js), so a figure
    shown before the cluster starts is on screen when the run's first rows arrive.
    """
    if x not in figures.X_AXES:
        raise ValueError(f"x={x!r} is invalid: expected one of {', '.join(figures.X_AXES)}")
    return LiveFigure(handles, lambda m: figures.convergence_figure(m, x=x, **figure_kwargs),
                      live=live, min_interval_s=min_interval_s)
