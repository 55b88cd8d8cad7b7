"""A plotly ``FigureWidget`` that a background thread may edit while the kernel thread
applies the front end's messages to it, and whose front end follows it on a loaded machine.

Why it is needed: ipywidgets applies a front-end message (``Widget.set_state``) inside
traitlets' ``hold_trait_notifications``, which swaps ``notify_change`` on the *instance*,
for every thread. plotly sends each delta as two trait changes, ``_py2js_addTraces = msg``
then ``= None``; when a watcher thread makes them while the kernel thread is inside that
hold, traitlets compresses the two into one change to ``None`` and the delta never leaves
the kernel. Every delta makes each view answer (``_js2py_traceDeltas``,
``_js2py_layoutDelta``), so a figure refreshed from a thread while the kernel is idle (the
ControlPanel after *Run All*) sends deltas exactly while those answers are applied; on a
loaded machine some were lost and the page kept a figure without its last points.

1. :class:`ThreadSafeFigureWidget` holds its ``_edit_lock`` (a re-entrant lock) while it
   applies a front-end message;
2. every edit from Python code runs inside :func:`editing`, which holds the same lock, so
   an edit and a front-end message never interleave; a plain ``go.Figure`` (headless) or a
   plain ``FigureWidget`` is edited without a lock;
3. :func:`copy_into` brings a figure to show another one: the changed data in one batch,
   then the whole state (see :func:`resync_widget_state`), all under the lock.

Cost: one uncontended lock per front-end message and per refresh.

Its front end is ``figure_widget.js`` (read it for the details), not plotly's module
itself: anywidget gives a model 2 s to load its module, and a model that takes longer
applies no later message from the kernel, so its views show the widget's first, empty
state forever (seen in CI: the study's figure stayed blank while the study ran). plotly's
module is its 5 MB bundle, which takes 2 s to import on a quiet 2-core machine and 5-9 s
on a loaded one. The small module is ready at once and imports plotly's bundle (sent as
the ``_plotly_esm`` trait, as plotly sends it as ``_esm``) once per page, shared by every
widget of this class.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import plotly
import plotly.graph_objects as go
import traitlets

__all__ = ["ThreadSafeFigureWidget", "editing", "copy_into", "resync_widget_state"]


@functools.cache
def _plotly_widget_bundle() -> str:
    """plotly's own front-end module (5 MB of JavaScript), read once per process."""
    return str(go.FigureWidget._esm)


class ThreadSafeFigureWidget(go.FigureWidget):
    """``go.FigureWidget`` whose front-end messages and :func:`editing` blocks exclude each
    other, drawn by ``figure_widget.js`` (see the module docstring)."""

    _esm = pathlib.Path(__file__).with_name("figure_widget.js")
    _plotly_esm = traitlets.Unicode().tag(sync=True)
    _plotly_version = traitlets.Unicode(plotly.__version__).tag(sync=True)

    @traitlets.default("_plotly_esm")
    def _default_plotly_esm(self) -> str:
        return _plotly_widget_bundle()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # set before the base constructor: it applies the initial figure through set_state
        self._edit_lock = threading.RLock()
        super().__init__(*args, **kwargs)

    def set_state(self, sync_data: dict[str, Any]) -> None:
        with self._edit_lock:
            super().set_state(sync_data)


@contextlib.contextmanager
def editing(figure: go.Figure) -> Iterator[go.Figure]:
    """Hold ``figure``'s edit lock (when it has one) for the block's edits."""
    lock = getattr(figure, "_edit_lock", None)
    if lock is None:
        yield figure
        return
    with lock:
        yield figure


def copy_into(target: go.Figure, source: go.Figure, replace: bool = False) -> None:
    """Make ``target`` show ``source``: same traces and layout, updated in one batch.

    Traces are matched by position and type; when the trace list changed shape (a new
    run appeared) the traces are replaced, otherwise only their data and style change, so
    a FigureWidget sends one small update. ``replace`` re-sends every trace and the layout
    whatever the shape: a last redraw that does not depend on the front end having applied
    every earlier partial update.
    """
    def batch() -> Any:
        return target.batch_update() if isinstance(target, go.FigureWidget) else contextlib.nullcontext()

    with editing(target):
        same_shape = not replace and len(target.data) == len(source.data) and all(
            a.type == b.type for a, b in zip(target.data, source.data))
        if same_shape:
            with batch():
                for dst, src in zip(target.data, source.data):
                    props = {k: v for k, v in src.to_plotly_json().items() if k not in ("type", "uid")}
                    dst.update(props, overwrite=True)
                new_layout = source.layout.to_plotly_json()
                if target.layout.to_plotly_json() != new_layout:
                    target.layout.update(new_layout, overwrite=True)
        else:
            with batch():
                target.data = ()
            target.add_traces(list(source.data))
            with batch():
                target.layout = source.layout
        resync_widget_state(target)


def resync_widget_state(target: go.Figure) -> None:
    """After the deltas, send a ``FigureWidget``'s whole figure as its widget state too.

    plotly's front-end model applies the deltas (``_py2js_restyle``, ``_relayout``, ...) to
    its ``_widget_data`` / ``_widget_layout`` through listeners it registers only once its
    5 MB module has loaded (anywidget's ``initialize``); deltas that arrive before are
    dropped, and a view rendered later would start from a stale figure. The whole state,
    sent after the deltas, is what that late model starts from; a model that was ready has
    applied the deltas already, and its views do not redraw for it. plotly does the same in
    ``FigureWidget._repr_mimebundle_``. Cost: one message of the figure's JSON per refresh
    (kilobytes here)."""
    if isinstance(target, go.FigureWidget):
        with editing(target):
            target._widget_layout = copy.deepcopy(target._layout_obj._props)
            target._widget_data = copy.deepcopy(target._data)
