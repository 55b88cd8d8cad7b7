"""Tables of the HTML report and notebook 02: runs, scaling efficiency (mean over seeds with
its 95% Student-t confidence interval), the model check. Pandas and the standard library only (no plotly).

1. :func:`with_points` adds to stored run summaries what a study's tables need and
   :func:`~gtopk_lab.orchestration.reading.load_runs` does not give: ``seed`` (from each
   run folder's ``config.json``), ``source`` ("real" / "simulated"), ``final`` and a short
   ``link`` label ("1GbE", "10GbE 5ms"), so that
   :func:`~gtopk_lab.analysis.study_tables.point_efficiency` divides every point by the
   dense P = 1 run of its own seed and source
2. :func:`study_tables` turns them into the efficiency per point (mean, std, confidence
   interval ``efficiency_ci_low`` / ``efficiency_ci_high``, n over seeds),
   the alpha-beta(-gamma) prediction and the check (measured vs predicted)
3. :func:`efficiency_pivot`: one row per (link, source, method, density), one column per P,
   cells ``"63.7% [61.0, 66.4] (n=3)"`` (mean [95% confidence interval] over n seeds; one
   seed: the mean alone): the paper's method x P table
4. :func:`runs_table`: the runs in at most a dozen narrow columns (short run ids, human
   numbers, columns that are the same for every run left out and stated once, see
   :func:`constant_fields`) and :func:`run_details`, the rest (full ids, timings, errors)
5. :func:`check_lines`: the check as sentences, as :meth:`Study.check_lines` prints them

Cost: O(runs) plus one small JSON read per run for its seed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from gtopk_lab.analysis.study_tables import (aggregate_seeds, fidelity_check, point_efficiency,
                                             predicted_efficiency)
from gtopk_lab.methods import display_order, is_dense
from gtopk_lab.network.model import bandwidth_label, format_bandwidth, format_latency

__all__ = ["with_points", "with_links", "study_tables", "efficiency_pivot", "runs_table", "run_details",
           "constant_fields", "short_run_ids", "check_lines", "link_label", "format_count"]


def _config_seed(path: Any) -> int | None:
    """The ``seed`` of the run folder's config.json (None when it cannot be read)."""
    if not isinstance(path, str) or not path:
        return None
    try:
        value = json.loads((Path(path) / "config.json").read_text(encoding="utf-8")).get("seed")
    except (OSError, ValueError, AttributeError):
        return None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def link_label(bandwidth: Any, latency: Any, bandwidth_bps: Any = None, latency_s: Any = None) -> str:
    """Short name of a run's modelled link: the config's ``bandwidth`` ("1GbE", a
    calibration's name) plus an explicit ``latency``; else from the numbers; "unthrottled"."""
    if isinstance(bandwidth, str) and bandwidth.strip():
        name = bandwidth_label(bandwidth)
        if name.lower() in ("none", "unthrottled"):
            return "unthrottled"
        return f"{name} {latency}" if isinstance(latency, str) and latency.strip() else name
    bps = pd.to_numeric(bandwidth_bps, errors="coerce")
    if bps is None or pd.isna(bps) or math.isinf(float(bps)):
        return "unthrottled"
    lat = pd.to_numeric(latency_s, errors="coerce")
    return f"{format_bandwidth(float(bps))}, {format_latency(0.0 if pd.isna(lat) else float(lat))}"


def with_points(summaries: pd.DataFrame) -> pd.DataFrame:
    """Step 1: ``summaries`` (from ``load_runs``) plus ``seed``, ``source``, ``final``, ``link``."""
    frame = summaries.copy()
    if frame.empty:
        for col in ("seed", "source", "final", "link"):
            frame[col] = pd.Series(dtype=object)
        return frame
    if "seed" not in frame.columns or frame["seed"].isna().any():
        paths = frame["path"] if "path" in frame.columns else pd.Series(None, index=frame.index)
        seeds = [_config_seed(p) for p in paths]
        old = frame["seed"] if "seed" in frame.columns else pd.Series(None, index=frame.index)
        frame["seed"] = [s if s is not None else (o if pd.notna(o) else 0) for s, o in zip(seeds, old)]
    frame["seed"] = pd.to_numeric(frame["seed"], errors="coerce").fillna(0).astype(int)
    source = frame["source"] if "source" in frame.columns else pd.Series(None, index=frame.index)
    simulated = frame["simulated"] if "simulated" in frame.columns else pd.Series(False, index=frame.index)
    frame["source"] = ["simulated" if s == "simulated" or m is True else "real"
                       for s, m in zip(source, simulated)]
    frame["final"] = True  # a stored run is finished (its status says how)
    col = lambda name: frame[name] if name in frame.columns else pd.Series(None, index=frame.index)  # noqa: E731
    frame["link"] = [link_label(b, lat, bps, lats) for b, lat, bps, lats in
                     zip(col("bandwidth"), col("latency"), col("bandwidth_bps"), col("latency_s"))]
    return frame


def _link_names(points: pd.DataFrame) -> dict[tuple[float, float], str]:
    """(bandwidth_bps, latency_s) as the study tables key them -> the link's short name."""
    names: dict[tuple[float, float], str] = {}
    for bps, lat, name in zip(points.get("bandwidth_bps", []), points.get("latency_s", []),
                              points.get("link", [])):
        key = (math.inf if bps is None or pd.isna(bps) else float(bps), 0.0 if lat is None or pd.isna(lat) else float(lat))
        names.setdefault(key, str(name))
    return names


def with_links(table: pd.DataFrame, points: pd.DataFrame | None = None) -> pd.DataFrame:
    """``table`` (keyed by ``bandwidth_bps``, ``latency_s``: ``Study.efficiency()``,
    ``Study.check()``, ...) with a ``link`` column, kept when it has one: the names
    ``points`` use (``Study.points()``: "1GbE" rather than "888.9 Mbit/s, 436 us"), else
    the numbers."""
    if "link" in table.columns:
        return table.copy()
    names = _link_names(with_points(points)) if points is not None and len(points) else {}
    out = table.copy()
    out["link"] = [names.get((float(b), float(lat))) or link_label(None, None, b, lat)
                   for b, lat in zip(out["bandwidth_bps"], out["latency_s"])]
    return out


def study_tables(points: pd.DataFrame, time: str = "virtual", tolerance: float = 0.10
                 ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Step 2: ``(efficiency, predicted, check)`` of completed ``points`` (:func:`with_points`).

    ``efficiency``: :func:`~gtopk_lab.analysis.study_tables.aggregate_seeds` plus ``link``;
    ``predicted``: the alpha-beta(-gamma) model per point; ``check``: both joined, with
    ``error`` and ``trusted`` (``tolerance``, default 10 points). Empty frames when
    nothing completed.
    """
    done = points[points["status"] == "completed"] if "status" in points.columns else points
    done = done[pd.to_numeric(done.get(f"samples_per_s_{time}"), errors="coerce").notna()] \
        if f"samples_per_s_{time}" in done.columns else done.iloc[:0]
    if done.empty:
        empty = pd.DataFrame(columns=["method", "workers", "density", "algorithm", "bandwidth_bps",
                                      "latency_s", "source", "efficiency_mean", "efficiency_std",
                                      "efficiency_ci_low", "efficiency_ci_high", "n",
                                      "provisional", "link"])
        return empty, pd.DataFrame(), empty.assign(predicted=[], error=[], trusted=[])
    names = _link_names(done)
    table = aggregate_seeds(point_efficiency(done, time), time)
    table["link"] = [names.get((float(b), float(lat)), "?") for b, lat in zip(table["bandwidth_bps"], table["latency_s"])]
    predicted = predicted_efficiency(done) if time == "virtual" else pd.DataFrame()
    check = fidelity_check(table, predicted, tolerance) if len(predicted) else \
        table.assign(predicted=math.nan, error=math.nan, trusted=pd.NA)
    return table, predicted, check


def _cell(mean: float, low: float, high: float, n: int) -> str:
    if pd.isna(mean):
        return ""
    text = f"{100 * mean:.1f}%"
    if n > 1:
        text += f" [{100 * low:.1f}, {100 * high:.1f}]" if pd.notna(low) and pd.notna(high) else ""
        text += f" (n={n})"
    return text


def efficiency_pivot(table: pd.DataFrame, points: pd.DataFrame | None = None) -> pd.DataFrame:
    """Step 3: method x P, cells "mean [95% CI] (n)" in percent; a row per link, source,
    method and density (columns that take one value in the whole table are left out).

    ``table``: :func:`study_tables`' efficiency or ``Study.efficiency()``; links are named
    by its ``link`` column, else by ``points`` (``Study.points()``: "1GbE" rather than
    "888.9 Mbit/s, 436 us"), else by their numbers."""
    if table.empty:
        return pd.DataFrame()
    shown = with_links(table, points)
    shown["density"] = shown["density"].map(lambda d: "-" if pd.isna(d) else f"{d:g}")
    nan = pd.Series(math.nan, index=shown.index)
    shown["cell"] = [_cell(m, lo, hi, int(n)) for m, lo, hi, n in
                     zip(shown["efficiency_mean"], shown.get("efficiency_ci_low", nan),
                         shown.get("efficiency_ci_high", nan), shown["n"])]
    index = [c for c in ("link", "source", "method", "density") if shown[c].nunique() > 1 or c == "method"]
    speed = shown.groupby("link")["bandwidth_bps"].min().to_dict()  # slowest link first
    pivot = shown.pivot_table(index=index, columns="workers", values="cell", aggfunc="first", fill_value="")
    pivot.columns = [f"P={p}" for p in pivot.columns]
    pivot = pivot.reset_index()
    keys = {"method": lambda m: display_order(str(m))[0], "link": lambda link: speed.get(link, math.inf)}
    return pivot.sort_values(index, key=lambda c: c.map(keys[c.name]) if c.name in keys else c,
                             kind="stable").reset_index(drop=True)


def short_run_ids(run_ids: list[str]) -> dict[str, str]:
    """Run id -> the shortest tail of dash-separated parts that is unique among ``run_ids``.

    The Lab's ids end with a random suffix (``20261201-095024-dense-p1-ee662de2-321d``), so
    usually the last part ("321d") is enough; method and P are columns of their own."""
    parts = {rid: str(rid).split("-") for rid in run_ids}
    out: dict[str, str] = {}
    for rid, p in parts.items():
        for n in range(1, len(p) + 1):
            tail = "-".join(p[-n:])
            if sum(1 for q in parts.values() if "-".join(q[-n:]) == tail) == 1:
                out[rid] = tail
                break
        else:
            out[rid] = str(rid)
    return out


def format_count(value: Any, unit: str = "") -> str:
    """12345.6 -> "12.3k", 0.0123 -> "0.0123"; "" for a missing value."""
    v = pd.to_numeric(value, errors="coerce")
    if v is None or pd.isna(v):
        return ""
    v = float(v)
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{prefix}{unit}"
    return f"{v:.3g}{unit}"


#: Fields a run is told apart by, as they head the runs table (field -> column title).
_RUN_FIELDS: dict[str, str] = {"method": "method", "workers": "P", "density": "ρ", "link": "link",
                               "model": "model", "dataset": "dataset", "seed": "seed",
                               "source": "source"}


def constant_fields(points: pd.DataFrame) -> dict[str, str]:
    """Fields of :data:`_RUN_FIELDS` (but method and P) with one value over every run:
    said once above the runs table instead of repeated in a column."""
    out: dict[str, str] = {}
    for field, title in _RUN_FIELDS.items():
        if field in ("method", "workers") or field not in points.columns:
            continue
        column, note = points[field], ""
        if field == "density":  # dense runs have none: one value over the sparse runs counts
            column = pd.Series([_density(m, d) for m, d in zip(points["method"], column)])
            note = " (sparse runs)" if (column == "-").any() else ""
            column = column[column != "-"]
        values = column.dropna().astype(str).unique()
        if len(values) == 1 and len(points) > 1:
            out[title] = values[0] + note
    return out


def _density(method: Any, density: Any) -> str:
    if is_dense(str(method)):
        return "-"
    return "" if density is None or pd.isna(density) else f"{float(density):g}"


def _sorted_runs(points: pd.DataFrame) -> pd.DataFrame:
    """Runs in table order: method (registry order), link (slowest first), source, P,
    density, seed; ``density`` as shown ("-" for a method without one)."""
    frame = points.copy()
    frame["density"] = [_density(m, d) for m, d in zip(frame["method"], frame.get("density", [None] * len(frame)))]
    speed = pd.to_numeric(frame.get("bandwidth_bps"), errors="coerce") if "bandwidth_bps" in frame.columns \
        else pd.Series(0.0, index=frame.index)
    frame = frame.assign(_m=frame["method"].map(lambda m: display_order(str(m))[0]), _bps=speed.fillna(math.inf))
    sort = [c for c in ("_m", "method", "_bps", "link", "source", "workers", "density", "seed") if c in frame.columns]
    return frame.sort_values(sort, kind="stable").drop(columns=["_m", "_bps"])


def runs_table(points: pd.DataFrame) -> pd.DataFrame:
    """Step 4: one row per run, at most 13 narrow columns, in :func:`_sorted_runs` order."""
    if points.empty:
        return pd.DataFrame()
    ids = short_run_ids(list(points["run_id"].astype(str)))
    constant = constant_fields(points)
    frame = _sorted_runs(points)
    table = pd.DataFrame({"run": [ids[str(r)] for r in frame["run_id"]]})
    for field, title in _RUN_FIELDS.items():
        if field in frame.columns and title not in constant:
            table[title] = frame[field].to_numpy()
    table["status"] = frame["status"].to_numpy()
    get = lambda c: frame[c] if c in frame.columns else pd.Series(None, index=frame.index)  # noqa: E731
    table["iterations"] = [format_count(v) for v in get("iterations")]
    table["test acc."] = [("" if pd.isna(v) else f"{100 * float(v):.1f}%")
                          for v in pd.to_numeric(get("final_test_accuracy"), errors="coerce")]
    table["train loss"] = [format_count(v) for v in get("final_train_loss")]
    table["samples/s (virtual)"] = [format_count(v) for v in get("samples_per_s_virtual")]
    table["sent/rank/iter"] = [format_count(v, "B") for v in get("bytes_sent_per_rank_per_iter")]
    return table.reset_index(drop=True)


def run_details(points: pd.DataFrame) -> pd.DataFrame:
    """Step 4's detail view: full ids, sizes, timings, the network and the error line."""
    if points.empty:
        return pd.DataFrame()
    ids = short_run_ids(list(points["run_id"].astype(str)))
    points = _sorted_runs(points)
    get = lambda c: points[c] if c in points.columns else pd.Series(None, index=points.index)  # noqa: E731
    errors = [("" if not isinstance(e, str) or not e.strip() else e.strip().splitlines()[0][:160])
              for e in get("error")]
    return pd.DataFrame({
        "run": [ids[str(r)] for r in points["run_id"]], "run id": points["run_id"].to_numpy(),
        "network": get("network").to_numpy(), "d": [format_count(v) for v in get("numel")],
        "k": [format_count(v) for v in get("k")], "batch": [format_count(v) for v in get("batch_size")],
        "wall s": [format_count(v) for v in get("wall_time_s")],
        "samples/s (wall)": [format_count(v) for v in get("samples_per_s_wall")],
        "virtual s": [format_count(v) for v in get("virtual_time_s")],
        "error": errors,
    })


def check_lines(check: pd.DataFrame, tolerance: float = 0.10) -> list[str]:
    """Step 5: a line per point the model check does not trust, else one line saying all
    are within ``tolerance`` (nothing when no point has a prediction)."""
    if check.empty or "predicted" not in check.columns:
        return []
    has = check[check["predicted"].notna()]
    bad = has[~has["trusted"].fillna(False).astype(bool)]
    lines = []
    for r in bad.itertuples():
        rho = "" if pd.isna(r.density) else f" ρ={r.density:g}"
        link = f" {r.link}" if hasattr(r, "link") else ""
        lines.append(f"{r.method}{rho} P={r.workers} ({r.source}{link}): measured {r.efficiency_mean:.0%}, "
                     f"alpha-beta predicts {r.predicted:.0%}: do not trust this point")
    if not lines and len(has):
        lines.append(f"every point within {tolerance:.0%} of its alpha-beta prediction")
    return lines
