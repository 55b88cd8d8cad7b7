"""Scaling efficiency and the method x P table of the paper.

Scaling efficiency (Shi et al. 2019) of a run on N workers::

    efficiency(N) = throughput(N) / (N * throughput(1))

with throughput in samples per second, measured in *virtual* time (modelled network,
one core per rank; the default, comparable across machines) or *wall* time (this
machine). With the same per-worker batch this equals ``t_iter(1) / t_iter(N)``.

A "run" is anything describing one run: a summary dict (``summary.json``), a
:class:`~gtopk_lab.training.loop.RankResult`, or its metric rows (a list of dicts or a
pandas DataFrame). From a summary the throughput is ``samples_per_s_<time>``; from rows
it is ``workers * batch / t_iter`` with ``t_iter`` the mean cumulative time per ``iter``
row of rank 0 (batch_size taken from ``batch_size``, default 1, which cancels in the ratio
when both runs use the same per-worker batch).

Example::

    eff = scaling_efficiency(simulate(cfg.replace(workers=1)), simulate(cfg.replace(workers=32)))
    table = scaling_table(results)        # rows: method (or model, method); columns: P
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

TIMES: tuple[str, ...] = ("virtual", "wall")


def _check_time(time: str) -> None:
    if time not in TIMES:
        raise ValueError(f"time={time!r} is invalid: expected one of {', '.join(TIMES)}")


def _as_summary_or_rows(run: Any) -> tuple[dict[str, Any] | None, list[dict[str, Any]] | None]:
    if hasattr(run, "summary") and hasattr(run, "rows"):
        return dict(run.summary), list(run.rows)
    if isinstance(run, dict):
        return run, None
    if hasattr(run, "to_dict") and hasattr(run, "columns"):  # pandas DataFrame of rows
        return None, run.to_dict("records")
    if isinstance(run, Sequence) and not isinstance(run, (str, bytes)):
        return None, list(run)
    raise TypeError(f"run has type {type(run).__name__}: expected a summary dict, a RankResult, "
                    "a list of metric rows or a DataFrame of them")


def workers_of(run: Any) -> int:
    """The run's number of workers P."""
    summary, rows = _as_summary_or_rows(run)
    if summary is not None and summary.get("workers") is not None:
        return int(summary["workers"])
    assert rows is not None
    if not rows:
        raise ValueError("run has no metric rows: cannot tell its workers")
    return int(rows[0]["workers"])


def throughput(run: Any, time: str = "virtual", batch_size: int | None = None) -> float:
    """Samples per second of ``run`` (all workers together), in virtual or wall time."""
    _check_time(time)
    summary, rows = _as_summary_or_rows(run)
    key = f"samples_per_s_{time}"
    if summary is not None and summary.get(key) is not None and not math.isnan(float(summary[key])):
        return float(summary[key])
    if rows is None:
        raise ValueError(f"summary has no usable {key}: expected a number (or pass the run's rows)")
    it_rows = [r for r in rows if r.get("kind") == "iter" and int(r.get("rank", 0)) == 0]
    if not it_rows:
        raise ValueError("run has no iter rows of rank 0: cannot compute its throughput")
    t_iter = float(it_rows[-1][f"{time}_time_s"]) / len(it_rows)
    if not t_iter > 0:
        raise ValueError(f"run's {time}_time_s is {t_iter * len(it_rows)!r}: expected a time > 0")
    batch = batch_size or (summary or {}).get("batch_size") or 1
    return int(it_rows[0]["workers"]) * batch / t_iter


def scaling_efficiency(run_1: Any, run_n: Any, time: str = "virtual") -> float:
    """``throughput(N) / (N * throughput(1))``; ``run_1`` must have workers == 1."""
    _check_time(time)
    p1, pn = workers_of(run_1), workers_of(run_n)
    if p1 != 1:
        raise ValueError(f"run_1 has workers={p1}: expected the single-worker baseline (workers=1)")
    return throughput(run_n, time) / (pn * throughput(run_1, time))


def scaling_table(runs: Iterable[Any], time: str = "virtual", baseline_method: str = "dense",
                  percent: bool = True) -> Any:
    """Method x P table of scaling efficiencies (the paper's Table), as a pandas DataFrame.

    ``runs``: summaries / RankResults, including at least one workers == 1 run per model
    (the baseline: method ``baseline_method`` if present, else the method's own P=1 run).
    The index is ``method`` (or ``(model, method)`` when runs span several models); the
    columns are the worker counts > 1. Values in percent unless ``percent=False``.
    """
    import pandas as pd

    _check_time(time)
    records = []
    for run in runs:
        summary, _ = _as_summary_or_rows(run)
        summary = summary or {}
        records.append({"model": summary.get("model", ""), "method": summary.get("method", ""),
                        "workers": workers_of(run), "throughput": throughput(run, time)})
    if not records:
        raise ValueError("runs is empty: expected summaries of runs at P=1 and P>1")
    frame = pd.DataFrame(records)
    out = []
    for (model, method), group in frame.groupby(["model", "method"], sort=False):
        base = frame[(frame.model == model) & (frame.workers == 1) & (frame.method == baseline_method)]
        if base.empty:
            base = group[group.workers == 1]
        if base.empty:
            raise ValueError(f"no workers=1 baseline for model={model!r}, method={method!r}")
        t1 = float(base.throughput.iloc[0])
        for _, row in group[group.workers > 1].iterrows():
            eff = row.throughput / (row.workers * t1)
            out.append({"model": model, "method": method, "workers": int(row.workers),
                        "efficiency": 100.0 * eff if percent else eff})
    table = pd.DataFrame(out).pivot_table(index=["model", "method"], columns="workers",
                                          values="efficiency", sort=False)
    if table.index.get_level_values("model").nunique() == 1:
        table = table.droplevel("model")
    table.columns.name = "workers"
    return table
