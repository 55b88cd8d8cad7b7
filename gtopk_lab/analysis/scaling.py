"""Scaling efficiency and the method x P table of the paper.

Scaling efficiency (Shi et al. 2019) of method m on P workers, the one rule of the project::

    efficiency(m, P) = throughput(m, P) / (P * throughput(dense, 1))

with throughput in samples per second, measured in *virtual* time (modelled network,
one core per rank; the default, comparable across machines) or *wall* time (this
machine), both runs on the same clock. The baseline ``throughput(dense, 1)`` is one
run: dense S-SGD on a single worker (no communication, no compression) of the same
model, dataset, per-worker batch and network (:data:`BASELINE_GROUP`). Only where that
group holds no dense P=1 run does the method's own P=1 run stand in, and every table
says so in a ``baseline`` column ("dense P=1" / "own P=1"). :func:`add_scaling_efficiency`
is that rule; ``gtopk-lab sweep`` / ``demo``, the HTML report and :func:`scaling_table`
all call it. With the same per-worker batch the efficiency equals
``t_iter(dense, 1) / t_iter(m, P)``, so a sparse method whose P=1 iteration is cheaper
than dense's can exceed 100%, and one that pays selection at P=1 starts below it.

A "run" is anything describing one run: a summary dict (``summary.json``), a
:class:`~gtopk_lab.training.loop.RankResult`, or its metric rows (a list of dicts or a
pandas DataFrame). From a summary the throughput is ``samples_per_s_<time>``; from rows
it is ``workers * batch / t_iter`` with ``t_iter`` the mean cumulative time per ``iter``
row of rank 0 (batch_size taken from ``batch_size``, default 1, which cancels in the ratio
when both runs use the same per-worker batch).

Measured compute on a shared machine is noisy (3-5x between iterations), and the
simulator's virtual clock takes the slowest of P ranks, so efficiencies from measured compute
drift with P. :func:`~gtopk_lab.training.compute_time.measure_iteration_times` measures one rank's compute and selection time
once (medians of a few passes at the P=1 batch); passing them to
``simulate(config, compute_time_s=..., selection_time_s=...)`` charges every virtual rank the
same, so efficiencies differ only by communication and selection.

Example::

    eff = scaling_efficiency(simulate(cfg.replace(workers=1)), simulate(cfg.replace(workers=32)))
    table = scaling_table(results)        # rows: method (or model, method); columns: P
    runs = add_scaling_efficiency(summaries)  # + efficiency_virtual/_wall, baseline columns
    efficiency_intervals(runs)            # per point: mean, efficiency_ci_low/_high over seeds
    times = measure_iteration_times(cfg)  # {"compute_time_s": ..., "selection_time_s": ...}
    simulate(cfg.replace(workers=32), compute_time_s=times["compute_time_s"],
             selection_time_s=times["selection_time_s"])
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

from gtopk_lab.analysis.intervals import CONFIDENCE, add_intervals
from gtopk_lab.methods.dense import BASELINE_METHOD

TIMES: tuple[str, ...] = ("virtual", "wall")

#: Summary columns a run and its single-worker baseline must share (those present in the
#: frame; a missing value matches a missing value): same model, data, per-worker batch
#: and network. Density, gTop-k pattern and selector are the method's own, not the group's.
BASELINE_GROUP: tuple[str, ...] = ("model", "dataset", "batch_size", "numel", "bandwidth_bps", "latency_s")
#: Summary columns that make "the same method" when its own P=1 run stands in.
METHOD_KEYS: tuple[str, ...] = ("method", "density", "algorithm", "selector")
#: Values of the ``baseline`` column.
BASELINE_DENSE = "dense P=1"
BASELINE_OWN = "own P=1"
BASELINE_NONE = "none"
#: Which single-worker run to prefer: "dense" (the rule) or "own" (explicit opt-in).
BASELINES: tuple[str, ...] = ("dense", "own")


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


def _key_value(value: Any) -> Any:
    """A hashable, comparable form of one summary cell: missing -> None, numbers -> float."""
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
        return None if math.isnan(number) else number
    return str(value)


def add_scaling_efficiency(runs: Any, times: str | Sequence[str] = TIMES, baseline: str = "dense",
                           group: Sequence[str] = BASELINE_GROUP,
                           method_keys: Sequence[str] = METHOD_KEYS) -> Any:
    """The project's scaling-efficiency rule applied to a DataFrame of run summaries.

    For every row (one run)::

        efficiency_<time> = samples_per_s_<time> / (workers * baseline samples_per_s_<time>)

    1. The group of a run: its values of the ``group`` columns present in ``runs``
       (model, dataset, per-worker batch, model size, bandwidth, latency).
    2. Candidate baselines: completed runs (``status == "completed"`` when there is a
       ``status`` column) with ``workers == 1`` and a throughput > 0 on some clock of ``times``.
    3. The baseline is the group's first dense candidate ("dense P=1", the paper's
       definition); only when the group has none, the first candidate of the same method
       (equal ``method_keys``: method, density, gTop-k pattern, selector) ("own P=1");
       else none ("none", efficiency NaN). ``baseline="own"`` reverses the preference
       (own P=1 first, then dense P=1), for explicit comparisons only.
    4. Both throughputs come from the same clock, so ``efficiency_virtual`` and
       ``efficiency_wall`` share the baseline run but never mix clocks.

    Returns a copy of ``runs`` (same index) with the columns ``baseline``,
    ``baseline_run_id`` (None without a ``run_id`` column) and, per clock,
    ``baseline_samples_per_s_<time>`` and ``efficiency_<time>`` (fractions, NaN where a
    throughput is missing). O(runs). Pandas only: safe on workers.

    Example::

        runs = add_scaling_efficiency(load_summaries("results/demo"))
        runs[["method", "workers", "efficiency_virtual", "baseline"]]
    """
    import pandas as pd

    clocks = (times,) if isinstance(times, str) else tuple(times)
    if not clocks:
        raise ValueError("times=() is invalid: expected one or more of " + ", ".join(TIMES))
    for clock in clocks:
        _check_time(clock)
    if baseline not in BASELINES:
        raise ValueError(f"baseline={baseline!r} is invalid: expected one of {', '.join(map(repr, BASELINES))}")
    if not isinstance(runs, pd.DataFrame):
        raise TypeError(f"runs has type {type(runs).__name__}: expected a pandas DataFrame of run summaries")
    missing = [c for c in ("method", "workers") if c not in runs.columns]
    if missing:
        raise ValueError(f"runs has no column {missing[0]!r}: expected run summaries "
                         "(method, workers, samples_per_s_<time>, ...)")
    frame = runs.copy()
    workers = pd.to_numeric(frame["workers"], errors="coerce")
    speed = {c: (pd.to_numeric(frame[f"samples_per_s_{c}"], errors="coerce")
                 if f"samples_per_s_{c}" in frame.columns else pd.Series(math.nan, index=frame.index))
             for c in clocks}
    group_cols = [c for c in group if c in frame.columns]
    method_cols = [c for c in method_keys if c in frame.columns]
    completed = (frame["status"] == "completed") if "status" in frame.columns else pd.Series(True, index=frame.index)
    usable = pd.concat([speed[c] > 0 for c in clocks], axis=1).any(axis=1)
    candidates = completed & (workers == 1) & usable

    def key(label: Any, cols: list[str]) -> tuple[Any, ...]:
        return tuple(_key_value(frame.at[label, c]) for c in cols)

    dense_base: dict[tuple[Any, ...], Any] = {}
    own_base: dict[tuple[Any, ...], Any] = {}
    for label in frame.index[candidates.to_numpy()]:
        g = key(label, group_cols)
        if str(frame.at[label, "method"]) == BASELINE_METHOD:
            dense_base.setdefault(g, label)
        own_base.setdefault(g + key(label, method_cols), label)

    kinds, bases = [], []
    for label in frame.index:
        g = key(label, group_cols)
        dense, own = dense_base.get(g), own_base.get(g + key(label, method_cols))
        # baseline is one of BASELINES (checked above): "own" is the explicit opt-out
        base = (own if own is not None else dense) if baseline == "own" else \
            (dense if dense is not None else own)
        bases.append(base)
        if base is None:
            kinds.append(BASELINE_NONE)
        else:
            kinds.append(BASELINE_DENSE if str(frame.at[base, "method"]) == BASELINE_METHOD else BASELINE_OWN)
    frame["baseline"] = kinds
    has_id = "run_id" in frame.columns
    frame["baseline_run_id"] = [frame.at[b, "run_id"] if (b is not None and has_id) else None for b in bases]
    for clock in clocks:
        base_speed = pd.Series([speed[clock].at[b] if b is not None else math.nan for b in bases],
                               index=frame.index, dtype=float)
        frame[f"baseline_samples_per_s_{clock}"] = base_speed
        frame[f"efficiency_{clock}"] = speed[clock] / (workers * base_speed)
    return frame


def baseline_note(baselines: Iterable[str]) -> str:
    """The one-line note printed under a scaling table: which P=1 run each efficiency divides by."""
    used = set(baselines)
    text = ("baseline: efficiency = samples/s(P) / (P * samples/s of dense S-SGD at P=1 with the same "
            "model, batch and network), the paper's definition")
    if BASELINE_OWN in used:
        text += "; 'own P=1' rows have no dense P=1 run in their group and divide by the method's own P=1 run"
    if BASELINE_NONE in used:
        text += "; 'none': no P=1 run in the group, no efficiency"
    return text + "."


def scaling_table(runs: Iterable[Any], time: str = "virtual", baseline: str = "dense",
                  percent: bool = True) -> Any:
    """Method x P table of scaling efficiencies (the paper's Table), as a pandas DataFrame.

    ``runs``: summaries / RankResults / metric rows, including a workers == 1 baseline per
    group; efficiencies follow :func:`add_scaling_efficiency` (dense P=1 of the same model,
    batch and network, else the method's own P=1 run). The index is ``method`` (or
    ``(model, method)`` when runs span several models); the columns are the worker counts
    > 1. Values in percent unless ``percent=False``. ``table.attrs["baseline"]`` maps each
    index entry to the baseline it used ("dense P=1" or "own P=1"). Raises ``ValueError``
    when a method has no workers == 1 baseline at all.
    """
    import pandas as pd

    _check_time(time)
    records = []
    for run in runs:
        summary, _ = _as_summary_or_rows(run)
        summary = summary or {}
        record = {c: summary.get(c) for c in BASELINE_GROUP + METHOD_KEYS}
        record.update({"model": summary.get("model", ""), "method": summary.get("method", ""),
                       "workers": workers_of(run), f"samples_per_s_{time}": throughput(run, time)})
        records.append(record)
    if not records:
        raise ValueError("runs is empty: expected summaries of runs at P=1 and P>1")
    frame = add_scaling_efficiency(pd.DataFrame(records), times=time, baseline=baseline)
    frame = frame[frame.workers > 1]
    lost = frame[frame.baseline == BASELINE_NONE]
    if len(lost):
        row = lost.iloc[0]
        raise ValueError(f"no workers=1 baseline for model={row.model!r}, method={row.method!r}")
    frame = frame.assign(efficiency=frame[f"efficiency_{time}"] * (100.0 if percent else 1.0))
    table = frame.pivot_table(index=["model", "method"], columns="workers", values="efficiency", sort=False)
    labels = frame.groupby(["model", "method"], sort=False)["baseline"].agg(lambda b: " / ".join(sorted(set(b))))
    if table.index.get_level_values("model").nunique() == 1:
        table = table.droplevel("model")
        labels = labels.droplevel("model")
    table.columns.name = "workers"
    table.attrs["baseline"] = labels.to_dict()
    return table


#: What makes one point of :func:`efficiency_intervals` (seeds are averaged over).
INTERVAL_KEYS: tuple[str, ...] = ("method", "workers", "density", "bandwidth_bps", "latency_s")


def efficiency_intervals(runs: Any, time: str = "virtual", by: Sequence[str] = INTERVAL_KEYS,
                         confidence: float = CONFIDENCE) -> Any:
    """Mean efficiency per point over its seeds with a Student-t confidence interval.

    1. ``runs`` without ``efficiency_<time>`` get it from :func:`add_scaling_efficiency`,
       the baseline group extended by ``seed`` when there is one (each seed divides by
       the dense P = 1 run of its own seed)
    2. per group of the ``by`` columns present: ``efficiency_mean``, ``efficiency_std``,
       ``efficiency_ci_low``, ``efficiency_ci_high`` (NaN with one seed) and ``n``
       (:func:`~gtopk_lab.analysis.intervals.add_intervals`)

    O(runs)."""
    import pandas as pd

    _check_time(time)
    if not isinstance(runs, pd.DataFrame):
        raise TypeError(f"runs has type {type(runs).__name__}: expected a pandas DataFrame of run summaries")
    col = f"efficiency_{time}"
    frame = runs
    if col not in frame.columns:
        group = BASELINE_GROUP + (("seed",) if "seed" in frame.columns else ())
        frame = add_scaling_efficiency(frame, times=time, group=group)
    keys = [c for c in by if c in frame.columns]
    if not keys:
        raise ValueError(f"runs has none of the columns {list(by)}: expected run summaries")
    return add_intervals(frame, keys, col, prefix="efficiency", confidence=confidence)
