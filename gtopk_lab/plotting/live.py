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

plotly.js in the ``text/html`` of static figures (offline HTML exports)
-----------------------------------------------------------------------
An executed notebook exported with ``jupyter nbconvert --to html`` is often opened
offline, so plotly.js must be in the page itself. nbconvert writes every output in
notebook order and picks ``text/html`` for these bundles; its scripts run top to bottom.
So (:data:`PLOTLYJS_ENV`, default ``once``) the first static figure this kernel displays
carries the full plotly.js (about 4.8 MB) and every later one only a ``<div>`` whose
script draws as soon as ``window.Plotly`` exists (at once, or at the page's ``load``
event when the carrier sits further down after out-of-order execution), and otherwise
writes a line saying why it is blank. Re-running the cell that carried plotly.js
replaces its outputs, so a front end that names cells (JupyterLab sends a ``cellId``)
gets plotly.js embedded again in that cell's next figure; papermill / nbclient run top
to bottom and embed it exactly once. ``every`` embeds it in each figure
(self-contained outputs, 4.8 MB each); ``cdn`` loads it from the CDN (small, needs a
network).

Client side only; never imported by worker code.

Example::

    handle = lab.submit(RunConfig(method="gtopk", workers=4))
    view = live_convergence(handle, x="iteration")   # live widget appears here
    metrics, summary = handle.result()
    view.finish()                                      # static figure when headless
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from gtopk_lab.plotting import figures

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
#: Where static figures' text/html gets plotly.js: once | every | cdn (module docstring).
PLOTLYJS_ENV = "GTOPK_LAB_PLOTLYJS"
PLOTLYJS_MODES: tuple[str, ...] = ("once", "every", "cdn")
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


#: Shown in a figure's place when its page has no plotly.js (see the module docstring).
_NO_PLOTLYJS = ("This figure needs plotly.js, which this page does not have: gtopk-lab embeds it in "
                "the first figure a kernel displays. Run the notebook from the top (or set "
                "GTOPK_LAB_PLOTLYJS=every) and export it again.")

#: (cell id, execute-request id) of the output that carries plotly.js in this kernel, or None.
_plotlyjs_carrier: tuple[str | None, str | None] | None = None
_plotlyjs_lock = threading.Lock()


def _figure_html(fig: go.Figure, plotlyjs: bool | str) -> str:
    """The ``text/html`` of a static figure (see the module docstring).

    ``plotlyjs``: True puts the full plotly.js before the figure, False only the figure
    (drawn once ``window.Plotly`` exists), "cdn" plotly's CDN script tag.
    """
    if plotlyjs == "cdn":
        return fig.to_html(full_html=False, include_plotlyjs="cdn")
    if not isinstance(plotlyjs, bool):
        raise ValueError(f"plotlyjs={plotlyjs!r} is invalid: expected True, False or 'cdn'")
    div_id = f"gtopk-{uuid.uuid4().hex}"
    # "</" inside a <script> would end it early: JSON allows the escaped form.
    spec = pio.to_json(fig, validate=False).replace("</", "<\\/")
    height = fig.layout.height or 450
    # Not plotly's own snippet: it calls Plotly.newPlot at once and fails for good when
    # plotly.js comes later in the page; this one retries at the load event, then says why.
    html = (f'<div id="{div_id}" class="plotly-graph-div" style="height:{int(height)}px; width:100%;"></div>'
            '<script type="text/javascript">(function () {'
            f'var id = "{div_id}", fig = {spec}, config = {{"responsive": true}};'
            'function draw() { var el = document.getElementById(id);'
            ' if (!el || !window.Plotly) { return false; }'
            ' window.Plotly.newPlot(el, fig.data, fig.layout, config); return true; }'
            'if (!draw()) { window.addEventListener("load", function () { if (!draw()) {'
            ' var el = document.getElementById(id);'
            f' if (el) {{ el.style.height = "auto"; el.textContent = {json.dumps(_NO_PLOTLYJS)}; }} }} }}); }}'
            '})();</script>')
    if plotlyjs:
        # window.PlotlyConfig before plotly.js, as plotly's to_html does (MathJax setting).
        html = ("<script type=\"text/javascript\">window.PlotlyConfig = {MathJaxConfig: 'local'};</script>"
                f'<script type="text/javascript">{get_plotlyjs()}</script>' + html)
    return html


def static_bundle(fig: go.Figure, plotlyjs: bool | str = True) -> dict[str, Any]:
    """Output bundle of a static figure, renderable without a live kernel or a network.

    ``application/vnd.plotly.v1+json`` (JupyterLab's plotly renderer), ``text/html`` (for
    nbconvert's HTML and VS Code: the figure with plotly.js embedded when ``plotlyjs`` is
    True, drawn by an earlier figure's plotly.js when False, from the CDN when "cdn") and
    ``text/plain``. Pure; :func:`display_static` decides ``plotlyjs`` once per kernel.
    """
    return {
        "application/vnd.plotly.v1+json": fig.to_plotly_json() | {"config": {"responsive": True}},
        "text/html": _figure_html(fig, plotlyjs),
        "text/plain": f"<Figure: {len(fig.data)} traces, {fig.layout.title.text or 'untitled'}>",
    }


def _current_request() -> tuple[str | None, str | None]:
    """(cell id, msg id) of the execute request this kernel is answering; (None, None)
    outside a kernel. JupyterLab sends the cell id; nbclient / papermill do not."""
    try:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
        parent = kernel.get_parent() if kernel is not None else None
        if not parent:
            return None, None
        return (parent.get("metadata", {}).get("cellId"), parent.get("header", {}).get("msg_id"))
    except Exception:  # noqa: BLE001 - an unusual kernel: fall back to once per process
        return None, None


def plotlyjs_mode() -> str:
    """The :data:`PLOTLYJS_ENV` setting (default "once"); ValueError on another value."""
    mode = os.environ.get(PLOTLYJS_ENV, "").strip().lower() or "once"
    if mode not in PLOTLYJS_MODES:
        raise ValueError(f"{PLOTLYJS_ENV}={mode!r} is invalid: expected one of {', '.join(PLOTLYJS_MODES)}")
    return mode


def _claim_plotlyjs() -> bool | str:
    """``plotlyjs`` for the next displayed static figure: True for the first one this
    kernel displays (and for the next one of a re-run carrier cell), else False; "cdn" /
    True always under the ``cdn`` / ``every`` modes."""
    global _plotlyjs_carrier
    mode = plotlyjs_mode()
    if mode == "cdn":
        return "cdn"
    if mode == "every":
        return True
    cell, request = _current_request()
    with _plotlyjs_lock:
        carrier = _plotlyjs_carrier
        rerun = carrier is not None and cell is not None and carrier[0] == cell and carrier[1] != request
        if carrier is None or rerun:
            _plotlyjs_carrier = (cell, request)
            return True
        return False


def kernel_bundle(fig: go.Figure) -> dict[str, Any]:
    """:func:`static_bundle` with plotly.js once per kernel (the module docstring): for
    ``_repr_mimebundle_`` and :func:`display_static`, i.e. bundles that get displayed."""
    return static_bundle(fig, _claim_plotlyjs())


def display_static(fig: go.Figure, display_id: str | None = None) -> Any:
    """Display ``fig`` as a static bundle (:func:`kernel_bundle`); outside IPython, no-op.

    Returns the IPython ``DisplayHandle`` (or None).
    """
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython
    from IPython.display import display

    if get_ipython() is None:
        return None
    return display(kernel_bundle(fig), raw=True, display_id=display_id or True)


def show(fig: go.Figure) -> None:
    """Display a finished figure so that it renders live *and* in saved / exported notebooks.

    Like :func:`display_static` (returns nothing, so it can end a cell): use it for figures
    that do not change (finished sweeps, Top-k operator plots); use :class:`LiveFigure`
    for runs in progress.
    """
    display_static(fig)


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
        self.figure: go.Figure = go.FigureWidget(initial) if self.live else initial
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

    def refresh(self) -> None:
        """Rebuild from all rows so far and push the change into :attr:`figure` in one batch."""
        try:
            with self._lock:
                new = self._build()
                self._last_refresh = time.monotonic()
                self.refreshes += 1
                _copy_into(self.figure, new)
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
            self.refresh()
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


def _copy_into(target: go.Figure, source: go.Figure, replace: bool = False) -> None:
    """Make ``target`` show ``source``: same traces and layout, updated in one batch.

    Traces are matched by position and type; when the trace list changed shape (a new
    run appeared) the traces are replaced, otherwise only their data and style change, so
    a FigureWidget sends one small update. ``replace`` re-sends every trace and the layout
    whatever the shape: a last redraw that does not depend on the front end having applied
    every earlier partial update.
    """
    same_shape = not replace and len(target.data) == len(source.data) and all(
        a.type == b.type for a, b in zip(target.data, source.data))
    if not same_shape:
        if isinstance(target, go.FigureWidget):
            with target.batch_update():
                target.data = ()
            target.add_traces(list(source.data))
            with target.batch_update():
                target.layout = source.layout
        else:
            target.data = ()
            target.add_traces(list(source.data))
            target.layout = source.layout
        return
    batch = target.batch_update() if isinstance(target, go.FigureWidget) else contextlib.nullcontext()
    with batch:
        for dst, src in zip(target.data, source.data):
            props = {k: v for k, v in src.to_plotly_json().items() if k not in ("type", "uid")}
            dst.update(props, overwrite=True)
        new_layout = source.layout.to_plotly_json()
        if target.layout.to_plotly_json() != new_layout:
            target.layout.update(new_layout, overwrite=True)


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
