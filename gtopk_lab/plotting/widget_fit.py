"""Make plotly ``FigureWidget`` s take the width JupyterLab gives them.

Since plotly 6 a ``FigureWidget`` is an anywidget that takes its width once, when it is
drawn, and does not follow its container (plotly.py issue 5208): drawn before its
container is laid out (every figure in an ipywidgets box, a hidden tab, a cell off screen
after *Run All*, where JupyterLab lays out only the cells in view) it stays 700 px wide,
so the plot fills two thirds of the panel and a two-panel figure's second y-axis title
runs into the first panel.

- :func:`fit_width`: ask one displayed figure to measure its container again;
- :class:`FitSignal`: an invisible widget placed in a container (e.g. a control panel):
  its browser side tells Python (``on_fit()``) when the container scrolls into view,
  changes width, or gets a new plot, so the owner can call :func:`fit_width` on its
  figures. Debounced (one signal per 250 ms at most); it reacts to plots being added,
  never to a plot's own redraw, so a fit cannot trigger another.

Client side only; needs a widget front end (without one nothing is sent, nothing breaks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anywidget
import plotly.graph_objects as go
import traitlets

from gtopk_lab.plotting.widget_sync import editing, resync_widget_state

__all__ = ["fit_width", "FitSignal"]


def fit_width(figure: go.FigureWidget) -> None:
    """Make a displayed ``FigureWidget`` take its container's width now.

    Plotly sends a relayout only on a change, so autosize goes off and on again: the
    second relayout measures the container (a no-op where the figure is not visible). A
    figure with a width of its own keeps it."""
    with editing(figure):  # the panel's watcher thread may be refreshing it
        if figure.layout.width is not None:
            return
        figure.layout.autosize = False
        figure.layout.autosize = True
        resync_widget_state(figure)  # a front end still loading plotly misses the deltas


class FitSignal(anywidget.AnyWidget):
    """Calls ``on_fit()`` when the closest ancestor matching ``container`` (a CSS selector;
    empty: the parent element) comes into view, changes width or gets a new plot."""

    container = traitlets.Unicode("").tag(sync=True)

    _esm = """
    export default {
      render({ model, el }) {
        const cleanups = [];
        let timer = null;
        let recount = null;
        let tries = 0;
        const signal = () => {
          clearTimeout(timer);
          timer = setTimeout(() => model.send({ event: 'fit' }), 250);
        };
        const start = () => {
          const selector = model.get('container');
          const box = selector ? el.closest(selector) : el.parentElement;
          if (!box) { if (tries++ < 600) requestAnimationFrame(start); return; }
          const seen = new IntersectionObserver((entries) => {
            if (entries.some((e) => e.isIntersecting)) signal();
          });
          seen.observe(box);
          let width = box.getBoundingClientRect().width;
          const resized = new ResizeObserver(() => {
            const now = box.getBoundingClientRect().width;
            if (Math.abs(now - width) > 2) { width = now; signal(); }
          });
          resized.observe(box);
          // a new plot: count them a moment after the DOM changed (plotly marks its div
          // only once drawn); a plot's own redraws and table redraws are not looked at
          let plots = box.querySelectorAll('.js-plotly-plot').length;
          const added = new MutationObserver((records) => {
            const outside = records.some((r) => r.target.closest
              && !r.target.closest('.js-plotly-plot, .dt-container'));
            if (!outside) return;
            clearTimeout(recount);
            recount = setTimeout(() => {
              const now = box.querySelectorAll('.js-plotly-plot').length;
              if (now > plots) signal();
              plots = now;
            }, 300);
          });
          added.observe(box, { childList: true, subtree: true });
          cleanups.push(() => seen.disconnect(), () => resized.disconnect(), () => added.disconnect());
        };
        requestAnimationFrame(start);
        return () => { clearTimeout(timer); clearTimeout(recount); cleanups.forEach((f) => f()); };
      }
    };
    """

    def __init__(self, on_fit: Callable[[], None], container: str = "", **kwargs: Any) -> None:
        super().__init__(container=container, **kwargs)
        self._on_fit = on_fit
        self.on_msg(self._message)

    def _message(self, _widget: Any, content: dict[str, Any], _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("event") == "fit":
            self._on_fit()
