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
- **Live tabs**: *efficiency*, the scaling-efficiency figure of the latest study
  (:func:`~gtopk_lab.plotting.live_study.scaling_study_figure`, what ``live_scaling``
  draws) and *convergence* (:func:`~gtopk_lab.plotting.live_study.convergence_study_figure`).
  Both are ``ThreadSafeFigureWidget`` s (:mod:`~gtopk_lab.plotting.widget_sync`) made once
  with the panel and updated in place from the study's watcher thread (``Study.subscribe``,
  at most every ``refresh_s``): the kernel is never blocked, typing and clicking stay
  responsive while a study runs.
- **Run lines**: one line per run of every study launched from the panel (its status and
  rows so far), grouped by study, so a new study never overwrites an earlier one's lines.
- **what-if** tab: the :class:`~gtopk_lab.plotting.explorer.Explorer` (the alpha-beta
  model's efficiency and time per phase as sliders move; *Run as study* on this Lab).
- **Runs** tab: ``lab.runs()`` as a sortable, filterable itables table
  (:mod:`gtopk_lab.plotting.runs_table` says why itables); select rows by clicking and
  press *Compare selected* for their convergence and their numbers side by side.
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
import html
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from gtopk_lab.network.model import DEFAULT_NETWORK
from gtopk_lab.plotting import figures
from gtopk_lab.plotting.explorer import panel_explorer
from gtopk_lab.plotting.widget_sync import ThreadSafeFigureWidget, copy_into
from gtopk_lab.plotting.live_study import convergence_study_figure, scaling_study_figure
from gtopk_lab.orchestration.arguments import check_seconds
from gtopk_lab.plotting.panel_fields import FieldError, StudyRequest, check_defaults, first_line, status_line_html
from gtopk_lab.plotting.panel_form import BANDWIDTH_CHOICES, StudyForm
from gtopk_lab.plotting.runs_table import compare_frame, runs_frame, runs_table_widget, selects, update_runs_table
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
_STATUS_COLOR = {"completed": "#2e7d32", "running": "#1565c0", "queued": "#757575",
                 "failed": "#b00020", "cancelled": "#e65100", "crashed": "#6a1b9a"}
_STATUS_MARK = {"completed": "✓", "running": "▶", "queued": "…", "failed": "✗", "cancelled": "■",
                "crashed": "⚠"}
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


#: Line dashes that tell apart compared runs of one colour (one method).
_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def _side_by_side(figure: go.Figure) -> go.Figure:
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
        dashes.setdefault(run, _DASHES[len(dashes) % len(_DASHES)])
        trace.line.dash = dashes[run]
    return figure


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
        self.studies: list[Any] = []
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
            number = len(self.studies)
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

    def _on_study(self, study: Any) -> None:
        """A study changed (called from its watcher thread): figures, lines, table."""
        try:
            with self._lock:
                if study is self.study:
                    # the study's last call re-sends the figures whole: a front end that
                    # missed one of the partial updates (the browser test once showed an
                    # empty efficiency figure after every run had completed) is made whole
                    final = study.done()
                    copy_into(self.efficiency_figure, scaling_study_figure(study.points()), replace=final)
                    copy_into(self.convergence_figure, convergence_study_figure(study.metrics()),
                               replace=final)
                self.run_lines.value = self._lines_html()
            self.refresh_runs()
        except Exception as exc:  # noqa: BLE001 - a display error must never stop the study
            self._say(f"panel refresh failed: {type(exc).__name__}: {first_line(exc)}", error=True)

    def _lines_html(self) -> str:
        blocks = []
        for number, study in reversed(list(enumerate(self.studies, start=1))):  # newest on top
            status = study.status()
            counts = status["status"].str.replace(" (stored)", "", regex=False).value_counts()
            summary = ", ".join(f"{n} {s}" for s, n in counts.items())
            name = getattr(study, "study_id", None)
            lines = [f"<b>study {number}</b>: {len(status)} point(s): {html.escape(summary)}"
                     + (f"  [study {html.escape(str(name))}]" if name else "")]
            for row in status.itertuples():
                state = str(row.status).replace(" (stored)", "")
                stored = " (stored)" if str(row.status).endswith("(stored)") else ""
                density = f" ρ={row.density:g}" if selects(row.method) else ""
                network = str(row.bandwidth) + (f", {row.latency}" if row.latency else "")
                rows = "" if row.rows is None or pd.isna(row.rows) else f", {int(row.rows)} rows"
                reason = getattr(row, "queue_reason", None)
                if state == "queued" and isinstance(reason, str):  # e.g. workers another client holds
                    rows += f" ({reason})"
                text = (f"{_STATUS_MARK.get(state, '·')} {row.method} P={row.workers}{density} {network} "
                        f"seed {row.seed} {row.source}: {state}{stored}{rows}  [{row.run_id}]")
                lines.append(f"<span style='color:{_STATUS_COLOR.get(state, '#333')}'>{html.escape(text)}</span>")
            blocks.append("<br>".join(lines))
        return ("<div style='font-family:monospace;font-size:12px;line-height:1.35'>"
                + "<hr style='margin:2px 0'>".join(blocks) + "</div>") if blocks else "<i>no study launched yet</i>"

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
        frames = [s.status() for s in list(self.studies)]
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
        shown under the runs table; returns the figure (None when nothing is selected)."""
        chosen = list(run_ids if run_ids is not None else self._selected_run_ids())
        if not chosen:
            self._say("select runs in the runs table first (click rows), then Compare selected", error=True)
            return None
        from gtopk_lab.orchestration.results import load_metrics

        metrics = load_metrics(self.lab.out, run_ids=chosen) if hasattr(self.lab, "out") else self.lab.load()[1]
        metrics = metrics[metrics["run_id"].isin(chosen)] if len(metrics) else metrics
        numbers = compare_frame(self.lab.runs(), chosen)
        if not len(metrics):
            self._say(f"no metric rows stored yet for {len(chosen)} selected run(s)", error=True)
            return None
        fig = _side_by_side(figures.convergence_figure(metrics, x=x, title=f"{len(chosen)} run(s) side by side"))
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
