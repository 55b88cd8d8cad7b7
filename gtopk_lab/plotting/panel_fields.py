"""The ControlPanel's text fields: lists a person types (commas, spaces or both, as on the
command line: :func:`gtopk_lab.counts.split_list`), parsed and checked.

Every parser raises :class:`FieldError`, a ``ValueError`` whose one-line message starts with
the field's label as the panel shows it (``P list: '1,x' is invalid: ...``), so the panel
can show it as is: no traceback, and the person knows which box to fix.

Pure functions (no widgets): :func:`study_request` turns the panel's values into the
keyword arguments of ``Lab.study`` and checks them all before anything is submitted:

1. lists: P values (integers >= 1), densities (numbers in (0, 1]), bandwidths and
   latencies (anything :func:`~gtopk_lab.network.model.network_model` parses; an empty
   latency box means each link's own), a seed count >= 1, at least one method
2. the model fits the dataset (as ``gtopk-lab run`` checks), and every point of the grid
   is a valid ``RunConfig`` (:func:`~gtopk_lab.orchestration.study_grid.expand_grid`)

Client side only.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gtopk_lab.counts import split_list
from gtopk_lab.network.model import network_model

__all__ = ["FieldError", "StudyRequest", "format_list", "parse_int_list", "parse_float_list",
           "parse_text_list", "study_request", "first_line", "check_defaults"]


class FieldError(ValueError):
    """A value of one panel field that cannot be used; ``str()`` is one line naming it."""

    def __init__(self, label: str, message: str) -> None:
        self.label = label
        super().__init__(f"{label}: {first_line(message)}")


def first_line(message: object) -> str:
    """The first non-empty line of an error message (tracebacks and hints cut)."""
    for line in str(message).splitlines():
        if line.strip():
            return line.strip()
    return str(message).strip() or "invalid value"


def format_list(value: Any) -> str:
    """A scalar or a list as the panel shows it in a text box: ``[1, 2, 4]`` -> ``1,2,4``."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ",".join(format_list(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _items(text: str) -> list[str]:
    # The CLI's own splitter: commas, spaces, semicolons ("1, 2, 4", "1 2 4"), a unit kept
    # with its number ("2.5 Gbit/s"), so a list typed in the panel means what it means there.
    return split_list(text)


def parse_int_list(text: str, label: str, minimum: int = 1) -> list[int]:
    """``"1,2,4,8"`` -> ``[1, 2, 4, 8]``; each an integer >= ``minimum``, duplicates dropped."""
    items = _items(text)
    if not items:
        raise FieldError(label, f"{text!r} is empty: expected comma-separated integers like 1,2,4,8")
    values: list[int] = []
    for item in items:
        try:
            number = float(item)
        except ValueError:
            raise FieldError(label, f"{item!r} is not an integer: expected e.g. 1,2,4,8") from None
        if not number.is_integer() or number < minimum:
            raise FieldError(label, f"{item!r} is invalid: expected integers >= {minimum}")
        if int(number) not in values:
            values.append(int(number))
    return values


def parse_float_list(text: str, label: str, low: float = 0.0, high: float = 1.0) -> list[float]:
    """``"0.01,0.001"`` -> ``[0.01, 0.001]``; each in ``(low, high]``, duplicates dropped."""
    items = _items(text)
    if not items:
        raise FieldError(label, f"{text!r} is empty: expected comma-separated numbers like 0.01,0.001")
    values: list[float] = []
    for item in items:
        try:
            number = float(item)
        except ValueError:
            raise FieldError(label, f"{item!r} is not a number: expected e.g. 0.01,0.001") from None
        if not (math.isfinite(number) and low < number <= high):
            raise FieldError(label, f"{item!r} is invalid: expected numbers in ({low:g}, {high:g}]")
        if number not in values:
            values.append(number)
    return values


def parse_text_list(text: str, label: str, allow_empty: bool = False) -> list[str]:
    """``"1GbE, 10GbE"`` or ``"1GbE 10GbE"`` -> ``["1GbE", "10GbE"]``; ``"2.5 Gbit/s"`` is one
    value (:func:`~gtopk_lab.counts.split_list`: a unit stays with its number)."""
    items = _items(text)
    if not items and not allow_empty:
        raise FieldError(label, f"{text!r} is empty: expected values separated by commas or spaces")
    return list(dict.fromkeys(items))


@dataclass(frozen=True)
class StudyRequest:
    """What the panel hands to ``Lab.study``: ``lab.study(base=base, **axes)``."""

    axes: dict[str, Any]
    base: dict[str, Any]
    points: int

    def describe(self, points: int | None = None) -> str:
        """One line: the grid's sizes, e.g. ``3 method(s) x P 1,2,4,8 x 2 seeds: 24 point(s)``
        (``points``: the launched study's count, which the cluster's size decides: baselines
        join per source; default the count with every point simulated)."""
        a = self.axes
        parts = [f"{len(a['method'])} method(s)", "P " + format_list(a["workers"])]
        if len(a.get("density", [])) > 1:
            parts.append(f"{len(a['density'])} densities")
        nets = len(a["bandwidth"]) * len(a.get("latency", [None]))
        if nets > 1:
            parts.append(f"{nets} networks")
        if a.get("seeds", 1) > 1:
            parts.append(f"{a['seeds']} seeds")
        return " x ".join(parts) + f": {self.points if points is None else points} point(s)"


def study_request(*, methods: Sequence[str], workers: str, densities: str, bandwidths: str,
                  latencies: str, seeds: int, model: str, dataset: str, epochs: int,
                  max_iterations: int, extra: dict[str, Any] | None = None,
                  real_max_workers: int = 0) -> StudyRequest:
    """Steps 1-2 of the module docstring; raises :class:`FieldError` naming the field."""
    if isinstance(methods, str) or not isinstance(methods, Sequence) \
            or not all(isinstance(m, str) for m in methods):
        raise FieldError("methods", f"{methods!r} is invalid: expected a list of method names")
    if not methods:
        raise FieldError("methods", "nothing selected: select at least one method")
    if extra is not None and not isinstance(extra, dict):
        raise FieldError("extra", f"{extra!r} is invalid: expected a dict of RunConfig fields or None")
    p_values = parse_int_list(workers, "P list")
    density_values = parse_float_list(densities, "densities")
    bandwidth_values = parse_text_list(bandwidths, "bandwidths")
    latency_values = parse_text_list(latencies, "latencies", allow_empty=True)
    for bandwidth in bandwidth_values:
        try:
            network_model(bandwidth, None)
        except (ValueError, TypeError) as exc:
            raise FieldError("bandwidths", str(exc)) from None
    for latency in latency_values:
        try:
            network_model("1GbE", latency)
        except (ValueError, TypeError) as exc:
            raise FieldError("latencies", str(exc)) from None
    seeds = _count(seeds, "seeds", 1, MAX_SEEDS, "a count >= 1")
    epochs = _count(epochs, "epochs", 0, MAX_EPOCHS, ">= 0 (0: the model's recipe)")
    max_iterations = _count(max_iterations, "max iters", 0, MAX_ITERATIONS, ">= 0 (0: all epochs)")
    _check_model(model, dataset)
    base = dict(extra or {})
    base.update(model=model, dataset=dataset)
    if int(epochs) > 0:  # 0: the model's recipe says (RunConfig's default without one)
        base["epochs"] = int(epochs)
    if int(max_iterations) > 0:  # 0 keeps what ``extra`` says (or all epochs)
        base["max_iterations"] = int(max_iterations)
    axes: dict[str, Any] = {"method": list(methods), "workers": p_values, "density": density_values,
                            "bandwidth": bandwidth_values, "seeds": int(seeds)}
    if latency_values:
        axes["latency"] = latency_values
    from gtopk_lab.orchestration.study_grid import expand_grid

    try:  # every point a valid RunConfig before anything is submitted
        points = expand_grid(base, axes, real_max_workers=real_max_workers)
    except (ValueError, TypeError) as exc:
        raise FieldError(_field_of(str(exc)), str(exc)) from None
    return StudyRequest(axes, base, len(points))


#: Bounds of the panel's number boxes (the widgets' own min/max; a script may pass anything).
MAX_SEEDS, MAX_EPOCHS, MAX_ITERATIONS = 1000, 10_000, 10**9


def _count(value: Any, label: str, low: int, high: int, what: str) -> int:
    """``value`` as an integer in [low, high], else :class:`FieldError` naming ``label``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or int(value) != value or not low <= value <= high:
        raise FieldError(label, f"{value!r} is invalid: expected {what}, at most {high}")
    return int(value)


#: Panel label -> the ``ControlPanel(defaults=...)`` key that fills that field.
_DEFAULT_KEYS = {"methods": "methods", "P list": "workers", "densities": "density",
                 "bandwidths": "bandwidth", "latencies": "latency", "seeds": "seeds", "model": "model",
                 "dataset": "dataset", "epochs": "epochs", "max iters": "max_iterations"}


def check_defaults(defaults: dict[str, Any], extra: Any) -> None:
    """The ControlPanel's starting values as its form would check them at *Launch*:
    ``ValueError``/``TypeError`` naming the ``defaults`` key (or ``extra``), at construction."""
    if extra is not None and not isinstance(extra, dict):
        raise TypeError(f"extra={extra!r} has type {type(extra).__name__}: expected a dict of "
                        "RunConfig fields or None")
    methods = defaults["methods"]
    try:
        study_request(methods=[methods] if isinstance(methods, str) else methods,
                      workers=format_list(defaults["workers"]), densities=format_list(defaults["density"]),
                      bandwidths=format_list(defaults["bandwidth"]), latencies=format_list(defaults["latency"]),
                      seeds=defaults["seeds"], model=defaults["model"], dataset=defaults["dataset"],
                      epochs=defaults["epochs"], max_iterations=0 if defaults["max_iterations"] is None else defaults["max_iterations"],
                      extra=extra)
    except FieldError as exc:
        key = _DEFAULT_KEYS.get(exc.label)
        name = f"defaults[{key!r}]={defaults[key]!r}" if key else exc.label
        raise ValueError(f"{name} is invalid: {exc}") from None


#: RunConfig field named at the start of an error -> the panel field that sets it.
_FIELD_LABELS = {"method": "methods", "workers": "P list", "density": "densities",
                 "bandwidth": "bandwidths", "latency": "latencies", "seed": "seeds",
                 "model": "model", "dataset": "dataset", "epochs": "epochs",
                 "max_iterations": "max iters"}


def _field_of(message: str) -> str:
    """The panel field an error message of RunConfig / expand_grid is about."""
    name = message.split("=", 1)[0].strip() if "=" in message.split(" ", 1)[0] else ""
    return _FIELD_LABELS.get(name, "settings" if not name else f"{name} (fixed setting)")


def _check_model(model: str, dataset: str) -> None:
    from gtopk_lab.training.models import get_model_spec

    try:
        spec = get_model_spec(model)
    except (ValueError, TypeError) as exc:
        raise FieldError("model", str(exc)) from None
    if not isinstance(dataset, str) or dataset not in spec.datasets:
        raise FieldError("dataset", f"{dataset!r} does not fit model {model!r}: it fits "
                                    f"{', '.join(spec.datasets)}")


def status_line_html(text: str, error: bool = False, max_width_px: int = 900) -> str:
    """A widget's one-line status: green, or red for an error, cut with an ellipsis at
    ``max_width_px`` so the box never grows into a wall of text; the full text is the tooltip."""
    color = "#b00020" if error else "#2e7d32"
    return (f"<span title='{html.escape(text)}' style='color:{color};white-space:nowrap;"
            f"overflow:hidden;text-overflow:ellipsis;display:inline-block;max-width:{int(max_width_px)}px'>"
            f"{html.escape(text)}</span>")
