"""The ControlPanel's study form: its widgets, pre-filled from defaults, and what they ask for.

One field per ``Lab.study`` axis the panel offers (methods from the registry, P list,
densities, bandwidths, latencies, seeds) and the run fields model, dataset, epochs and an
iteration cap; :meth:`StudyForm.request` reads them into a checked
:class:`~gtopk_lab.plotting.panel_fields.StudyRequest` (parsing:
:mod:`gtopk_lab.plotting.panel_fields`). The study's name and tags (recorded in every run's
summary, :mod:`gtopk_lab.orchestration.run_identity`) are :meth:`StudyForm.identity`.
Client side only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets

from gtopk_lab.methods import available_methods
from gtopk_lab.plotting.panel_fields import FieldError, StudyRequest, format_list, study_request

__all__ = ["BANDWIDTH_CHOICES", "StudyForm"]

#: Presets the bandwidth box suggests; anything NetworkModel.from_strings parses is accepted.
BANDWIDTH_CHOICES: tuple[str, ...] = ("none", "1GbE", "10GbE", "25GbE", "100G-IB", "100Mbps", "1Gbps")
_FIELD = {"description_width": "96px"}
_WIDE = widgets.Layout(width="300px")


def _choices(module: str, name: str, fallback: Sequence[str]) -> list[str]:
    try:
        mod = __import__(module, fromlist=[name])
        return list(getattr(mod, name))
    except Exception:  # noqa: BLE001 - the panel still works with the fallback names
        return list(fallback)


class StudyForm:
    """The form's widgets from ``d`` (every field of ``controls.DEFAULT_FIELDS``, already
    checked) and ``box``, their layout (three columns that wrap on a narrow page)."""

    def __init__(self, d: dict[str, Any]) -> None:
        registry = list(available_methods())
        methods = [m for m in (d["methods"] if isinstance(d["methods"], (list, tuple)) else [d["methods"]])
                   if m in registry]
        self.methods = widgets.SelectMultiple(options=registry, value=tuple(methods), rows=min(len(registry), 7),
                                              description="methods", style=_FIELD, layout=_WIDE)
        self.workers = widgets.Text(value=format_list(d["workers"]), placeholder="1,2,4,8",
                                    description="P list", style=_FIELD, layout=_WIDE)
        self.densities = widgets.Text(value=format_list(d["density"]), placeholder="0.01,0.001",
                                      description="densities ρ", style=_FIELD, layout=_WIDE)
        self.bandwidths = widgets.Text(value=format_list(d["bandwidth"]), placeholder=",".join(BANDWIDTH_CHOICES[1:4]),
                                       description="bandwidths", style=_FIELD, layout=_WIDE,
                                       tooltip="presets: " + ", ".join(BANDWIDTH_CHOICES) + "; or a rate like 2.5Gbps")
        self.latencies = widgets.Text(value=format_list(d["latency"]), placeholder="each link's own (e.g. 0.5ms,5ms)",
                                      description="latencies", style=_FIELD, layout=_WIDE)
        self.seeds = widgets.BoundedIntText(value=int(d["seeds"]), min=1, max=1000, description="seeds",
                                            style=_FIELD, layout=_WIDE)
        models = _choices("gtopk_lab.training.models", "MODELS", ("mlp", "cnn", "digits_cnn", "resnet20"))
        datasets = _choices("gtopk_lab.training.data", "DATASETS", ("mnist1d", "digits", "synthetic"))
        self.model = widgets.Dropdown(options=models, value=d["model"] if d["model"] in models else models[0],
                                      description="model", style=_FIELD, layout=_WIDE)
        self.dataset = widgets.Dropdown(options=datasets,
                                        value=d["dataset"] if d["dataset"] in datasets else datasets[0],
                                        description="dataset", style=_FIELD, layout=_WIDE)
        self.epochs = widgets.BoundedIntText(value=int(d["epochs"] or 0), min=0, max=10_000, description="epochs",
                                             style=_FIELD, layout=_WIDE,
                                             tooltip="0: the model's recipe (RunConfig's default without one)")
        self.max_iterations = widgets.BoundedIntText(value=int(d["max_iterations"] or 0), min=0, max=10**9,
                                                     description="max iters", style=_FIELD, layout=_WIDE,
                                                     tooltip="0: all epochs")
        self.rerun = widgets.Checkbox(value=False, description="rerun completed points", indent=False)
        self.study_name = widgets.Text(value="", placeholder="generated: study-<time>-<hex>",
                                       description="study name", style=_FIELD, layout=_WIDE)
        self.tags = widgets.Text(value="", placeholder="e.g. baseline,1GbE", description="tags",
                                 style=_FIELD, layout=_WIDE)
        self.box = widgets.HBox([
            widgets.VBox([self.methods, self.seeds, self.study_name, self.tags]),
            widgets.VBox([self.workers, self.densities, self.bandwidths, self.latencies]),
            widgets.VBox([self.model, self.dataset, self.epochs, self.max_iterations, self.rerun])],
            layout=widgets.Layout(flex_flow="row wrap", grid_gap="8px"))

    def request(self, extra: dict[str, Any]) -> StudyRequest:
        """The form as ``Lab.study`` arguments, every value checked (raises FieldError);
        ``extra``: RunConfig fields every run gets but the form does not show."""
        return study_request(methods=list(self.methods.value), workers=self.workers.value,
                             densities=self.densities.value, bandwidths=self.bandwidths.value,
                             latencies=self.latencies.value, seeds=int(self.seeds.value), model=self.model.value,
                             dataset=self.dataset.value, epochs=int(self.epochs.value),
                             max_iterations=int(self.max_iterations.value), extra=extra)

    def identity(self) -> tuple[str | None, tuple[str, ...]]:
        """``(study_id, tags)`` for ``Lab.study``: the study name (blank: generated) and the
        tags, separated by commas or spaces; raises FieldError naming the field."""
        from gtopk_lab.orchestration.run_identity import check_study_id, check_tags

        name = self.study_name.value.strip()
        try:
            study_id = check_study_id(name, "study name") if name else None
        except ValueError as exc:
            raise FieldError("study name", str(exc).split(" is invalid: ", 1)[-1]) from None
        words = [t for t in self.tags.value.replace(",", " ").split() if t]
        try:
            return study_id, check_tags(words)
        except ValueError as exc:
            raise FieldError("tags", str(exc).split(" is invalid: ", 1)[-1]) from None
