"""Shared by every figure builder: method colours, legend labels, run grouping, frame checks.

The builders in :mod:`.figures_convergence`, :mod:`.figures_scaling` and
:mod:`.figures_topk` take their colours and labels from here, so a method has one colour
and a run one legend label in every figure (notebook, live widget, HTML report).
Pure: pandas and the registry (colour and order are facts of each registered method,
:func:`gtopk_lab.methods.display_color` / :func:`~gtopk_lab.methods.display_order`, so a
plugin's method gets its own without an edit here), no plotly or Dask. Re-exported by
:mod:`gtopk_lab.plotting.figures`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from gtopk_lab.methods import BASELINE_METHOD, display_color, display_order

__all__ = ["FALLBACK_COLORS", "X_AXES", "require_frame", "method_color", "method_rank",
           "fmt_density", "run_label", "run_keys", "density_dash", "split_runs"]

#: Colours of series that are not methods (several k of one selector, ...).
FALLBACK_COLORS = ("#19D3F3", "#FF6692", "#B6E880", "#FF97FF", "#FECB52")

#: Allowed x axes of the convergence figure -> axis title.
X_AXES: dict[str, str] = {
    "iteration": "iteration",
    "epoch": "epoch",
    "wall_time_s": "wall-clock time (s)",
    "virtual_time_s": "virtual time on the modelled network (s)",
}


def require_frame(name: str, frame: Any, columns: Iterable[str]) -> pd.DataFrame:
    """``frame`` itself if it is a DataFrame with ``columns``; else TypeError / ValueError
    naming ``name`` and the schema (so a wrong frame fails with its name, not a KeyError)."""
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"{name} has type {type(frame).__name__}: expected pandas.DataFrame")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{name} is missing column(s) {', '.join(missing)}: expected the schema of "
            f"docs/architecture.md (has {', '.join(map(str, frame.columns)) or 'no columns'})"
        )
    return frame


def method_color(method: str) -> str:
    """The method's colour in every figure: the registered method's ``color`` (a name not
    registered gets one chosen by its text, the same in every figure and process)."""
    return display_color(str(method))


def method_rank(method: Any) -> float:
    """The method's place in legends and tables (its registered ``order``; a name not
    registered sorts after every registered one): a number, for pandas sort keys."""
    return display_order(str(method))[0]


def fmt_density(density: float) -> str:
    """Shortest form of a density for a legend: 0.001 -> "0.001", 1.0 -> "1"."""
    return f"{density:g}"


def run_label(method: str, density: float, workers: int, extra: str = "") -> str:
    """Legend label of a run: ``"gtopk ρ=0.001 P=4"`` (dense runs omit the density)."""
    parts = [str(method)]
    if method != BASELINE_METHOD:
        parts.append(f"ρ={fmt_density(float(density))}")
    parts.append(f"P={int(workers)}")
    if extra:
        parts.append(extra)
    return " ".join(parts)


def run_keys(metrics: pd.DataFrame) -> list[str]:
    """Columns that tell runs apart: ``run_id`` when present, else (method, density, workers)."""
    return ["run_id"] if "run_id" in metrics.columns else ["method", "density", "workers"]


_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def density_dash(densities: Sequence[float]) -> dict[float, str]:
    """Line dash per density, densest first (solid), so the dash encodes rho in every panel."""
    return {d: _DASHES[i % len(_DASHES)] for i, d in enumerate(sorted(set(densities), reverse=True))}


def split_runs(metrics: pd.DataFrame) -> list[tuple[str, pd.DataFrame, dict[str, Any]]]:
    """Split metrics into runs: (label, rows, {method, density, workers}), sorted for legends."""
    keys = run_keys(metrics)
    out: list[tuple[str, pd.DataFrame, dict[str, Any]]] = []
    for _, rows in metrics.groupby(keys, sort=False, dropna=False):
        first = rows.iloc[0]
        meta = {"method": str(first["method"]), "density": float(first["density"]),
                "workers": int(first["workers"])}
        out.append(("", rows, meta))
    # Disambiguate runs that share (method, density, P), e.g. two bandwidths.
    counts: dict[tuple[str, float, int], int] = {}
    for _, _, m in out:
        key = (m["method"], m["density"], m["workers"])
        counts[key] = counts.get(key, 0) + 1
    labelled = []
    for _, rows, m in out:
        extra = ""
        if counts[(m["method"], m["density"], m["workers"])] > 1 and "run_id" in rows.columns:
            extra = f"[{rows['run_id'].iloc[0]}]"
        labelled.append((run_label(m["method"], m["density"], m["workers"], extra), rows, m))
    labelled.sort(key=lambda t: (display_order(t[2]["method"]), -t[2]["density"], t[2]["workers"], t[0]))
    return labelled
