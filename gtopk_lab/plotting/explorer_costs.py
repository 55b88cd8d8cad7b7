"""Where the what-if explorer's compute and selection times come from, said in one line.

The alpha-beta(-gamma) prediction needs, besides the network, one workload's model size d
(``numel``), its compute time per iteration ``t_c``, the selection time ``t_s`` of a sparse
method and the merge cost gamma. :class:`Costs` holds them with ``source``, the line the
explorer's figure shows. They come from, in this order of preference (:func:`find_costs`):

1. a calibration (:mod:`gtopk_lab.orchestration.calibration`): ``<out>/calibration.json``'s
   latest compute entry (``compute_time_s``, ``numel``, the workload), the median of that
   workload's calibrated selections of selecting methods (``selection_workload`` entries; else the
   selection the compute entry timed, which is its first method's and ~0 for dense), its
   merge gamma at the density nearest the one asked for (log distance); read only,
   nothing is measured or moved;
2. a stored run or a study's runs (summaries; of a results folder, its latest 20 runs of
   the latest run's workload): ``t_c`` = median compute + update of the dense P = 1 runs
   (else of every run), ``t_s`` = median selection of the selecting methods' runs (each
   its selecting iterations' mean, ``selection_when_selected``), gamma = the sparse
   methods' median ``merge_gamma_s_per_element``, and each method's ``comm_formula``
   (what its formula needs beyond d: PowerSGD's layout; :attr:`Costs.formulas`);
3. a stated default: ``gtopk-lab model scaling``'s (d = 25M, t_c = 0.15 s, t_s = 0).

Client side; reads files and summaries, submits nothing. Cost: O(entries + runs).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gtopk_lab.analysis.predict import formula_of, selection_per_iteration_s
from gtopk_lab.methods import available_methods, get_method

__all__ = ["Costs", "DEFAULT_COSTS", "costs_from_calibration", "costs_from_summaries", "costs_from_study",
           "costs_from_run", "find_costs", "with_source"]


@dataclass(frozen=True)
class Costs:
    """One workload's costs for the prediction and where they come from.

    ``workload``: the RunConfig fields that made them (model, dataset, batch_size), which a
    study launched from the explorer reuses, so its measured points belong to the curves.
    ``gammas``: density -> merge gamma (s per element) when measured per density.
    ``formulas``: method -> what its formula needs beyond the model size (a stored run's
    ``comm_formula``: PowerSGD's parameter layout), so the explorer can price it too."""

    numel: int
    compute_s: float
    selection_s: float = 0.0
    gamma_s_per_element: float = 0.0
    source: str = "default"
    workload: Mapping[str, Any] = field(default_factory=dict)
    gammas: Mapping[float, float] = field(default_factory=dict)
    formulas: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.numel, bool) or not isinstance(self.numel, int) or self.numel < 1:
            raise ValueError(f"numel={self.numel!r} is invalid: expected an integer >= 1")
        for name, low in (("compute_s", 0.0), ("selection_s", -1.0), ("gamma_s_per_element", -1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not value > low or value < 0:
                raise ValueError(f"{name}={value!r} is invalid: expected a finite time "
                                 f"{'> 0' if low == 0 else '>= 0'} in seconds")

    def gamma_at(self, density: float) -> float:
        """The merge gamma measured at the density nearest ``density`` (log distance), else
        ``gamma_s_per_element``."""
        if not self.gammas:
            return float(self.gamma_s_per_element)
        nearest = min(self.gammas, key=lambda d: abs(math.log(d) - math.log(density)))
        return float(self.gammas[nearest])


#: ``gtopk-lab model scaling``'s defaults: the stated default when nothing was measured.
DEFAULT_COSTS = Costs(numel=25_000_000, compute_s=0.15, selection_s=0.0,
                      source="stated default (gtopk-lab model scaling's: d = 25M, t_c = 0.15 s, t_s = 0)")


def _workload(record: Mapping[str, Any]) -> dict[str, Any]:
    return {k: record[k] for k in ("model", "dataset", "batch_size") if record.get(k) is not None}


def costs_from_calibration(out: str | Path) -> Costs | None:
    """Step 1 of the module docstring; None when ``out`` holds no calibration.
    A damaged file raises :class:`~gtopk_lab.atomic_io.DamagedFile` (one line naming it)."""
    from gtopk_lab.orchestration.calibration import CALIBRATION_FILE, stored_entries

    path = Path(out) / CALIBRATION_FILE
    entries = stored_entries(path)
    computes = [e for e in entries if "workload" in e and "numel" in e]
    if not computes:
        return None
    entry = computes[-1]  # the latest workload calibrated into this folder
    workload = dict(entry["workload"])
    gammas = {float(e["merge_workload"]["density"]): float(e["merge_gamma_s_per_element"])
              for e in entries if "merge_workload" in e
              and {k: v for k, v in e["merge_workload"].items() if k != "density"} == workload
              and isinstance(e["merge_workload"].get("density"), (int, float))
              and e["merge_workload"]["density"] > 0}
    # a selecting method's entries only: PowerSGD's calibrated projections are no top-k
    selections = [float(e["selection_time_s"]) for e in entries if "selection_workload" in e
                  and {k: v for k, v in e["selection_workload"].items() if k in workload} == workload
                  and _selects(e["selection_workload"].get("method"))]
    selection = statistics.median(selections) if selections else entry.get("selection_time_s")
    when = str(entry.get("measured_at") or "")[:16]
    return Costs(numel=int(entry["numel"]), compute_s=float(entry["compute_time_s"]),
                 selection_s=float(selection) if isinstance(selection, (int, float)) else 0.0,
                 gamma_s_per_element=statistics.median(gammas.values()) if gammas else 0.0,
                 source=f"calibration {path} ({workload.get('model')}/{workload.get('dataset')}"
                        + (f", {when}" if when else "") + ")",
                 workload=_workload(workload), gammas=gammas)


def _sparse(method: Any) -> bool:
    return str(method) in available_methods() and get_method(str(method)).sparse


def _selects(method: Any) -> bool:
    return str(method) in available_methods() and get_method(str(method)).selects


def _median(values: Iterable[float]) -> float | None:
    kept = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return statistics.median(kept) if kept else None


def costs_from_summaries(summaries: Iterable[Mapping[str, Any]], source: str) -> Costs | None:
    """Step 2 of the module docstring from completed run summaries; None without one
    that has ``numel`` and a time breakdown."""
    runs = [s for s in summaries if s.get("status", "completed") == "completed"
            and isinstance(s.get("time_breakdown_s"), Mapping) and s.get("numel")]
    if not runs:
        return None

    def compute(s: Mapping[str, Any]) -> float:
        parts = s["time_breakdown_s"]
        return float(parts.get("compute") or 0.0) + float(parts.get("update") or 0.0)

    baseline = [s for s in runs if int(s.get("workers") or 0) == 1 and not _sparse(s.get("method"))]
    t_c = _median(compute(s) for s in (baseline or runs))
    if not t_c or t_c <= 0:
        return None
    sparse = [s for s in runs if _sparse(s.get("method"))]
    selecting = [s for s in runs if _selects(s.get("method"))]
    t_s = _median(selection_per_iteration_s(get_method(str(s["method"])), s["time_breakdown_s"])
                  for s in selecting) or 0.0
    gamma = _median(s.get("merge_gamma_s_per_element") for s in sparse) or 0.0
    first = baseline[0] if baseline else runs[0]
    formulas: dict[str, dict[str, Any]] = {}
    for s in runs:
        formula = formula_of([s.get("comm_formula")])
        if formula and int(s["numel"]) == int(first["numel"]):
            formulas.setdefault(str(s.get("method")), formula)
    return Costs(numel=int(first["numel"]), compute_s=t_c, selection_s=max(0.0, t_s), gamma_s_per_element=gamma,
                 formulas=formulas,
                 source=f"{source} ({first.get('model')}/{first.get('dataset')}, {len(runs)} run(s))",
                 workload=_workload(first))


def costs_from_study(study: Any, label: str = "latest study") -> Costs | None:
    """Step 2 from a :class:`~gtopk_lab.orchestration.study.Study`'s completed points."""
    points = study.points()
    if not len(points):
        return None
    final = points[points["final"].astype(bool)] if "final" in points.columns else points
    return costs_from_summaries(final.to_dict("records"), label)


def find_costs(out: str | Path | None = None) -> Costs:
    """The best costs ``out`` holds (calibration, else its latest completed runs), else
    :data:`DEFAULT_COSTS`. A damaged calibration file is skipped for the stored runs."""
    if out is not None and Path(out).is_dir():
        from gtopk_lab.atomic_io import DamagedFile

        try:
            costs = costs_from_calibration(out)
        except DamagedFile:
            costs = None
        if costs is not None:
            return costs
        from gtopk_lab.orchestration.reading import load_summaries

        try:
            summaries = load_summaries(out)
        except Exception:  # noqa: BLE001 - unreadable results: the stated default says so
            summaries = None
        if summaries is not None and len(summaries):
            done = summaries[summaries["status"] == "completed"]
            order = [c for c in ("submitted_at", "run_id") if c in done.columns]
            records = (done.sort_values(order) if order else done).to_dict("records")
            # the latest run's workload only: a results home holds many models' runs
            same = [r for r in records if records and all(
                str(r.get(k)) == str(records[-1].get(k)) for k in ("model", "dataset", "batch_size", "numel"))]
            costs = costs_from_summaries(same[-20:], f"stored runs in {out}")
            if costs is not None:
                return costs
    return DEFAULT_COSTS


def costs_from_run(run: Mapping[str, Any] | str | Path) -> Costs:
    """Step 2 from one stored run: its summary dict or its run folder."""
    if isinstance(run, Mapping):
        summary = dict(run)
    else:
        from gtopk_lab.orchestration.reading import read_run

        summary = dict(read_run(run, metrics=False).summary or {})
    costs = costs_from_summaries([summary], f"run {summary.get('run_id', run if not isinstance(run, Mapping) else '?')}")
    if costs is None:
        raise ValueError(f"run={summary.get('run_id', run)!r} is invalid: expected a completed run with numel "
                         "and time_breakdown_s")
    return costs


def with_source(costs: Costs, source: str) -> Costs:
    """``costs`` relabelled (e.g. a user's own numbers)."""
    return replace(costs, source=source)
