"""Legend names that carry what differs between the shown series, and nothing else.

Two studies side by side (rho = 0.001 on 1GbE, then rho = 0.01 on 10GbE) both have a
"gtopk" line; a name that says only the method cannot tell them apart, and one that says
every field is too long to read. :func:`legend_names` names each series by its method plus
the fields that vary between the series shown (``gtopk ρ=0.001 1GbE``):

1. each series is a record (a mapping) with ``method`` and any of ``density``, the link
   (``bandwidth_bps`` + ``latency_s`` as the study tables give them, or ``bandwidth`` +
   ``latency`` strings as a config gives them), ``algorithm``, ``source`` (real or
   simulated), ``seeds`` (how many seeds its mean is over) and ``workers``;
2. :func:`series_values` turns a record into one comparable value per field in
   :data:`LEGEND_FIELDS` (None where the field is absent, or means nothing: a method that
   selects nothing has no density or gTop-k pattern, one with no pattern to choose, such as
   Top-k or Ok-Topk, no pattern);
3. :func:`varied_legend_fields`: the fields with two or more distinct values among the
   records that have one;
4. :func:`legend_name`: the method, then the varied fields' values in
   :data:`LEGEND_FIELDS` order: ``ρ=0.01``, the link (a preset's name such as ``1GbE``
   when its bandwidth and latency are that preset's, else ``889 Mbit/s 5 ms``), the
   pattern, ``real``/``simulated``, ``2 seeds``, ``P=4``.

Cost: O(records x fields). Pure: the registry and the network model, no plotly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gtopk_lab.methods import is_dense, patterns_of
from gtopk_lab.network.model import PRESETS, format_bandwidth, format_latency, network_model

__all__ = ["LEGEND_FIELDS", "link_name", "series_values", "varied_legend_fields", "legend_name",
           "legend_names"]

#: The fields a legend name may carry after the method, in the order it shows them.
LEGEND_FIELDS: tuple[str, ...] = ("density", "link", "algorithm", "source", "seeds", "workers")
#: Fields that mean nothing to a method that selects nothing (as study_grid collapses them).
_SELECTION_ONLY = ("density", "algorithm")


def _number(value: Any) -> float | None:
    """``value`` as a finite-or-infinite float; None for None, NaN or a non-number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def link_name(bandwidth_bps: Any, latency_s: Any) -> str:
    """A link's short name: the preset whose constants these are (``1GbE``), ``unthrottled``
    for an infinite (or missing) rate, else the rate and latency (``889 Mbit/s 5 ms``)."""
    rate, latency = _number(bandwidth_bps), _number(latency_s) or 0.0
    if rate is None or math.isinf(rate):
        return "unthrottled"
    for name, (preset_latency, preset_rate, _note) in PRESETS.items():
        if math.isclose(rate, preset_rate, rel_tol=1e-9) and math.isclose(latency, preset_latency,
                                                                           rel_tol=1e-9, abs_tol=1e-15):
            return name
    return f"{format_bandwidth(rate)} {format_latency(latency)}"


def _link(record: Mapping[str, Any]) -> str | None:
    if "bandwidth_bps" in record:
        return link_name(record.get("bandwidth_bps"), record.get("latency_s"))
    bandwidth = record.get("bandwidth")
    if not isinstance(bandwidth, str) or not bandwidth:
        return None
    latency = record.get("latency")
    try:
        model = network_model(bandwidth, latency if isinstance(latency, str) and latency else None)
    except (TypeError, ValueError):  # a link this machine cannot read: as typed
        return bandwidth + (f" {latency}" if isinstance(latency, str) and latency else "")
    return link_name(model.bandwidth_bps, model.latency_s)


def series_values(record: Mapping[str, Any]) -> dict[str, Any]:
    """Step 2 of the module docstring: ``{field: comparable value or None}``."""
    method = str(record.get("method"))
    values: dict[str, Any] = {
        "density": _number(record.get("density")),
        "link": _link(record),
        "algorithm": record.get("algorithm") if isinstance(record.get("algorithm"), str) else None,
        "source": record.get("source") if isinstance(record.get("source"), str) else None,
        "seeds": None if _number(record.get("seeds")) is None else int(_number(record.get("seeds")) or 0),
        "workers": None if _number(record.get("workers")) is None else int(_number(record.get("workers")) or 0),
    }
    if values["density"] is not None and values["density"] < 0:  # -1: the tables' "no density"
        values["density"] = None
    if is_dense(method):  # a plugin's method not loaded here: shown as if it selected
        for name in _SELECTION_ONLY:
            values[name] = None
    elif not patterns_of(method):  # no pattern to choose (Top-k, Ok-Topk): the config's means nothing
        values["algorithm"] = None
    return values


def varied_legend_fields(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """Step 3: the fields of :data:`LEGEND_FIELDS` with two or more distinct values."""
    seen: dict[str, set[Any]] = {name: set() for name in LEGEND_FIELDS}
    for record in records:
        for name, value in series_values(record).items():
            if value is not None:
                seen[name].add(value)
    return [name for name in LEGEND_FIELDS if len(seen[name]) > 1]


def _text(name: str, value: Any) -> str:
    if name == "density":
        return f"ρ={value:g}"
    if name == "seeds":
        return f"{value} seed" + ("" if value == 1 else "s")
    if name == "workers":
        return f"P={value}"
    return str(value)


def legend_name(record: Mapping[str, Any], varied: Sequence[str]) -> str:
    """Step 4: ``record``'s method and its values of the ``varied`` fields."""
    values = series_values(record)
    parts = [str(record.get("method"))]
    parts += [_text(name, values[name]) for name in LEGEND_FIELDS
              if name in varied and values.get(name) is not None]
    return " ".join(parts)


def legend_names(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each record's legend name, from the fields that vary between all of ``records``."""
    varied = varied_legend_fields(records)
    return [legend_name(record, varied) for record in records]
