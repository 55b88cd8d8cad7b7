"""The what-if explorer: what the alpha-beta(-gamma) model predicts, before paying for runs.

Sliders for the density rho (log scale), the chosen P (1 ... 1024, powers of two), the link
(a preset of :data:`gtopk_lab.network.model.PRESETS` or a free rate, and its latency) and a
multi-select of the methods of the registry. Every change redraws, from the model only
(:mod:`gtopk_lab.plotting.explorer_model`: ``predict_scaling`` with each method's
``predicted_time_s``; no cluster work, nothing submitted):

1. *efficiency vs P*: one line per method over P = 1 ... 1024 (dense P = 1 = 100%), the
   chosen P marked; its title says the setting and, under it, where the compute and
   selection times come from (:mod:`gtopk_lab.plotting.explorer_costs`: a calibration, a
   stored run, the latest study, or the stated default);
2. *iteration time at P*: compute, selection and communication per method, stacked bars.

A redraw updates the two ``FigureWidget`` s' existing traces in one batch each (the traces
are rebuilt only when the shown methods change), about 4-8 ms on a 2-core box, all 14 methods shown
(``benchmarks/explorer_redraw.py``). **Run as study** turns the setting into
``lab.study(...)`` (:func:`~gtopk_lab.plotting.explorer_model.study_arguments`), launched
in a thread as the ControlPanel does; its measured points join the efficiency figure as
diamonds while it runs (``Study.subscribe``), and once its dense P = 1 run is done its
costs replace the explorer's (``follow_study``), so curve and points describe one workload.

Client side. Needs a widget front end to be interactive (JupyterLab, Notebook 7, VS Code).

Example::

    from gtopk_lab.plotting.explorer import Explorer
    Explorer()                          # the stated default costs, no cluster
    Explorer(lab, out="results/quickstart")   # costs from its calibration; Run as study
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import ipywidgets as widgets

from gtopk_lab.methods import available_methods
from gtopk_lab.network.model import PRESETS, parse_bandwidth_bps, parse_latency_s
from gtopk_lab.plotting.explorer_costs import Costs, costs_from_study, find_costs
from gtopk_lab.plotting.explorer_model import (FREE_RATE, WORKERS, Prediction, Setting, measured_points, predict,
                                               study_arguments)
from gtopk_lab.plotting.explorer_figures import BREAKDOWN_LAYOUT, EFFICIENCY_LAYOUT, draw_breakdown, draw_efficiency
from gtopk_lab.plotting.panel_fields import status_line_html
from gtopk_lab.plotting.widget_fit import FitSignal, fit_width
from gtopk_lab.plotting.widget_sync import ThreadSafeFigureWidget

__all__ = ["Explorer", "panel_explorer"]

_FIELD = {"description_width": "96px"}
_WIDE = widgets.Layout(width="340px")
#: The latency slider's left end (µs), which means a latency of 0.
LATENCY_FLOOR_US = 0.1


class Explorer:
    """The what-if explorer widget (module docstring); displays itself as a cell's value.

    ``lab``: a ``Lab`` for **Run as study** (None: the button is off); ``costs``: a
    :class:`~gtopk_lab.plotting.explorer_costs.Costs` (None: :func:`find_costs` of ``out``,
    else of ``lab.out``); ``methods``: names from the registry (default dense, topk, gtopk
    where registered); ``link``: a preset, or a rate as a run takes it (``"2.5Gbps"``: the
    free rate); ``latency``: e.g. ``"0.5ms"`` (None: the preset's); ``base``: RunConfig
    fields of a launched study (over the costs' workload); ``seeds``: its seeds;
    ``follow_study``: take a launched study's costs once its P = 1 baseline is done.
    """

    def __init__(self, lab: Any = None, *, costs: Costs | None = None, out: str | None = None,
                 methods: Sequence[str] | None = None, density: float = 0.001, workers: int = 32,
                 link: str = "1GbE", latency: str | None = None, base: Mapping[str, Any] | None = None,
                 seeds: int = 1, follow_study: bool = True, refresh_s: float = 1.0) -> None:
        if costs is not None and not isinstance(costs, Costs):
            raise TypeError(f"costs has type {type(costs).__name__}: expected explorer_costs.Costs or None")
        if base is not None and not isinstance(base, Mapping):
            raise TypeError(f"base={base!r} has type {type(base).__name__}: expected a dict of RunConfig fields")
        if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
            raise ValueError(f"seeds={seeds!r} is invalid: expected an integer >= 1")
        registry = list(available_methods())
        chosen = tuple(m for m in registry if m in set(methods)) if methods is not None else \
            tuple(m for m in ("dense", "topk", "gtopk") if m in registry)
        if methods is not None and len(chosen) != len(set(methods)):
            Setting(methods=tuple(methods))  # raises naming the unknown method
        rate_bps = 1e9
        if link not in PRESETS and link != FREE_RATE:  # a rate as a run takes it ("2.5Gbps")
            rate_bps = parse_bandwidth_bps(link)
            link = "none" if math.isinf(rate_bps) else FREE_RATE
        latency_s = parse_latency_s(latency) if latency is not None else None
        initial = Setting(density=density, workers=workers, link=link, rate_bps=1e9 if math.isinf(rate_bps)
                          else rate_bps, latency_s=latency_s, methods=chosen)
        self.lab = lab
        self.costs = costs if costs is not None else find_costs(out if out is not None else getattr(lab, "out", None))
        self.base = dict(base or {})
        self.seeds = seeds
        self.follow_study = bool(follow_study)
        self.refresh_s = float(refresh_s)
        self.study: Any = None
        self.study_setting: Setting | None = None
        self.measured: list[dict[str, Any]] = []
        self.prediction: Prediction | None = None
        self.redraws = 0  # how many redraws ran (tests and the benchmark read it)
        self.last_redraw_s = 0.0
        self._lock = threading.RLock()
        self._syncing = False  # a control set by another control: no redraw of its own
        self._latency_override = False
        # slider -> the exact value Python gave it: a log slider's front end snaps a value to
        # its step and sends it back (40 ms came back as 39.81 ms, 1GbE's 0.889 Gbit/s as
        # 0.891, which read as a free rate); within half a step that echo is not a change
        self._exact: dict[str, float] = {}
        self._shape: tuple[Any, ...] | None = None
        self._build(initial, registry)
        self.redraw()

    # --- widgets -------------------------------------------------------------------------
    def _build(self, s: Setting, registry: list[str]) -> None:
        self.density = widgets.FloatLogSlider(value=s.density, base=10, min=-5, max=0, step=0.01,
                                              description="density ρ", readout_format=".2g", style=_FIELD,
                                              layout=_WIDE)
        self.workers = widgets.SelectionSlider(options=[(str(p), p) for p in WORKERS], value=s.workers,
                                               description="workers P", style=_FIELD, layout=_WIDE)
        self.link = widgets.Dropdown(options=list(PRESETS) + [FREE_RATE], value=s.link, description="link",
                                     style=_FIELD, layout=_WIDE)
        self.rate = widgets.FloatLogSlider(value=1.0, base=10, min=-2, max=math.log10(400), step=0.001,
                                           description="rate Gbit/s", readout_format=".3g", style=_FIELD,
                                           layout=_WIDE)
        self.latency = widgets.FloatLogSlider(value=436.0, base=10, min=math.log10(LATENCY_FLOOR_US), max=5,
                                              step=0.001,
                                              description="latency µs", readout_format=".3g", style=_FIELD,
                                              layout=_WIDE)
        self.methods = widgets.SelectMultiple(options=registry, value=s.methods, rows=min(len(registry), 8),
                                              description="methods", style=_FIELD, layout=_WIDE)
        self.run_button = widgets.Button(description="Run as study", icon="play", button_style="primary",
                                         disabled=self.lab is None,
                                         tooltip="launch this setting as a study on the Lab" if self.lab is not None
                                         else "no Lab given: Explorer(lab) can launch studies")
        self.message = widgets.HTML(layout=widgets.Layout(min_height="22px"))
        self.efficiency_figure = ThreadSafeFigureWidget(layout=EFFICIENCY_LAYOUT)
        self.breakdown_figure = ThreadSafeFigureWidget(layout=BREAKDOWN_LAYOUT)
        self._put(self.density, s.density)
        self._link_changed(s.link, redraw=False)
        self._syncing = True
        try:  # a rate and a latency of one's own (the sliders clip them to their ranges)
            if s.link == FREE_RATE:
                self._put(self.rate, s.rate_bps / 1e9)
            if s.latency_s is not None or s.link == FREE_RATE:  # a bare rate's latency is 0
                self._put(self.latency, max(LATENCY_FLOOR_US, (s.latency_s or 0.0) * 1e6))
                self._latency_override = True
        finally:
            self._syncing = False
        self.density.observe(lambda _c: self._changed(self.density), names="value")
        for control in (self.workers, self.methods):
            control.observe(lambda _c: self._changed(), names="value")
        self.link.observe(lambda c: self._link_changed(c["new"]), names="value")
        self.rate.observe(lambda _c: self._rate_changed(), names="value")
        self.latency.observe(lambda _c: self._latency_changed(), names="value")
        self.run_button.on_click(lambda _b: self.run_study())
        controls = widgets.VBox([self.density, self.workers, self.link, self.rate, self.latency],
                                layout=widgets.Layout(grid_gap="2px"))
        top = widgets.HBox([controls, widgets.VBox([self.methods, widgets.HBox([self.run_button, self.message])])],
                           layout=widgets.Layout(flex_flow="row wrap", grid_gap="12px"))
        self.fits = 0
        self.widget = widgets.VBox([top, self.efficiency_figure, self.breakdown_figure,
                                    FitSignal(self.fit_figures, ".gtopk-explorer")],
                                   layout=widgets.Layout(width="100%"))
        # CSS classes: how a browser test (or a user's stylesheet) finds the explorer's parts
        self.widget.add_class("gtopk-explorer")
        self.density.add_class("gtopk-explorer-density")
        self.message.add_class("gtopk-explorer-message")

    def _link_changed(self, link: str, redraw: bool = True) -> None:
        """A preset moves the rate and latency sliders to its own values (and forgets a
        latency typed for another link); ``none`` has neither; a free rate keeps them."""
        with self._lock:
            self._syncing = True
            try:
                if link in PRESETS:
                    latency_s, rate_bps, _note = PRESETS[link]
                    if math.isfinite(rate_bps):
                        self._put(self.rate, rate_bps / 1e9)
                    if latency_s > 0:
                        self._put(self.latency, latency_s * 1e6)
                    self._latency_override = False
                self.rate.disabled = self.latency.disabled = link == "none"
            finally:
                self._syncing = False
            if redraw:
                self.redraw()

    def _put(self, slider: widgets.FloatLogSlider, value: float) -> None:
        """Set a log slider from Python and remember the exact value (see ``_exact``)."""
        self._exact[slider.description] = float(value)
        slider.value = value

    def _echo(self, slider: widgets.FloatLogSlider) -> bool:
        """True when the slider's value is its front end's snap of the exact value Python set."""
        exact = self._exact.get(slider.description)
        return exact is not None and exact > 0 and slider.value > 0 and \
            abs(math.log10(slider.value) - math.log10(exact)) <= slider.step / 2 + 1e-9

    def _value(self, slider: widgets.FloatLogSlider) -> float:
        return self._exact[slider.description] if self._echo(slider) else float(slider.value)

    def _rate_changed(self) -> None:
        if self._syncing or self._echo(self.rate):
            return
        with self._lock:
            if self.link.value != FREE_RATE:
                self._syncing = True
                try:  # a rate of one's own: the link is that rate, with the latency shown
                    self.link.value = FREE_RATE
                finally:
                    self._syncing = False
            self.redraw()

    def _latency_changed(self) -> None:
        if self._syncing or self._echo(self.latency):
            return
        self._latency_override = True
        self.redraw()

    def _changed(self, slider: widgets.FloatLogSlider | None = None) -> None:
        if not self._syncing and not (slider is not None and self._echo(slider)):
            self.redraw()

    # --- the model -----------------------------------------------------------------------
    def setting(self) -> Setting:
        """The controls as a :class:`~gtopk_lab.plotting.explorer_model.Setting`."""
        link = str(self.link.value)
        own_latency = link == FREE_RATE or self._latency_override
        # the slider's left end is latency 0 (a log slider has no 0)
        latency_us = self._value(self.latency)
        latency_s = 0.0 if latency_us <= LATENCY_FLOOR_US else latency_us * 1e-6
        return Setting(density=min(1.0, self._value(self.density)), workers=int(self.workers.value), link=link,
                       rate_bps=self._value(self.rate) * 1e9, latency_s=latency_s if own_latency else None,
                       methods=tuple(self.methods.value))

    def study_arguments(self) -> dict[str, Any]:
        """What **Run as study** passes to ``lab.study`` for the current setting."""
        return study_arguments(self.setting(), self.costs, self.base, self.seeds)

    def set_costs(self, costs: Costs) -> None:
        """Predict from other costs (e.g. ``costs_from_run(...)``) and redraw."""
        if not isinstance(costs, Costs):
            raise TypeError(f"costs has type {type(costs).__name__}: expected explorer_costs.Costs")
        with self._lock:
            self.costs = costs
            self.redraw()

    # --- drawing -------------------------------------------------------------------------
    def redraw(self) -> Prediction:
        """Predict the current setting and update both figures (steps 1-2 of the module
        docstring); returns the prediction. Safe from any thread."""
        with self._lock:
            started = time.perf_counter()
            prediction = predict(self.setting(), self.costs)
            self.prediction = prediction
            self._draw_efficiency(prediction)
            self._draw_breakdown(prediction)
            self.redraws += 1
            self.last_redraw_s = time.perf_counter() - started
            return prediction

    def _draw_efficiency(self, p: Prediction) -> None:
        label = self.study_setting.describe() if self.measured and self.study_setting is not None else ""
        self._shape = draw_efficiency(self.efficiency_figure, p, self.measured, self._shape, label)

    def _draw_breakdown(self, p: Prediction) -> None:
        draw_breakdown(self.breakdown_figure, p)

    def fit_figures(self) -> None:
        """Fit both figures to the width they have now (:mod:`~gtopk_lab.plotting.widget_fit`:
        a FigureWidget drawn off screen or in a box keeps 700 px otherwise)."""
        self.fits += 1
        for figure in (self.efficiency_figure, self.breakdown_figure):
            fit_width(figure)

    # --- Run as study ----------------------------------------------------------------------
    def run_study(self) -> "Future[Any] | None":
        """Launch the current setting as ``lab.study(**self.study_arguments())`` in a thread
        (returns at once): a Future of the Study, or None (no Lab, or a bad setting; the
        message line says which). Its measured points join the efficiency figure."""
        if self.lab is None:
            self._say("no Lab: create Explorer(lab) to run a study", error=True)
            return None
        try:
            setting = self.setting()
            arguments = study_arguments(setting, self.costs, self.base, self.seeds)
        except ValueError as exc:
            self._say(str(exc).splitlines()[0], error=True)
            return None
        future: Future[Any] = Future()
        self.run_button.disabled = True
        self._say(f"launching {', '.join(setting.methods)} at P = {arguments['workers']} ({setting.describe()}) ...")
        threading.Thread(target=self._start, args=(setting, arguments, future), name="gtopk-lab-explorer-study",
                         daemon=True).start()
        return future

    def _start(self, setting: Setting, arguments: dict[str, Any], future: "Future[Any]") -> None:
        try:  # Lab.study calibrates and submits: seconds, never in the kernel's thread
            study = self.lab.study(progress=False, refresh_s=self.refresh_s, **arguments)
        except Exception as exc:  # noqa: BLE001 - shown in the explorer, kept in the future
            self._say(f"the study did not start: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                      error=True)
            self.run_button.disabled = False
            future.set_exception(exc)
            return
        with self._lock:
            self.study, self.study_setting, self.measured = study, setting, []
        self._say(f"study launched: {len(getattr(study, 'points_list', ()))} point(s), {setting.describe()}; "
                  "measured points appear as diamonds")
        self.run_button.disabled = False
        self._on_study(study)
        study.subscribe(self._on_study)
        future.set_result(study)

    def _on_study(self, study: Any) -> None:
        """The study changed (its watcher thread): measured points, then maybe its costs."""
        try:
            with self._lock:
                if study is not self.study:
                    return
                points = study.points()
                self.measured = measured_points(points)
                # the study's own costs once its P = 1 baseline is final (updated as more of
                # its runs end), so the curves describe the workload the diamonds measured
                if self.follow_study and len(points) and "final" in points.columns and (
                        points["final"].astype(bool) & (points["workers"] == 1)).any():
                    costs = costs_from_study(study)
                    if costs is not None:
                        self.costs = costs
                self.redraw()
        except Exception as exc:  # noqa: BLE001 - a display error must never stop the study
            self._say(f"explorer refresh failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                      error=True)

    def _say(self, text: str, error: bool = False) -> None:
        self.message.value = status_line_html(text, error, max_width_px=520)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        return self.widget._repr_mimebundle_(include=include, exclude=exclude)


def panel_explorer(lab: Any, fields: Mapping[str, Any], methods: Sequence[str], extra: Mapping[str, Any]) -> Explorer:
    """The ControlPanel's what-if tab: an Explorer at the form's first density, link and
    latency (each a value or a list; a link the explorer cannot show, e.g. a calibration
    file, leaves its 1GbE default), whose studies get the form's workload and ``extra``."""
    def first(value: Any) -> Any:
        return (value[0] if value else None) if isinstance(value, (list, tuple)) else value

    base = {"model": fields["model"], "dataset": fields["dataset"], "epochs": int(fields["epochs"]), **extra}
    setting: dict[str, Any] = {"density": float(first(fields.get("density")) or 0.001)}
    link, latency = first(fields.get("bandwidth")), first(fields.get("latency"))
    if isinstance(link, str) and link.strip():
        setting["link"] = link.strip()
        if isinstance(latency, str) and latency.strip():
            setting["latency"] = latency.strip()
    try:
        return Explorer(lab, methods=list(methods) or None, base=base, **setting)
    except ValueError:  # e.g. a calibration file's link: the explorer's own defaults
        return Explorer(lab, methods=list(methods) or None, base=base, density=setting["density"])
