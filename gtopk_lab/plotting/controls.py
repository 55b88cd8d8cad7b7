"""An ipywidgets control panel: configure, launch and compare runs from a notebook.

The panel talks only to the public ``Lab`` API (``lab.submit(RunConfig) -> RunHandle``,
``handle.wait()``, ``lab.runs()``, ``lab.load()``):

- **Launch**: method(s), density, P, bandwidth, latency, model, dataset, epochs and an
  optional iteration cap build one validated :class:`~gtopk_lab.config.RunConfig` per
  selected method; each is submitted and the live convergence figure (a
  ``go.FigureWidget``, see :mod:`gtopk_lab.plotting.live`) follows all of them.
  Validation errors are shown in the panel (red) instead of being raised into the
  button callback, where nobody would see them.
- **Finished runs**: a table of ``lab.runs()``, refreshed whenever a launched run ends.
- **Compare**: pick runs in the list and draw their convergence side by side.

Client side only. Needs a widget front end (JupyterLab, Notebook 7, VS Code).

Example::

    from gtopk_lab.orchestration.lab import Lab
    from gtopk_lab.plotting.controls import ControlPanel
    lab = Lab(n_workers=4, out="results/panel")
    ControlPanel(lab)          # last expression of a cell: the panel appears
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from gtopk_lab.config import RunConfig
from gtopk_lab.methods import available_methods
from gtopk_lab.plotting import figures
from gtopk_lab.plotting.live import LiveFigure

__all__ = ["ControlPanel", "BANDWIDTH_CHOICES"]

#: Suggestions of the bandwidth box; anything NetworkModel.from_strings parses is accepted.
BANDWIDTH_CHOICES: tuple[str, ...] = ("none", "1GbE", "10GbE", "25GbE", "100G-IB", "100Mbps", "1Gbps")
_RUN_COLUMNS = ("run_id", "status", "method", "workers", "density", "network", "iterations",
                "final_test_accuracy", "samples_per_s_virtual")


def _choices(module: str, name: str, fallback: Sequence[str]) -> list[str]:
    try:
        mod = __import__(module, fromlist=[name])
        return list(getattr(mod, name))
    except Exception:  # noqa: BLE001 - the panel still works with the fallback names
        return list(fallback)


class ControlPanel:
    """Launch runs on a ``Lab`` and watch them; see the module docstring.

    ``defaults`` pre-fills any RunConfig field shown in the panel (``workers``, ``density``,
    ``epochs``, ``bandwidth`` ...) and ``extra`` holds RunConfig fields passed to every run
    but not shown (e.g. ``{"train_samples": 800, "max_iterations": 40}``).
    """

    def __init__(self, lab: Any, defaults: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> None:
        for attr in ("submit", "runs", "load"):
            if not hasattr(lab, attr):
                raise TypeError(f"lab has type {type(lab).__name__}: expected a gtopk_lab Lab (missing .{attr})")
        base = RunConfig()
        d = {"method": base.method, "workers": base.workers, "density": base.density, "bandwidth": "1GbE",
             "latency": "", "model": "mlp", "dataset": "mnist1d", "epochs": base.epochs, "max_iterations": 0}
        unknown = sorted(set(defaults or {}) - set(d))
        if unknown:
            raise ValueError(f"defaults has unknown field(s) {', '.join(unknown)}: expected {', '.join(d)}")
        d.update(defaults or {})
        RunConfig(**(extra or {}))  # fail now, not at the first launch, on a bad extra field
        self.lab = lab
        self.extra = dict(extra or {})
        self.handles: list[Any] = []
        self.live: LiveFigure | None = None
        style = {"description_width": "110px"}
        methods = d["method"] if isinstance(d["method"], (list, tuple)) else [d["method"]]
        self.methods = widgets.SelectMultiple(options=list(available_methods()), value=tuple(methods),
                                              rows=min(len(available_methods()), 8),
                                              description="method(s)", style=style)
        self.density = widgets.BoundedFloatText(value=float(d["density"]), min=1e-6, max=1.0, step=0.001,
                                                description="density ρ", style=style)
        self.workers = widgets.BoundedIntText(value=int(d["workers"]), min=1, max=4096, description="workers P",
                                              style=style)
        self.bandwidth = widgets.Combobox(value=str(d["bandwidth"]), options=list(BANDWIDTH_CHOICES),
                                          description="bandwidth", ensure_option=False, style=style)
        self.latency = widgets.Text(value=str(d["latency"] or ""), placeholder="preset's (e.g. 0.5ms)",
                                    description="latency", style=style)
        models = _choices("gtopk_lab.training.models", "MODELS", ("mlp", "cnn", "digits_cnn", "resnet20"))
        datasets = _choices("gtopk_lab.training.data", "DATASETS", ("mnist1d", "digits", "synthetic"))
        self.model = widgets.Dropdown(options=models, value=d["model"] if d["model"] in models else models[0],
                                      description="model", style=style)
        self.dataset = widgets.Dropdown(options=datasets,
                                        value=d["dataset"] if d["dataset"] in datasets else datasets[0],
                                        description="dataset", style=style)
        self.epochs = widgets.BoundedIntText(value=int(d["epochs"]), min=1, max=10_000, description="epochs",
                                             style=style)
        self.max_iterations = widgets.BoundedIntText(value=int(d["max_iterations"] or 0), min=0, max=10**9,
                                                     description="max iters (0: all)", style=style)
        self.launch_button = widgets.Button(description="Launch", button_style="primary", icon="play")
        self.status = widgets.HTML()
        self.runs_table = widgets.HTML()
        self.compare_select = widgets.SelectMultiple(options=[], rows=6, description="compare",
                                                     layout=widgets.Layout(width="95%"))
        self.compare_button = widgets.Button(description="Compare selected", icon="columns")
        self.refresh_button = widgets.Button(description="Refresh table", icon="refresh")
        self.figure_box = widgets.VBox()
        self.compare_box = widgets.VBox()
        self.launch_button.on_click(lambda _b: self.launch())
        self.compare_button.on_click(lambda _b: self.compare())
        self.refresh_button.on_click(lambda _b: self.refresh_runs())
        form = widgets.VBox([self.methods, self.density, self.workers, self.bandwidth, self.latency,
                             self.model, self.dataset, self.epochs, self.max_iterations,
                             self.launch_button, self.status])
        finished = widgets.VBox([widgets.HBox([self.refresh_button]), self.runs_table, self.compare_select,
                                 self.compare_button, self.compare_box])
        tabs = widgets.Tab(children=[self.figure_box, finished])
        tabs.set_title(0, "live")
        tabs.set_title(1, "finished runs")
        self.widget = widgets.HBox([form, tabs])
        self._lock = threading.Lock()
        self.refresh_runs()

    # --- actions ------------------------------------------------------------------------
    def configs(self) -> list[RunConfig]:
        """One validated RunConfig per selected method (raises ValueError/TypeError)."""
        if not self.methods.value:
            raise ValueError("method(s)=() is invalid: select at least one method")
        common = dict(self.extra)
        common.update(workers=int(self.workers.value), density=float(self.density.value),
                      bandwidth=self.bandwidth.value.strip() or "none",
                      latency=self.latency.value.strip() or None, model=self.model.value,
                      dataset=self.dataset.value, epochs=int(self.epochs.value),
                      max_iterations=int(self.max_iterations.value) or common.get("max_iterations"))
        return [RunConfig(method=m, **{**common, "density": 1.0 if m == "dense" else common["density"]})
                for m in self.methods.value]

    def launch(self) -> list[Any]:
        """Submit the configured runs and follow them in the live figure; returns the handles."""
        try:
            configs = self.configs()
            handles = [self.lab.submit(c) for c in configs]
        except (ValueError, TypeError) as exc:
            self._say(str(exc), error=True)
            return []
        self.handles.extend(handles)
        if self.live is not None:
            self.live.close()
        self.live = LiveFigure(handles, live=True, display=False)
        self.figure_box.children = [self.live.figure]  # type: ignore[list-item]
        self._say(f"launched {len(handles)} run(s): " + ", ".join(h.run_id for h in handles))
        for handle in handles:
            threading.Thread(target=self._when_done, args=(handle,), daemon=True,
                             name=f"panel-{handle.run_id}").start()
        return handles

    def _when_done(self, handle: Any) -> None:
        handle.wait()
        self._say(f"run {handle.run_id} {handle.status}" + (f": {handle.error}" if handle.error else ""),
                  error=handle.status != "completed")
        self.refresh_runs()

    def refresh_runs(self) -> pd.DataFrame:
        """Reload ``lab.runs()`` into the table and the compare list."""
        with self._lock:
            runs = self.lab.runs()
            cols = [c for c in _RUN_COLUMNS if c in runs.columns]
            shown = runs[cols].copy() if len(runs) else pd.DataFrame(columns=cols)
            if "final_test_accuracy" in shown.columns:
                shown["final_test_accuracy"] = shown["final_test_accuracy"].map(
                    lambda v: "" if v is None or pd.isna(v) else f"{100 * float(v):.1f}%")
            self.runs_table.value = (shown.to_html(index=False, border=0, na_rep="", float_format="{:.4g}".format)
                                     if len(shown) else "<i>no finished runs yet</i>")
            done = runs[runs["status"] == "completed"] if "status" in runs.columns else runs
            self.compare_select.options = [
                (f"{figures.run_label(r.method, r.density, r.workers)}  [{r.run_id}]", r.run_id)
                for r in done.itertuples()]
            return runs

    def compare(self, run_ids: Sequence[str] | None = None, x: str = "iteration") -> go.Figure | None:
        """Convergence of the selected (or given) runs side by side, shown under the list."""
        chosen = list(run_ids if run_ids is not None else self.compare_select.value)
        if not chosen:
            self._say("select runs to compare first", error=True)
            return None
        _, metrics = self.lab.load()
        metrics = metrics[metrics["run_id"].isin(chosen)]
        fig = figures.convergence_figure(metrics, x=x, title=f"{len(chosen)} run(s) side by side")
        self.compare_box.children = [go.FigureWidget(fig)]
        return fig

    def _say(self, text: str, error: bool = False) -> None:
        import html

        color = "#b00020" if error else "#2e7d32"
        self.status.value = f"<span style='color:{color}'>{html.escape(text)}</span>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        return self.widget._repr_mimebundle_(include=include, exclude=exclude)
