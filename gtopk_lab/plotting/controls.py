"""An ipywidgets control panel: launch studies on a ``Lab``, watch them live, compare runs.

The panel talks only to the public ``Lab`` / ``Study`` API (``lab.study(...) -> Study``,
``study.subscribe``, ``study.status()``, ``study.points()``, ``study.metrics()``,
``lab.runs()``):

- **Launch** builds a study from the form: methods from the registry
  (``gtopk_lab.methods.available_methods()``), comma-separated lists for P (``1,2,4,8``),
  densities, bandwidths and latencies, a seed count, model, dataset, epochs and an
  iteration cap (:mod:`gtopk_lab.plotting.panel_fields` parses them), and the study's name
  and tags that every run's summary records (``gtopk-lab runs --study/--tag``). A bad value shows one
  red line naming the field, never a traceback. ``Lab.study`` runs in a thread, so the
  button returns at once even for a large grid; P beyond the cluster's workers runs as
  simulator tasks on the workers (``Lab.study``).
- **Live tabs**: *efficiency* (scaling efficiency vs P) and *convergence* of every study
  launched from the panel and every one overlaid on it (:meth:`ControlPanel.overlay`: a
  notebook's study, or a stored one from ``Study.load``), each study a legend group that a
  click hides or shows, the earlier ones faded, legend names carrying only the fields that
  vary between the shown series (``gtopk ρ=0.001 1GbE``;
  :mod:`~gtopk_lab.plotting.panel_studies`). Both are ``ThreadSafeFigureWidget`` s (:mod:`~gtopk_lab.plotting.widget_sync`) made once
  with the panel and updated in place from the study's watcher thread (``Study.subscribe``,
  at most every ``refresh_s``): the kernel is never blocked, typing and clicking stay
  responsive while a study runs.
- **Run lines**: one line per run of every study launched from the panel (its status and
  rows so far), grouped by study, so a new study never overwrites an earlier one's lines.
- **what-if** tab: the :class:`~gtopk_lab.plotting.explorer.Explorer` (the alpha-beta
  model's efficiency and time per phase as sliders move; *Run as study* on this Lab).
- **Runs** tab: ``lab.runs()`` as a sortable, filterable itables table
  (:mod:`gtopk_lab.plotting.runs_table` says why itables); select rows by clicking and
  press *Compare selected* for their convergence and their numbers side by side
  (:mod:`~gtopk_lab.plotting.panel_compare`).
- **Lifetime**: a displayed panel needs its cluster, so the panel closes its ``Lab`` when
  the kernel shuts down (``atexit``, through a weak reference) and a notebook need not end
  with ``lab.close()``; a panel whose ``Lab`` was closed says so instead of failing.

Client side only. Needs a widget front end (JupyterLab, Notebook 7, VS Code).

Example::

    from gtopk_lab.orchestration.lab import Lab
    from gtopk_lab.plotting.controls import ControlPanel
    lab = Lab(n_workers=4)   # out: the results home, as for the notebooks and the CLI
    ControlPanel(lab, defaults={"methods": ["dense", "gtopk"], "workers": [1, 2, 4, 8]})
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from gtopk_lab.network.model import DEFAULT_NETWORK
from gtopk_lab.plotting.explorer import panel_explorer
from gtopk_lab.plotting.panel_compare import compare_runs
from gtopk_lab.plotting.panel_lines import study_lines_html
from gtopk_lab.plotting.panel_studies import PanelStudies
from gtopk_lab.plotting.widget_sync import ThreadSafeFigureWidget, copy_into
from gtopk_lab.orchestration.arguments import check_seconds
from gtopk_lab.plotting.panel_fields import FieldError, StudyRequest, check_defaults, first_line, status_line_html
from gtopk_lab.plotting.panel_form import BANDWIDTH_CHOICES, StudyForm
from gtopk_lab.plotting.runs_table import runs_frame, runs_table_widget, update_runs_table
from gtopk_lab.plotting.widget_fit import FitSignal, fit_width

__all__ = ["ControlPanel", "BANDWIDTH_CHOICES", "DEFAULT_FIELDS", "close_lab_at_exit"]

#: What the form shows when ``defaults`` does not say (a small study on the default link,
#: network.DEFAULT_NETWORK; epochs 0: the model's recipe, RunConfig's default without one).
DEFAULT_FIELDS: dict[str, Any] = {"methods": ["dense", "topk", "gtopk"], "workers": [1, 2, 4], "density": 0.01,
                                  "bandwidth": DEFAULT_NETWORK, "latency": "", "seeds": 1, "model": "mlp",
                                  "dataset": "mnist1d", "epochs": 0, "max_iterations": 0}
#: Other names ``defaults`` accepts (the study's and the old single-run panel's spellings).
_DEFAULT_ALIASES = {"method": "methods", "densities": "density", "bandwidths": "bandwidth",
                    "latencies": "latency"}
_CLOSED = "this panel's Lab is closed (lab.close() ran): start a new Lab and ControlPanel to launch studies"

# Labs whose close at interpreter exit is registered (once per Lab, without keeping it alive).
_CLOSE_AT_EXIT: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _close_ref(ref: "weakref.ref[Any]") -> None:
    lab = ref()
    if lab is not None:
        try:
            lab.close()
        except Exception:  # noqa: BLE001 - the interpreter is exiting: nothing to report to
            pass


def close_lab_at_exit(lab: Any) -> None:
    """Close ``lab`` when the interpreter (the notebook's kernel) exits: its runs are
    cancelled and written, its LocalCluster stopped. Registered once per Lab; a Lab that is
    garbage collected before is not kept alive by this."""
    try:
        if lab in _CLOSE_AT_EXIT:
            return
        _CLOSE_AT_EXIT.add(lab)
        atexit.register(_close_ref, weakref.ref(lab))
    except TypeError:  # not weak-referenceable (a test double): its owner closes it
        pass


def _placeholder_figure(title: str) -> go.Figure:
    """An empty figure whose title says what will appear (no meaningless default axes; the
    first real figure's axes and title replace these)."""
    fig = go.Figure()
    fig.update_layout(title=title, template="plotly_white", height=420,
                      xaxis={"visible": False}, yaxis={"visible": False})
    return fig


class ControlPanel:
    """Launch studies on a ``Lab`` and watch them; see the module docstring.

    ``defaults`` pre-fills the form: ``methods`` (or ``method``), ``workers`` (a P or a list),
    ``density``, ``bandwidth``, ``latency`` (each a value or a list), ``seeds``, ``model``,
    ``dataset``, ``epochs`` (0: the model's recipe), ``max_iterations`` (0: all epochs). ``extra`` holds RunConfig
    fields every run gets but the form does not show (e.g. ``{"train_samples": 800}``).
    ``refresh_s``: the studies' refresh interval (figures, lines, table).
    """

    def __init__(self, lab: Any, defaults: dict[str, Any] | None = None, extra: dict[str, Any] | None = None,
                 *, refresh_s: float = 1.0) -> None:
        for attr in ("study", "runs"):
            if not hasattr(lab, attr):
                raise TypeError(f"lab has type {type(lab).__name__}: expected a gtopk_lab Lab (missing .{attr})")
        if defaults is not None and not isinstance(defaults, dict):
            raise TypeError(f"defaults={defaults!r} has type {type(defaults).__name__}: expected a dict "
                            f"of form fields ({', '.join(DEFAULT_FIELDS)}) or None")
        d = dict(DEFAULT_FIELDS)
        given = {_DEFAULT_ALIASES.get(k, k): v for k, v in (defaults or {}).items()}
        unknown = sorted(set(given) - set(d))
        if unknown:
            raise ValueError(f"defaults has unknown field(s) {', '.join(unknown)}: expected {', '.join(d)}")
        d.update(given)
        check_defaults(d, extra)  # fail now, not at the first launch, on a bad value
        self.lab = lab
        self.extra = dict(extra or {})
        self.refresh_s = check_seconds("refresh_s", refresh_s, high=3600.0)
        #: The studies launched from the panel (newest last), and every study its figures show
        #: (these and the overlaid ones, :mod:`~gtopk_lab.plotting.panel_studies`).
        self.studies: list[Any] = []
        self.shown = PanelStudies()
        self.study: Any = None
        self._lock = threading.RLock()
        self._table_key: tuple[Any, ...] | None = None
        self._table_frame = runs_frame(pd.DataFrame())
        self.fits = 0  # how often the figures were fitted to the panel's width (tests read it)
        self._build_widgets(d)
        close_lab_at_exit(lab)
        self.refresh_runs()
        if self.lab_closed():
            self._show_closed()

    # --- widgets -------------------------------------------------------------------------
    def _build_widgets(self, d: dict[str, Any]) -> None:
        self.form = StudyForm(d)
        # the fields, as attributes: what tests and users set (panel.workers.value = "1,2")
        f = self.form
        self.methods, self.workers, self.densities, self.bandwidths, self.latencies = (
            f.methods, f.workers, f.densities, f.bandwidths, f.latencies)
        self.seeds, self.model, self.dataset, self.epochs, self.max_iterations, self.rerun = (
            f.seeds, f.model, f.dataset, f.epochs, f.max_iterations, f.rerun)
        self.study_name, self.tags = f.study_name, f.tags
        self.launch_button = widgets.Button(description="Launch", button_style="primary", icon="play",
                                            tooltip="launch the study (returns at once)")
        self.cancel_button = widgets.Button(description="Cancel", icon="stop",
                                            tooltip="cancel the unfinished runs of every study of this panel")
        self.message = widgets.HTML(layout=widgets.Layout(min_height="22px"))
        self.run_lines = widgets.HTML(value="<i>no study launched yet</i>")
        self.efficiency_figure = ThreadSafeFigureWidget(_placeholder_figure(
            "Scaling efficiency: press Launch; each point appears once its run's throughput is known"))
        self.convergence_figure = ThreadSafeFigureWidget(_placeholder_figure(
            "Convergence: press Launch; train loss per method and P, live"))
        self.runs_table = runs_table_widget(self._table_frame)
        self.compare_button = widgets.Button(description="Compare selected", icon="columns",
                                             tooltip="select rows in the table first (click them)",
                                             layout=widgets.Layout(width="auto"))
        self.refresh_button = widgets.Button(description="Refresh table", icon="refresh",
                                             layout=widgets.Layout(width="auto"))
        self.compare_box = widgets.VBox()
        self.launch_button.on_click(lambda _b: self.launch())
        self.cancel_button.on_click(lambda _b: self.cancel())
        self.compare_button.on_click(lambda _b: self.compare())
        self.refresh_button.on_click(lambda _b: self.refresh_runs(force=True))

        buttons = widgets.HBox([self.launch_button, self.cancel_button, self.message],
                               layout=widgets.Layout(align_items="center", grid_gap="8px"))
        lines = widgets.Box([self.run_lines], layout=widgets.Layout(
            max_height="180px", overflow="auto", border="1px solid #e0e0e0", padding="2px 6px"))
        runs_tab = widgets.VBox([widgets.HBox([self.compare_button, self.refresh_button]), self.runs_table,
                                 self.compare_box])
        # the what-if explorer: the model's prediction before any run (its Run as study
        # launches on this panel's Lab, with the form's workload)
        self.explorer = panel_explorer(self.lab, d, list(f.methods.value), self.extra)
        self.tabs = widgets.Tab(children=[self.efficiency_figure, self.convergence_figure, runs_tab,
                                          self.explorer.widget])
        for i, title in enumerate(("efficiency (live)", "convergence (live)", "runs", "what-if")):
            self.tabs.set_title(i, title)
        # Full width for the tabs: the figures get the notebook's whole output width, so
        # their axis titles and legends have room (a form beside them halved it).
        self.tabs.observe(lambda _change: self.fit_figures(), names="selected_index")
        self.widget = widgets.VBox([self.form.box, buttons, lines, self.tabs, FitSignal(self.fit_figures, ".gtopk-panel")],
                                   layout=widgets.Layout(width="100%"))
        # CSS classes: how a browser test (or a user's stylesheet) finds the panel's parts
        self.widget.add_class("gtopk-panel")
        self.message.add_class("gtopk-panel-message")
        self.run_lines.add_class("gtopk-panel-lines")

    # --- state ---------------------------------------------------------------------------
    def lab_closed(self) -> bool:
        """True once the panel's Lab was closed (no study can be launched on it)."""
        closed = getattr(self.lab, "closed", None)
        if isinstance(closed, bool):
            return closed
        monitor = getattr(self.lab, "_monitor", None)
        return bool(getattr(monitor, "closed", False))

    def _show_closed(self) -> None:
        self._say(_CLOSED, error=True)
        self.launch_button.disabled = True

    def study_request(self) -> StudyRequest:
        """The form as ``Lab.study`` arguments, every value checked (raises FieldError)."""
        return self.form.request(self.extra)

    # --- actions -------------------------------------------------------------------------
    def launch(self) -> "Future[Any] | None":
        """Check the form and launch its study in a thread; returns at once.

        Returns a ``Future`` of the :class:`~gtopk_lab.orchestration.study.Study` (its
        exception if ``Lab.study`` failed), or None when the form has a bad value or the
        Lab is closed (the panel says which).
        """
        if self.lab_closed():
            self._show_closed()
            return None
        try:
            request = self.study_request()
            identity = self.form.identity()
        except FieldError as exc:
            self._say(str(exc), error=True)
            return None
        future: Future[Any] = Future()
        self.launch_button.disabled = True  # one launch at a time; re-enabled when submitted
        self._say(f"launching {request.describe()} ...")
        threading.Thread(target=self._start_study, args=(request, bool(self.rerun.value), future, identity),
                         name="gtopk-lab-panel-launch", daemon=True).start()
        return future

    def _start_study(self, request: StudyRequest, rerun: bool, future: "Future[Any]",
                     identity: tuple[str | None, tuple[str, ...]] = (None, ())) -> None:
        # Runs in its own thread: submitting a large grid takes a while (one scheduler
        # round trip per point), and the kernel must stay free meanwhile.
        study_id, tags = identity
        named = {"study_id": study_id, "tags": tags} if study_id or tags else {}
        try:
            study = self.lab.study(base=request.base, skip_completed=not rerun, progress=False,
                                   refresh_s=self.refresh_s, **named, **request.axes)
        except Exception as exc:  # noqa: BLE001 - shown in the panel, and kept in the future
            if self.lab_closed():
                self._show_closed()
            else:
                self._say(f"the study did not start: {first_line(exc)}", error=True)
                self.launch_button.disabled = False
            future.set_exception(exc)
            return
        with self._lock:
            self.studies.append(study)
            self.study = study
            number = self.shown.add(study, launched=True)
        points = len(getattr(study, "points_list", ())) or None
        stored = (points or 0) - len(study.handles) if points else 0
        self._say(f"study {number}: {request.describe(points)} launched"
                  + (f" ({stored} already completed, not run again)" if stored else ""))
        self.launch_button.disabled = False
        self._on_study(study)  # the lines and figures at once, then from the watcher thread
        study.subscribe(self._on_study)
        future.set_result(study)

    def cancel(self) -> int:
        """Cancel the unfinished runs of every study of this panel; returns how many."""
        cancelled = 0
        for study in list(self.studies):
            for handle in study.handles.values():
                if not handle.done():
                    cancelled += 1
            study.cancel()
        self._say(f"cancelling {cancelled} unfinished run(s)" if cancelled else "nothing to cancel")
        return cancelled

    def overlay(self, study: Any) -> None:
        """Show ``study`` on the efficiency and convergence tabs beside the panel's own: a
        study launched in the notebook (``lab.study(...)``) or a stored one
        (``Study.load(out, study_id)``); it fills in live while it runs. Its runs get status
        lines too; *Cancel* leaves it alone (it is not the panel's)."""
        for attr in ("points", "metrics", "status", "done", "subscribe"):
            if not hasattr(study, attr):
                raise TypeError(f"study has type {type(study).__name__}: expected a gtopk_lab Study "
                                f"(missing .{attr})")
        if study in self.shown:
            return
        number = self.shown.add(study, launched=False)
        self._say(f"study {number}: {getattr(study, 'study_id', '')} overlaid")
        self._on_study(study)
        if not study.done():
            study.subscribe(self._on_study)

    def _on_study(self, study: Any) -> None:
        """A study changed (called from its watcher thread): figures, lines, table."""
        try:
            with self._lock:
                # every shown study on both figures; the changed study's last call re-sends
                # them whole: a front end that missed one of the partial updates (the
                # browser test once showed an empty efficiency figure after every run had
                # completed) is made whole
                final = study.done()
                efficiency, convergence = self.shown.figures()
                copy_into(self.efficiency_figure, efficiency, replace=final)
                copy_into(self.convergence_figure, convergence, replace=final)
                self.run_lines.value = self._lines_html()
            self.refresh_runs()
        except Exception as exc:  # noqa: BLE001 - a display error must never stop the study
            self._say(f"panel refresh failed: {type(exc).__name__}: {first_line(exc)}", error=True)

    def _lines_html(self) -> str:
        return study_lines_html(self.shown.numbered())

    def fit_figures(self) -> None:
        """Fit every figure of the panel to the width it has now (see
        :mod:`gtopk_lab.plotting.widget_fit`: called when the panel scrolls into view, changes
        width or shows a new plot, and on a tab change)."""
        with self._lock:
            self.fits += 1
            shown = [self.efficiency_figure, self.convergence_figure, self.explorer.efficiency_figure,
                     self.explorer.breakdown_figure]
            shown += [w for w in self.compare_box.children if isinstance(w, go.FigureWidget)]
            for figure in shown:
                fit_width(figure)

    def _live_status(self) -> pd.DataFrame:
        frames = [s.status() for _, s, _ in self.shown.numbered()]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def refresh_runs(self, force: bool = False) -> pd.DataFrame:
        """Reload ``lab.runs()`` into the runs table (only when a run's status changed,
        unless ``force``: a new table resets the reader's sorting). Returns the table's rows."""
        with self._lock:
            live = self._live_status()
            key = tuple(zip(live["run_id"], live["status"])) if len(live) else ()
            if not force and key == self._table_key:
                return self._table_frame
            frame = runs_frame(self.lab.runs(), live)
            selected = set(self._selected_run_ids())
            self._table_key, self._table_frame = key, frame
            update_runs_table(self.runs_table, frame, [i for i, r in enumerate(frame["run_id"]) if r in selected])
            return frame

    def _selected_run_ids(self) -> list[str]:
        rows = list(getattr(self.runs_table, "selected_rows", []) or [])
        ids = self._table_frame["run_id"].tolist()
        return [ids[i] for i in rows if 0 <= i < len(ids)]

    def compare(self, run_ids: Sequence[str] | None = None, x: str = "iteration") -> go.Figure | None:
        """Convergence of the selected (or given) runs and their numbers side by side,
        shown under the runs table (:mod:`~gtopk_lab.plotting.panel_compare`); returns the
        figure (None when nothing is selected or stored yet)."""
        chosen = list(run_ids if run_ids is not None else self._selected_run_ids())
        compared = compare_runs(self.lab, chosen, x)
        if isinstance(compared, str):
            self._say(compared, error=True)
            return None
        fig, numbers = compared
        from itables.widget import ITable

        self.compare_box.children = [ThreadSafeFigureWidget(fig),  # (its front end is ready in time)
                                     ITable(numbers, paging=False, ordering=False, layout={"topStart": None, "topEnd": None},
                                            showIndex=True, classes="display compact nowrap")]
        self._say(f"comparing {len(chosen)} run(s)")
        return fig

    def _say(self, text: str, error: bool = False) -> None:
        self.message.value = status_line_html(text, error, max_width_px=900)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        if self.lab_closed():
            self._show_closed()
        return self.widget._repr_mimebundle_(include=include, exclude=exclude)
