"""Static figures for notebooks: output bundles that render live *and* in saved or exported
notebooks, with plotly.js embedded once per kernel.

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
"""

from __future__ import annotations

import json
import os
import sys
import threading
import uuid
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

__all__ = ["PLOTLYJS_ENV", "PLOTLYJS_MODES", "static_bundle", "kernel_bundle", "plotlyjs_mode",
           "display_static", "show"]

#: Where static figures' text/html gets plotly.js: once | every | cdn (module docstring).
PLOTLYJS_ENV = "GTOPK_LAB_PLOTLYJS"
PLOTLYJS_MODES: tuple[str, ...] = ("once", "every", "cdn")

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
