"""Price one recorded run on other networks, and the method-comparison table built on it.

A run's virtual time is its compute (CPU time, independent of the network) plus, per
collective, the alpha-beta time of the rounds it took (docs/architecture.md, "CommStats").
Every iteration row records this rank's ``comm_rounds`` and ``comm_wire_bytes`` (sum over
its rounds of ``max(sent, recv)``), so the same steps can be priced on any
:class:`~gtopk_lab.network.model.NetworkModel` without running again:

1. per iteration, the new modelled time is ``max_i (alpha * rounds_i + beta * wire_i)`` over
   the ranks whose rows are present (``NetworkModel.steps_time_s`` summed in closed form);
2. the correction of that iteration is the new time minus the recorded ``comm_model_s``
   (the recorded run's own max over ranks);
3. every row's ``virtual_time_s`` moves by the cumulative correction of the iterations it
   follows (an epoch row with ``iteration = i`` follows iterations ``< i``); iteration rows
   get the new ``comm_model_s``;
4. a summary's steady ``samples_per_s_virtual`` is measured again on the repriced rows by
   the summary's own estimator (median block time after its warm-up, blocks of H
   iterations for local-steps methods), its network fields become the new network's, so
   the one efficiency rule (:mod:`~gtopk_lab.analysis.scaling`) applies.

Exact (to rounding) when every rank's rows are there, or when the collective is symmetric
(every rank the same rounds and bytes: ring, butterfly, allgather); with rank 0's rows only
(the simulator above 32 ranks) each row's ``comm_peak_rounds`` / ``comm_peak_wire_bytes``
(the largest collective of any rank) is priced too, exact whenever the rank with the most
rounds also has the most wire bytes (a tree's or a binomial broadcast's root, as in CLT-k,
whose leader moves; without them a rank-0-only CLT-k run at P = 64 moved by 1.3% even on
its own network). Merge CPU charged inside
a collective (alpha-beta-gamma) stays as recorded. Cost: O(rows) per network.

:func:`method_comparison` is the table of issue 17's comparison: per network, method, P and
source, time to a target loss on the (repriced) virtual clock, bytes per rank per iteration,
final validation loss and scaling efficiency; :func:`comparison_pivot` one of its columns as
a methods x (network, P, source) table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from gtopk_lab.analysis.intervals import t_interval
from gtopk_lab.analysis.study_tables import point_efficiency
from gtopk_lab.methods import BASELINE_METHOD, is_dense
from gtopk_lab.network.model import NetworkModel, network_model
from gtopk_lab.training.rows import steady_seconds_per_iteration

__all__ = ["reprice_metrics", "reprice_summaries", "time_to_target_s", "auto_target_loss",
           "method_comparison", "comparison_pivot"]

_STEP_COLUMNS = ("comm_rounds", "comm_wire_bytes", "comm_model_s")


def _network(network: NetworkModel | str) -> NetworkModel:
    if isinstance(network, NetworkModel):
        return network
    if isinstance(network, str):
        return network_model(network)
    raise TypeError(f"network has type {type(network).__name__}: expected NetworkModel or a string "
                    "such as '10GbE'")


def _corrections(metrics: pd.DataFrame, net: NetworkModel) -> pd.DataFrame:
    """Steps 1-2: per (run_id, iteration): ``model_s`` (new) and ``correction_s``."""
    it = metrics[metrics["kind"] == "iter"]
    missing = [c for c in _STEP_COLUMNS if c not in it.columns]
    if missing or (len(it) and it["comm_rounds"].isna().any()):
        raise ValueError(f"metrics lack {', '.join(missing) or 'comm_rounds values'}: expected iteration "
                         "rows that record comm_rounds and comm_wire_bytes (runs recorded before they "
                         "existed cannot be repriced; run them again)")
    alpha = 0.0 if net.unthrottled else net.latency_s
    beta = 0.0 if net.unthrottled else net.beta_s_per_byte
    new = alpha * it["comm_rounds"].astype(float) + beta * it["comm_wire_bytes"].astype(float)
    if "comm_peak_rounds" in it.columns:  # rank 0's rows only: the slowest rank may be absent
        peak = (alpha * it["comm_peak_rounds"].astype(float).fillna(0.0)
                + beta * it["comm_peak_wire_bytes"].astype(float).fillna(0.0))
        new = np.maximum(new, peak)
    priced = it.assign(_new=new)
    per = priced.groupby(["run_id", "iteration"], sort=True, dropna=False).agg(model_s=("_new", "max"),
                                                                 old_s=("comm_model_s", "max"))
    per["correction_s"] = per["model_s"] - per["old_s"]
    return per.reset_index()


def reprice_metrics(metrics: pd.DataFrame, network: NetworkModel | str) -> pd.DataFrame:
    """Steps 1-3: ``metrics`` (rows with ``run_id``) with ``virtual_time_s`` and iteration rows'
    ``comm_model_s`` as they would read on ``network``. O(rows log rows)."""
    net = _network(network)
    if metrics.empty:
        return metrics.copy()
    per = _corrections(metrics, net)
    out = metrics.reset_index(drop=True)
    shift = np.zeros(len(out))
    new_model = out["comm_model_s"].to_numpy(dtype=float, copy=True)
    row_iteration = out["iteration"].to_numpy()
    row_is_iter = (out["kind"] == "iter").to_numpy()
    positions = out.groupby("run_id", sort=False, dropna=False).indices
    for run_id, group in per.groupby("run_id", sort=False, dropna=False):
        iters = group["iteration"].to_numpy()
        cumulative = np.cumsum(group["correction_s"].to_numpy())
        rows = positions[run_id]
        at = row_iteration[rows]
        is_iter = row_is_iter[rows]
        # an iteration row includes its own collective; an epoch row only the ones before it
        chosen = np.where(is_iter, np.searchsorted(iters, at, side="right"),
                          np.searchsorted(iters, at, side="left")) - 1
        valid = chosen >= 0
        shift[rows[valid]] = cumulative[chosen[valid]]
        mine = rows[is_iter]
        new_model[mine] = group["model_s"].to_numpy()[np.searchsorted(iters, row_iteration[mine])]
    out["virtual_time_s"] = out["virtual_time_s"].to_numpy(dtype=float) + shift
    out["comm_model_s"] = new_model
    return out


def _sync_block(own: pd.DataFrame) -> int:
    """Iterations per synchronisation, read off the rows: the spacing of the iterations
    that communicated (1 when every one did, or none did)."""
    synced = np.sort(own.loc[own["comm_rounds"] > 0, "iteration"].to_numpy())
    gaps = np.diff(synced)
    return int(gaps.min()) if len(gaps) and gaps.min() > 0 else 1


def reprice_summaries(summaries: pd.DataFrame, metrics: pd.DataFrame, network: NetworkModel | str,
                      *, repriced: pd.DataFrame | None = None) -> pd.DataFrame:
    """Step 4: summaries (with ``run_id``) as on ``network``: ``samples_per_s_virtual`` (the
    steady estimator of :func:`~gtopk_lab.training.rows.steady_seconds_per_iteration` on the
    repriced rows of the summary's rank), ``virtual_time_s``, ``bandwidth_bps``,
    ``latency_s`` and ``network`` replaced. ``repriced``: ``reprice_metrics(metrics, network)``
    when the caller has it already."""
    net = _network(network)
    if repriced is None:
        repriced = reprice_metrics(metrics, net)
    iters = repriced[repriced["kind"] == "iter"]
    by_run = dict(tuple(iters.groupby("run_id", sort=False)))
    out = summaries.copy()
    speeds, totals = [], []
    for row in out.itertuples():
        mine = by_run.get(row.run_id, iters.iloc[:0])
        if mine.empty:
            speeds.append(math.nan)
            totals.append(math.nan)
            continue
        rank = int(getattr(row, "rank", mine["rank"].min()) or 0)
        own = mine[mine["rank"] == (rank if (mine["rank"] == rank).any() else mine["rank"].min())]
        own = own.sort_values("iteration")
        records = own[["iteration", "virtual_time_s"]].to_dict("records")
        t_iter = steady_seconds_per_iteration(records, int(getattr(row, "warmup_iterations", 0) or 0),
                                              "virtual", int(row.iterations_per_epoch), block=_sync_block(own))
        speeds.append(float(row.batch_size) * float(row.workers) / t_iter if t_iter > 0 else math.nan)
        totals.append(float(own["virtual_time_s"].iloc[-1]))
    out["samples_per_s_virtual"] = speeds
    out["virtual_time_s"] = totals
    out["bandwidth_bps"] = math.nan if net.unthrottled else net.bandwidth_bps
    out["latency_s"] = 0.0 if net.unthrottled else net.latency_s
    out["network"] = str(net)
    return out


def _smoothed_losses(metrics: pd.DataFrame, window: int) -> pd.DataFrame:
    """Per (run_id, iteration): ``loss`` (mean over ranks), ``t`` (virtual time) and
    ``smooth`` (trailing mean of ``loss`` over ``window`` iterations of the same run)."""
    it = metrics[metrics["kind"] == "iter"]
    per = it.groupby(["run_id", "iteration"], sort=True).agg(loss=("train_loss", "mean"),
                                                             t=("virtual_time_s", "max")).reset_index()
    loss = per["loss"].to_numpy(dtype=float)
    runs = per["run_id"].to_numpy()
    start = np.r_[0, np.flatnonzero(runs[1:] != runs[:-1]) + 1] if len(runs) else np.array([], dtype=int)
    cumulative = np.r_[0.0, np.cumsum(loss)]
    first = np.repeat(start, np.diff(np.r_[start, len(runs)]))  # each row's run start
    position = np.arange(len(runs))
    lower = np.maximum(first, position - window + 1)
    per["smooth"] = (cumulative[position + 1] - cumulative[lower]) / (position + 1 - lower)
    return per


def time_to_target_s(metrics: pd.DataFrame, target_loss: float, *, window: int = 5) -> pd.Series:
    """Per ``run_id``: virtual time of the first iteration whose training loss (mean over the
    ranks present, then a trailing mean over ``window`` iterations) is at most ``target_loss``;
    NaN when the run never gets there. O(rows log rows)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r} is invalid: expected an int >= 1")
    per = _smoothed_losses(metrics, window)
    reached = per[per["smooth"] <= target_loss].groupby("run_id", sort=False)["t"].first()
    runs = pd.unique(per["run_id"])
    return pd.Series({r: float(reached.get(r, math.nan)) for r in runs}, name="time_to_target_s", dtype=float)


def auto_target_loss(metrics: pd.DataFrame, summaries: pd.DataFrame, *, slack: float = 0.05,
                     window: int = 5) -> float:
    """A target every reasonable method can reach: the worst final smoothed training loss of
    the baseline's (dense S-SGD's) runs with P > 1, raised by ``slack`` (relative). NaN without
    such a run."""
    dense = set(summaries[(summaries["method"] == BASELINE_METHOD) & (summaries["workers"] > 1)]["run_id"])
    per = _smoothed_losses(metrics[metrics["run_id"].isin(dense)], window)
    finals = per.groupby("run_id")["smooth"].last()
    return float(finals.max() * (1.0 + slack)) if len(finals) else math.nan


def method_comparison(summaries: pd.DataFrame, metrics: pd.DataFrame, networks: Sequence[str | NetworkModel],
                      target_loss: float, *, window: int = 5) -> pd.DataFrame:
    """One row per (network, method, P, source), seeds averaged: ``time_to_target_s`` (mean
    over the ``reached`` seeds that got there; NaN when none did) with its 95% Student-t
    interval ``time_to_target_ci_low`` / ``_high`` (NaN below two seeds that reached it),
    ``bytes_per_rank_per_iter``,
    ``final_loss`` (the last validation loss, else training), ``efficiency`` (dense P = 1 of
    the same seed and source = 1), ``baseline`` and ``n`` (seeds)."""
    done = summaries[summaries["status"] == "completed"]
    if "final" not in done.columns:
        done = done.assign(final=True)
    frames = []
    for network in networks:
        net = _network(network)
        rows = reprice_metrics(metrics, net)
        efficiency = point_efficiency(reprice_summaries(done, metrics, net, repriced=rows))
        reached = time_to_target_s(rows, target_loss, window=window)
        final = efficiency["final_test_loss"].where(efficiency["final_test_loss"].notna(),
                                                    efficiency["final_train_loss"])
        frames.append(efficiency.assign(network=str(network), time_to_target_s=efficiency["run_id"].map(reached),
                                        final_loss=final))
    table = pd.concat(frames, ignore_index=True)
    table = table.assign(density=table["density"].where(~table["method"].map(lambda m: is_dense(str(m)))))
    keys = ["network", "method", "workers", "source"]
    return (table.groupby(keys, sort=False, dropna=False)
            .agg(time_to_target_s=("time_to_target_s", "mean"),
                 time_to_target_ci_low=("time_to_target_s", lambda v: t_interval(v).low),
                 time_to_target_ci_high=("time_to_target_s", lambda v: t_interval(v).high),
                 reached=("time_to_target_s", "count"),
                 bytes_per_rank_per_iter=("bytes_sent_per_rank_per_iter", "mean"),
                 final_loss=("final_loss", "mean"), efficiency=("efficiency_virtual", "mean"),
                 baseline=("baseline", "first"), n=("run_id", "count"))
            .reset_index())



def comparison_pivot(table: pd.DataFrame, values: str = "time_to_target_s") -> pd.DataFrame:
    """One column of :func:`method_comparison`'s ``table`` as methods x (network, P, source).

    Every method keeps its row and every recorded (network, P, source) its column, NaN
    included: a method that never reaches the target shows NaN instead of vanishing (what
    ``pivot_table``'s ``dropna`` does), and the dense P = 1 baselines of the two sources
    (real and simulated) stay two columns instead of being averaged into one number that
    neither clock measured. Methods in the table's order; columns by network (the table's
    order), then P, then source. ``ValueError`` if a (method, network, P, source) appears
    twice (not a ``method_comparison`` table). O(rows log rows)."""
    keys = ["network", "workers", "source"]
    missing = [c for c in ["method", *keys, values] if c not in table.columns]
    if missing:
        raise ValueError(f"table lacks {', '.join(missing)}: expected method_comparison's table")
    if table.duplicated(["method", *keys]).any():
        raise ValueError("table has a (method, network, workers, source) twice: expected "
                         "method_comparison's table (one row per key, seeds averaged)")
    network_order = {n: i for i, n in enumerate(pd.unique(table["network"]))}
    columns = (table[keys].drop_duplicates()
               .assign(_net=lambda f: f["network"].map(network_order), _src=lambda f: f["source"].astype(str))
               .sort_values(["_net", "workers", "_src"], kind="stable")[keys])
    wide = table.pivot(index="method", columns=keys, values=values)
    return wide.reindex(index=pd.unique(table["method"]), columns=pd.MultiIndex.from_frame(columns))
