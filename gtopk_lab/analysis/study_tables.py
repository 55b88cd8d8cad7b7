"""A study's tables: efficiency per point, mean +- std over seeds, the alpha-beta prediction
and the check that says when a measured figure cannot be trusted.

Pandas only (no plotting): :class:`~gtopk_lab.orchestration.study.Study`, ``gtopk-lab
study``/``sweep`` and the live figures read these. The input is one row per point (a run's
summary, or a running run's provisional estimate) with the point's ``seed``, ``source``
("real" / "simulated") and ``final`` (False while its run is still going).

1. :func:`point_efficiency`: the project's one rule
   (:func:`~gtopk_lab.analysis.scaling.add_scaling_efficiency`) with the baseline group
   extended by ``seed`` and ``source``: a point divides by the dense P = 1 run of its own
   seed, measured the same way (a simulated point by a simulated baseline)
2. :func:`aggregate_seeds`: mean, std, n and the 95% Student-t interval
   (``efficiency_ci_low`` / ``efficiency_ci_high``, :mod:`~gtopk_lab.analysis.intervals`;
   NaN with one seed) over seeds per (method, P, density, pattern, network, source);
   ``provisional`` when any run or baseline behind it is not final
3. :func:`predicted_efficiency`: what the alpha-beta-gamma model expects of each point,
   from the compute its dense P = 1 run measured, the method's P = 1 selection cost, the
   registry's collective formula and the merge CPU measured (see the function)
4. :func:`fidelity_check`: measured minus predicted, flagged beyond ``tolerance`` (default
   10 points) or above 100% beyond noise

Cost: O(points) per table.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from gtopk_lab.analysis.intervals import CONFIDENCE, t_interval
from gtopk_lab.analysis.predict import formula_of
from gtopk_lab.analysis.scaling import BASELINE_GROUP, add_scaling_efficiency
from gtopk_lab.methods import BASELINE_METHOD, get_method
from gtopk_lab.methods.registry import available_methods, is_dense, patterns_of
from gtopk_lab.network.model import NetworkModel

__all__ = ["POINT_COLUMNS", "point_efficiency", "aggregate_seeds", "predicted_efficiency",
           "fidelity_check"]

#: Columns that make one point of a study's figure (seeds are averaged over).
POINT_COLUMNS: tuple[str, ...] = ("method", "workers", "density", "algorithm", "bandwidth_bps",
                                  "latency_s", "source")
#: Above 100% by more than this is noise no more: flagged by :func:`fidelity_check`.
OVER_100_NOISE = 0.03


def _with_defaults(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    for col, default in (("seed", 0), ("source", "real"), ("final", True), ("algorithm", None),
                         ("density", math.nan), ("bandwidth_bps", math.nan), ("latency_s", 0.0)):
        if col not in frame.columns:
            frame[col] = default
    frame["bandwidth_bps"] = pd.to_numeric(frame["bandwidth_bps"], errors="coerce").fillna(math.inf)
    frame["latency_s"] = pd.to_numeric(frame["latency_s"], errors="coerce").fillna(0.0)
    # a dense run has no density or pattern of its own: one point whatever the grid says
    dense = frame["method"].map(is_dense)
    frame.loc[dense, "density"] = math.nan
    # RunConfig's pattern rides along on methods that choose none (Top-k; Ok-Topk fixes its own)
    no_pattern = frame["method"].map(lambda m: not patterns_of(m))
    frame.loc[dense | no_pattern, "algorithm"] = None
    return frame


def point_efficiency(points: pd.DataFrame, time: str = "virtual") -> pd.DataFrame:
    """Step 1: ``points`` plus ``efficiency_<time>``, ``baseline``, ``baseline_final``."""
    frame = _with_defaults(points)
    if frame.empty:
        return frame.assign(**{f"efficiency_{time}": pd.Series(dtype=float), "baseline": None,
                               "baseline_final": pd.Series(dtype=bool)})
    frame = add_scaling_efficiency(frame, times=(time,), group=BASELINE_GROUP + ("seed", "source"))
    finals = dict(zip(frame.get("run_id", pd.Series(dtype=str)), frame["final"]))
    frame["baseline_final"] = [bool(finals.get(b, False)) if b is not None else False
                               for b in frame["baseline_run_id"]]
    return frame


def aggregate_seeds(efficiency: pd.DataFrame, time: str = "virtual", confidence: float = CONFIDENCE
                    ) -> pd.DataFrame:
    """Step 2: one row per point: ``efficiency_mean``, ``efficiency_std``,
    ``efficiency_ci_low``, ``efficiency_ci_high`` (NaN for n = 1), ``n``, ``provisional``."""
    col = f"efficiency_{time}"
    columns = list(POINT_COLUMNS) + ["efficiency_mean", "efficiency_std", "efficiency_ci_low",
                                     "efficiency_ci_high", "n", "provisional"]
    if efficiency.empty or col not in efficiency.columns:
        return pd.DataFrame(columns=columns)
    frame = efficiency.copy()
    frame["_provisional"] = ~(frame["final"].astype(bool) & frame["baseline_final"].astype(bool))
    frame["_density"] = frame["density"].fillna(-1.0)
    frame["_algorithm"] = frame["algorithm"].fillna("-").astype(str)
    keys = ["method", "workers", "_density", "_algorithm", "bandwidth_bps", "latency_s", "source"]
    rows = []
    for key, group in frame.groupby(keys, dropna=False, sort=True):
        values = pd.to_numeric(group[col], errors="coerce").dropna()
        ci = t_interval(values, confidence)
        method, workers, density, algorithm, bw, lat, source = key
        rows.append({"method": method, "workers": int(workers),
                     "density": math.nan if density < 0 else density,
                     "algorithm": None if algorithm == "-" else algorithm, "bandwidth_bps": bw,
                     "latency_s": lat, "source": source,
                     "efficiency_mean": float(values.mean()) if len(values) else math.nan,
                     "efficiency_std": float(values.std(ddof=1)) if len(values) > 1 else math.nan,
                     "efficiency_ci_low": ci.low, "efficiency_ci_high": ci.high,
                     "n": int(len(values)), "provisional": bool(group["_provisional"].any())})
    return pd.DataFrame(rows, columns=columns)


def _iter_s(runs: pd.DataFrame) -> float | None:
    """Mean steady virtual seconds per iteration of ``runs`` (batch * P / samples per s)."""
    speed = pd.to_numeric(runs["samples_per_s_virtual"], errors="coerce")
    t = (pd.to_numeric(runs["batch_size"], errors="coerce") * runs["workers"] / speed).dropna()
    t = t[t > 0]
    return float(t.mean()) if len(t) else None


def _merge_s(runs: pd.DataFrame) -> float:
    """Mean merge CPU per iteration the runs' virtual clocks charged (the gamma term)."""
    if "merge_cpu_s" not in runs.columns:
        return 0.0
    charged = runs.get("virtual_merge_cpu", pd.Series(True, index=runs.index)).fillna(True).astype(bool)
    per_it = (pd.to_numeric(runs["merge_cpu_s"], errors="coerce")
              / pd.to_numeric(runs["iterations"], errors="coerce")).where(charged, 0.0).dropna()
    return float(per_it.mean()) if len(per_it) else 0.0


def _sync_every(runs: pd.DataFrame) -> int:
    """H of the runs' summaries (``sync_every``; 1 for runs stored before it was recorded)."""
    if "sync_every" not in runs.columns:
        return 1
    values = pd.to_numeric(runs["sync_every"], errors="coerce").dropna()
    return max(1, int(values.iloc[0])) if len(values) else 1


def _own_selection_s(runs: pd.DataFrame, t_1: float | None) -> float | None:
    """A method's P = 1 cost beyond dense's (selection, compensation): its P = 1 runs' time
    per iteration minus ``t_1`` minus the merges they charged; None without such a run."""
    at_1 = runs[runs["workers"] == 1]
    own_1 = _iter_s(at_1)
    if t_1 is None or own_1 is None:
        return None
    return max(0.0, own_1 - t_1 - _merge_s(at_1))


def predicted_efficiency(points: pd.DataFrame) -> pd.DataFrame:
    """Step 3: ``predicted`` efficiency per (method, P, density, pattern, network, source)
    of the final ``points``::

        t_1  = the dense P = 1 run's steady virtual time per iteration (its compute)
        sel  = t(method, P=1) - t_1 - its merge CPU per iteration (the method's own P = 1
               run of this source, else of another source on the same network, else 0;
               the merges are added at every P below, so not counted twice)
        t_P  = t_1 + sel + alpha-beta time of the collective at P (registry formula, divided
               by the summary's ``sync_every`` H for local-steps methods)
               + merge CPU per iteration the point's runs measured (the gamma term)

        eff  = t_1 / t_P

    A method's formula gets what it needs beyond the model size from the runs' summaries
    (``comm_formula``: PowerSGD's parameter layout); runs from before that field get no
    prediction for such a method.

    so a measured point that strays from it strays by compute that grew with P
    (contention, stragglers) or by a wrong formula."""
    from gtopk_lab.config import k_for

    columns = list(POINT_COLUMNS) + ["predicted"]
    frame = _with_defaults(points)
    needed = {"samples_per_s_virtual", "batch_size", "numel"}
    if frame.empty or not needed <= set(frame.columns):
        return pd.DataFrame(columns=columns)
    frame = frame[frame["final"].astype(bool)].copy()
    frame["_d"] = frame["density"].fillna(-1.0)
    frame["_a"] = frame["algorithm"].fillna("-").astype(str)
    # the baseline itself: PowerSGD and DiLoCo are dense-kind too, and their P = 1 runs are not it
    is_dense = frame["method"] == BASELINE_METHOD
    rows = []
    selection: dict[tuple[Any, ...], float] = {}  # (network, method, density, pattern) -> P=1 cost
    for (bw, lat, source), group in frame.groupby(["bandwidth_bps", "latency_s", "source"], dropna=False):
        t_1 = _iter_s(group[is_dense.loc[group.index] & (group["workers"] == 1)])
        own = {key: _own_selection_s(runs, t_1)
               for key, runs in group.groupby(["method", "_d", "_a"], dropna=False)}
        for key, own_sel in own.items():
            if own_sel is not None:
                selection.setdefault((bw, lat) + tuple(key), own_sel)
    for (bw, lat, source), group in frame.groupby(["bandwidth_bps", "latency_s", "source"], dropna=False):
        t_1 = _iter_s(group[is_dense.loc[group.index] & (group["workers"] == 1)])
        if t_1 is None:
            continue
        net = NetworkModel(latency_s=float(lat), bandwidth_bps=float(bw))
        for (method, density, algorithm), runs in group.groupby(["method", "_d", "_a"], dropna=False):
            if method not in available_methods() or not runs["numel"].notna().any():
                continue
            numel = int(runs["numel"].dropna().iloc[0])
            entry = get_method(method)
            own_sel = _own_selection_s(runs, t_1)
            # a simulated group rarely has the method's own P = 1 run: the real one's cost
            sel = own_sel if own_sel is not None else selection.get((bw, lat, method, density, algorithm), 0.0)
            pattern = None if algorithm == "-" else str(algorithm)
            rho = 1.0 if density < 0 else float(density)
            for p, at_p in runs.groupby("workers"):
                # the method's own formula: it knows whether its selector promises exactly k
                # (then Top-k's allgather skips the count round)
                try:
                    comm = entry.predicted_time_s(net, numel, k_for(numel, rho), int(p), algorithm=pattern,
                                                  **formula_of(runs.get("comm_formula"))) if p > 1 else 0.0
                except ValueError:  # a formula that needs what a summary lacks (PowerSGD's layout)
                    continue
                # formulas are per synchronisation; a local-steps method syncs every H iterations
                comm /= _sync_every(at_p)
                t_p = t_1 + sel + comm + _merge_s(at_p)
                rows.append({"method": method, "workers": int(p),
                             "density": math.nan if density < 0 else density,
                             "algorithm": pattern, "bandwidth_bps": bw, "latency_s": lat,
                             "source": source, "predicted": t_1 / t_p})
    return pd.DataFrame(rows, columns=columns)


def fidelity_check(table: pd.DataFrame, predicted: pd.DataFrame, tolerance: float = 0.10) -> pd.DataFrame:
    """Step 4: ``table`` (from :func:`aggregate_seeds`) joined with ``predicted``, plus
    ``error`` (measured - predicted) and ``trusted`` (within ``tolerance`` and not above
    100% by more than the noise allowance)."""
    if not (tolerance > 0):
        raise ValueError(f"tolerance={tolerance!r} is invalid: expected a fraction > 0, e.g. 0.10")
    if table.empty:
        return table.assign(predicted=pd.Series(dtype=float), error=pd.Series(dtype=float),
                            trusted=pd.Series(dtype=bool))
    left = table.assign(_d=table["density"].fillna(-1.0), _a=table["algorithm"].fillna("-"))
    right = predicted.assign(_d=predicted["density"].fillna(-1.0), _a=predicted["algorithm"].fillna("-"))
    keys = ["method", "workers", "_d", "_a", "bandwidth_bps", "latency_s", "source"]
    merged = left.merge(right[keys + ["predicted"]], on=keys, how="left").drop(columns=["_d", "_a"])
    merged["error"] = merged["efficiency_mean"] - merged["predicted"]
    merged["trusted"] = (merged["error"].abs() <= tolerance) & (
        merged["efficiency_mean"] <= 1.0 + OVER_100_NOISE)
    return merged
