"""The sweep-era scaling tables of a results folder: measured and predicted efficiency.

:func:`measured_scaling_table` (one row per run, against dense S-SGD at P = 1 of the same
network) and :func:`predicted_scaling_table` (the alpha-beta(-gamma) model's line for the
measured configurations, each method priced by its own formula with what its summaries
keep: the selection an iteration waits for, ``comm_formula``). One baseline per network,
no seeds or sources: the report's study tables (:mod:`~gtopk_lab.plotting.report_tables`)
supersede them; :mod:`gtopk_lab.plotting.report` re-exports both for their callers.

Cost: O(runs) pandas work, and per (method, density, network) one prediction over P.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from gtopk_lab.analysis.predict import formula_of, predict_scaling, selection_per_iteration_s
from gtopk_lab.analysis.scaling import BASELINE_NONE, BASELINES, add_scaling_efficiency
from gtopk_lab.methods import available_methods, get_method
from gtopk_lab.network.model import NetworkModel, format_bandwidth, format_latency

__all__ = ["completed", "measured_scaling_table", "network_label", "predicted_scaling_table"]


def completed(summaries: pd.DataFrame) -> pd.DataFrame:
    """The completed runs of ``summaries`` (all of them without a ``status`` column)."""
    if "status" not in summaries.columns:
        return summaries
    return summaries[summaries["status"] == "completed"]


def _throughput_column(time_basis: str) -> str:
    if time_basis not in ("virtual", "wall"):
        raise ValueError(f"time_basis={time_basis!r} is invalid: expected 'virtual' or 'wall'")
    return f"samples_per_s_{time_basis}"


def _network_key(row: pd.Series) -> tuple[float, float]:
    bw = row.get("bandwidth_bps")
    bw = math.inf if bw is None or (isinstance(bw, float) and math.isnan(bw)) else float(bw)
    lat = row.get("latency_s")
    lat = 0.0 if lat is None or (isinstance(lat, float) and math.isnan(lat)) else float(lat)
    return bw, lat


def network_label(bandwidth_bps: float, latency_s: float) -> str:
    """"1 Gbit/s, 0.44 ms" style label of a link (or "unthrottled")."""
    if math.isinf(bandwidth_bps):
        return "unthrottled"
    return f"{format_bandwidth(bandwidth_bps)}, {format_latency(latency_s)}"


def measured_scaling_table(summaries: pd.DataFrame, time_basis: str = "virtual",
                           baseline: str = "dense") -> pd.DataFrame:
    """Measured scaling efficiency ``throughput(P) / (P * throughput(dense, 1))``, one row per run.

    Long-format and network-aware, for figures. The baseline follows the project's rule,
    ``gtopk_lab.analysis.scaling.add_scaling_efficiency`` (as ``gtopk-lab sweep`` prints it):
    dense S-SGD at P=1 with the same model, batch and network, else the method's own P=1
    run; the ``baseline`` column says which ("dense P=1" / "own P=1"). A method whose P=1
    iteration is cheaper than dense's can exceed 100%. ``baseline="own"`` is an explicit
    opt-out that prefers the method's own P=1 run (every curve then starts at 100%).
    Runs without a baseline are left out. Columns: ``method, workers, density, bandwidth,
    samples_per_s, baseline_samples_per_s, scaling_efficiency, baseline, run_id``. O(runs).
    """
    col = _throughput_column(time_basis)
    if baseline not in BASELINES:
        raise ValueError(f"baseline={baseline!r} is invalid: expected one of {', '.join(map(repr, BASELINES))}")
    columns = ["method", "workers", "density", "bandwidth", "samples_per_s", "baseline_samples_per_s",
               "scaling_efficiency", "baseline", "run_id"]
    done = completed(summaries)
    done = done[done[col].notna()] if col in done.columns else done.iloc[:0]
    if not len(done):
        return pd.DataFrame(columns=columns)
    ranked = add_scaling_efficiency(done, times=time_basis, baseline=baseline)
    ranked = ranked[ranked["baseline"] != BASELINE_NONE]
    rows = [{
        "method": run["method"], "workers": int(run["workers"]), "density": float(run["density"]),
        "bandwidth": network_label(*_network_key(run)), "samples_per_s": float(run[col]),
        "baseline_samples_per_s": float(run[f"baseline_{col}"]),
        "scaling_efficiency": float(run[f"efficiency_{time_basis}"]), "baseline": run["baseline"],
        "run_id": run.get("run_id"),
    } for _, run in ranked.iterrows()]
    return pd.DataFrame(rows, columns=columns).sort_values(["bandwidth", "method", "workers"]).reset_index(drop=True)


def predicted_scaling_table(summaries: pd.DataFrame, workers: list[int] | None = None) -> pd.DataFrame:
    """The alpha-beta model's scaling efficiency for the measured configurations.

    For each (method, density, network) of the completed runs: compute time per
    iteration from the single-worker runs' breakdown (compute + update), selection time
    from the method's runs, then ``gtopk_lab.analysis.predict.predict_scaling`` over
    ``workers`` (default 1, 2, 4, ... up to max(32, largest P)): each method's own
    ``Method.predicted_time_s`` (its exact-k and pattern, and what else its formula needs from
    the summaries' ``comm_formula``: PowerSGD's parameter layout), as ``gtopk-lab model`` and
    the study's check price it. A method whose formula needs more than its summaries hold
    (PowerSGD's runs from before ``comm_formula``) gets no prediction. Columns as
    :func:`measured_scaling_table` (without the throughputs).
    """
    done = completed(summaries)
    if not len(done) or "time_breakdown_s" not in done.columns:
        return pd.DataFrame(columns=["method", "workers", "density", "bandwidth", "scaling_efficiency"])
    max_p = max(32, int(done["workers"].max()))
    grid = workers or [p for p in (2 ** i for i in range(0, 21)) if p <= max_p]
    rows: list[dict[str, Any]] = []
    keys = ["method", "density", "bandwidth_bps", "latency_s", "numel"]
    done = done.assign(bandwidth_bps=done["bandwidth_bps"].fillna(math.inf), latency_s=done["latency_s"].fillna(0.0))
    for key, group in done.groupby(keys, dropna=False):
        method, density, bw, lat, numel = key
        if pd.isna(numel):
            continue
        singles = done[(done["workers"] == 1) & (done["numel"] == numel)]
        source = singles if len(singles) else group
        compute_s = _mean_part(source, ("compute", "update"))
        if method not in available_methods():  # a plugin's run read without its plugin
            continue
        entry = get_method(method)
        selection_s = _selection_per_iteration_s(group[group["workers"] > 1], entry)
        if not compute_s or compute_s <= 0:
            continue
        algorithm = None
        if entry.comm.algorithms:
            algorithm = str(group["algorithm"].iloc[0]) if "algorithm" in group.columns and \
                pd.notna(group["algorithm"].iloc[0]) else entry.comm.algorithms[0]
        net = NetworkModel(latency_s=float(lat), bandwidth_bps=float(bw))
        try:
            predicted = predict_scaling(int(numel), float(density), compute_s, net, grid,
                                        selection_s=selection_s or 0.0, methods=[(method, method, algorithm)],
                                        formulas={method: formula_of(group.get("comm_formula"))})
        except ValueError:  # a formula that needs what a summary lacks (PowerSGD's layout)
            continue
        for row in predicted:
            rows.append({"method": method, "workers": row["workers"], "density": float(density),
                         "bandwidth": network_label(float(bw), float(lat)),
                         "scaling_efficiency": row["scaling_efficiency"]})
    return pd.DataFrame(rows, columns=["method", "workers", "density", "bandwidth", "scaling_efficiency"])


def _selection_per_iteration_s(summaries: pd.DataFrame, entry: Any) -> float | None:
    """The mean over ``summaries`` of the selection an iteration of ``entry`` waits for
    (:func:`~gtopk_lab.analysis.predict.selection_per_iteration_s`), None without one."""
    values = [selection_per_iteration_s(entry, tb) for tb in summaries.get("time_breakdown_s", ())]
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _mean_part(summaries: pd.DataFrame, parts: tuple[str, ...]) -> float | None:
    values = []
    for _, s in summaries.iterrows():
        tb = s.get("time_breakdown_s")
        if isinstance(tb, dict) and all(p in tb and tb[p] is not None for p in parts):
            values.append(sum(float(tb[p]) for p in parts))
    return sum(values) / len(values) if values else None
