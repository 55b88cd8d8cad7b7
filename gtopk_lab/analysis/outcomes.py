"""What each run achieved and what it cost, and when it first reached a target accuracy.

Inputs: run summaries (``summary.json`` fields plus ``seed`` and ``source``, as
``Study.summaries()`` or :func:`~gtopk_lab.plotting.report_tables.with_points` give them)
and metric rows with ``run_id``.

1. :func:`run_outcomes`: one row per completed run, the Pareto figures' points:
   ``final_test_accuracy``, ``final_loss`` (the last test loss, else the last training
   loss), ``bytes_sent_per_rank`` (``bytes_sent_per_rank_per_iter * iterations``: what one
   rank sent over the whole run) and ``virtual_time_s`` (the run's time on the modelled
   network)
2. :func:`time_to_accuracy`: per run, the first evaluation (rank 0's ``epoch`` rows, by
   iteration) whose ``test_accuracy`` is at least ``target``: its ``virtual_time_s``,
   ``iteration`` and ``epoch``; NaN when the run never got there
3. :func:`time_to_accuracy_table`: per point (method, density, P, link, source) the mean
   virtual time to the target over the seeds that reached it, with its Student-t
   interval (:func:`~gtopk_lab.analysis.intervals.t_interval`), ``reached`` and ``n``
   (seeds); a point whose seeds did not all get there says so in ``reached < n``
4. :func:`auto_target_accuracy`: a target to ask for when none is given (90% of the worst
   final accuracy of dense S-SGD at P > 1)

Cost: O(rows log rows). Pure pandas.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from gtopk_lab.analysis.intervals import CONFIDENCE, t_interval
from gtopk_lab.methods import BASELINE_METHOD, is_dense

__all__ = ["OUTCOME_KEYS", "run_outcomes", "time_to_accuracy", "time_to_accuracy_table", "auto_target_accuracy"]

#: A point of a study: seeds of the same point are averaged over.
OUTCOME_KEYS: tuple[str, ...] = ("method", "density", "workers", "link", "source")


def _link(frame: pd.DataFrame) -> pd.Series:
    if "link" in frame.columns:
        return frame["link"].astype(str)
    if "network" in frame.columns:
        return frame["network"].astype(str)
    return pd.Series("", index=frame.index)


def run_outcomes(summaries: pd.DataFrame) -> pd.DataFrame:
    """Step 1: one row per completed run (``status == "completed"`` where there is one)."""
    if "method" not in summaries.columns or "workers" not in summaries.columns:
        raise ValueError("summaries lack method/workers: expected run summaries (summary.json fields)")
    done = summaries[summaries["status"] == "completed"] if "status" in summaries.columns else summaries
    out = pd.DataFrame(index=done.index)
    out["run_id"] = done["run_id"] if "run_id" in done.columns else done.index.astype(str)
    out["method"] = done["method"].astype(str)
    dense = out["method"].map(is_dense).astype(bool)  # density does not apply to it
    density = pd.to_numeric(done.get("density", pd.Series(math.nan, index=done.index)), errors="coerce")
    out["density"] = density.where(~dense)
    out["workers"] = pd.to_numeric(done["workers"], errors="coerce").astype("Int64")
    out["seed"] = done["seed"] if "seed" in done.columns else 0
    out["source"] = done["source"].astype(str) if "source" in done.columns else "real"
    out["link"] = _link(done)

    def number(col: str) -> pd.Series:
        return pd.to_numeric(done[col], errors="coerce") if col in done.columns else \
            pd.Series(math.nan, index=done.index)

    out["final_test_accuracy"] = number("final_test_accuracy")
    test_loss, train_loss = number("final_test_loss"), number("final_train_loss")
    out["final_loss"] = test_loss.where(test_loss.notna(), train_loss)
    out["bytes_sent_per_rank"] = number("bytes_sent_per_rank_per_iter") * number("iterations")
    out["virtual_time_s"] = number("virtual_time_s")
    return out.reset_index(drop=True)


def time_to_accuracy(metrics: pd.DataFrame, target: float) -> pd.DataFrame:
    """Step 2: per ``run_id``: ``virtual_time_s``, ``iteration``, ``epoch`` of the first
    evaluation at or above ``target`` (a fraction 0..1); NaN where never."""
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target <= 1:
        raise ValueError(f"target={target!r} is invalid: expected a test accuracy in (0, 1], e.g. 0.9")
    columns = ["run_id", "virtual_time_s", "iteration", "epoch"]
    needed = ("run_id", "kind", "iteration", "test_accuracy")
    if metrics.empty or any(c not in metrics.columns for c in needed):
        return pd.DataFrame(columns=columns)
    evals = metrics[(metrics["kind"] == "epoch") & metrics["test_accuracy"].notna()]
    if "rank" in evals.columns:
        evals = evals[evals["rank"] == 0]
    runs = pd.unique(metrics["run_id"])
    reached = (evals[evals["test_accuracy"] >= target].sort_values("iteration", kind="stable")
               .groupby("run_id", sort=False).first())
    rows = []
    for run in runs:
        if run in reached.index:
            hit = reached.loc[run]
            rows.append([run, float(hit.get("virtual_time_s", math.nan)), int(hit["iteration"]),
                         float(hit.get("epoch", math.nan))])
        else:
            rows.append([run, math.nan, math.nan, math.nan])
    return pd.DataFrame(rows, columns=columns)


def time_to_accuracy_table(summaries: pd.DataFrame, metrics: pd.DataFrame, target: float, *,
                           confidence: float = CONFIDENCE) -> pd.DataFrame:
    """Step 3: one row per point: ``time_mean``, ``time_ci_low``, ``time_ci_high``
    (virtual seconds), ``iterations_mean``, ``reached``, ``n``, ``target``."""
    outcomes = run_outcomes(summaries)
    hits = time_to_accuracy(metrics, target).rename(columns={"virtual_time_s": "time_s"})
    joined = outcomes.merge(hits, on="run_id", how="left")
    columns = [*OUTCOME_KEYS, "time_mean", "time_ci_low", "time_ci_high", "iterations_mean", "reached", "n",
               "target"]
    if joined.empty:
        return pd.DataFrame(columns=columns)
    joined = joined.assign(_density=joined["density"].fillna(-1.0))
    rows = []
    keys = ["method", "_density", "workers", "link", "source"]
    for key, group in joined.groupby(keys, sort=True, dropna=False):
        method, density, workers, link, source = key
        ci = t_interval(group["time_s"], confidence)
        iterations = pd.to_numeric(group["iteration"], errors="coerce").dropna()
        rows.append([method, math.nan if density < 0 else density, int(workers), link, source, ci.mean, ci.low,
                     ci.high, float(iterations.mean()) if len(iterations) else math.nan, ci.n, int(len(group)),
                     float(target)])
    table = pd.DataFrame(rows, columns=columns)
    return table.replace({np.inf: math.nan})


def auto_target_accuracy(outcomes: pd.DataFrame, fraction: float = 0.9) -> float:
    """A target most runs can reach: ``fraction`` of the worst final test accuracy of the
    dense runs with P > 1 (any dense run, else any run, where there are none), rounded
    down to a whole percent. NaN without a final accuracy."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction={fraction!r} is invalid: expected a fraction in (0, 1]")
    acc = pd.to_numeric(outcomes.get("final_test_accuracy", pd.Series(dtype=float)), errors="coerce")
    dense = (outcomes["method"].astype(str) == BASELINE_METHOD if "method" in outcomes.columns
             else acc.notna() & False)
    for pick in (dense & (outcomes.get("workers", 1) > 1), dense, acc.notna()):
        chosen = acc[pick].dropna()
        if len(chosen):
            return max(0.01, math.floor(100 * fraction * float(chosen.min())) / 100)
    return math.nan
