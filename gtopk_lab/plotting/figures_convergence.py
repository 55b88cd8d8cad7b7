"""Convergence figures: train loss and test accuracy of every run against a chosen x axis.

Input: metric rows (``kind`` = "iter" | "epoch", ``iteration``, ``method``, ``density``,
``workers``, ``train_loss``, ``test_accuracy``, the time columns of :data:`X_AXES`),
optionally with ``run_id`` and ``seed`` (as ``Study.metrics()`` gives them). Runs that
differ only by their seed are drawn as one line, the mean over the seeds, with a band of its
95% Student-t confidence interval (:mod:`~gtopk_lab.analysis.intervals`). Pure (pandas +
plotly). Re-exported by :mod:`gtopk_lab.plotting.figures`.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gtopk_lab.analysis.intervals import CONFIDENCE, interval_columns
from gtopk_lab.plotting.figures_base import X_AXES, density_dash, method_color, require_frame, split_runs

__all__ = ["convergence_frames", "convergence_figure"]


def _run_convergence(rows: pd.DataFrame, x: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, test) points of one run: rank-mean train loss per iteration, rank-0 test accuracy."""
    train = pd.DataFrame(columns=[x, "train_loss"])
    test = pd.DataFrame(columns=[x, "test_accuracy"])
    it = rows[rows["kind"] == "iter"]
    if len(it) and "train_loss" in it.columns and x in it.columns:
        agg = {"train_loss": "mean"} if x == "iteration" else {x: "max", "train_loss": "mean"}
        train = it.groupby("iteration", sort=True).agg(agg).reset_index()[[x, "train_loss"]]
    ep = rows[rows["kind"] == "epoch"]
    if len(ep) and "test_accuracy" in ep.columns and x in ep.columns:
        if "rank" in ep.columns and (ep["rank"] == 0).any():
            ep = ep[ep["rank"] == 0]
        test = ep.sort_values("iteration")[[x, "test_accuracy"]].dropna()
    return train, test


def convergence_frames(metrics: pd.DataFrame, x: str = "iteration") -> dict[str, pd.DataFrame]:
    """Per-run (label -> frame) of the points :func:`convergence_figure` draws.

    Train loss comes from ``kind="iter"`` rows, averaged over ranks at each iteration
    (the loss of the whole data-parallel batch); test accuracy from ``kind="epoch"`` rows
    (rank 0's evaluation). Each frame has columns ``x, train_loss, test_accuracy, series``
    (``series`` = "train" | "test"). O(rows log rows).
    """
    if x not in X_AXES:
        raise ValueError(f"x={x!r} is invalid: expected one of {', '.join(X_AXES)}")
    require_frame("metrics", metrics, ("kind", "iteration", "method", "density", "workers"))
    result: dict[str, pd.DataFrame] = {}
    any_test = False
    for label, rows, _ in split_runs(metrics):
        train, test = _run_convergence(rows, x)
        any_test = any_test or bool(len(test))
        result[label] = pd.concat([train.assign(series="train"), test.assign(series="test")],
                                  ignore_index=True)
    return result


#: Columns that make one point of seeds (those present in the metrics).
SEED_POINT_KEYS: tuple[str, ...] = ("method", "density", "workers", "source", "link", "network")


def _seed_points(metrics: pd.DataFrame) -> list[pd.DataFrame] | None:
    """The runs grouped into points that differ only by ``seed``, or None when there is no
    ``seed`` column, no point has two seeds, or two runs of a point share a seed (then
    something the rows do not show, e.g. the link, tells them apart: no averaging)."""
    if "seed" not in metrics.columns or "run_id" not in metrics.columns:
        return None
    keys = [c for c in SEED_POINT_KEYS if c in metrics.columns]
    runs = metrics.drop_duplicates("run_id")[["run_id", "seed", *keys]]
    if runs.duplicated([*keys, "seed"]).any() or not runs.duplicated(keys).any():
        return None
    return [metrics[metrics["run_id"].isin(group["run_id"])]
            for _, group in runs.groupby(keys, sort=False, dropna=False)]


def _mean_band(curves: list[pd.DataFrame], x: str, y: str) -> pd.DataFrame:
    """Per iteration over the runs' curves: ``x`` (mean), ``mean``, ``low``, ``high``, ``n``."""
    frame = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame()
    if frame.empty:
        return pd.DataFrame(columns=[x, "mean", "low", "high", "n"])
    agg = {"mean": (y, "mean"), "std": (y, "std"), "n": (y, "count")}
    if x != "iteration":
        agg[x] = (x, "mean")
    stats = frame.groupby("iteration", sort=True).agg(**agg).reset_index()
    stats["low"], stats["high"] = interval_columns(stats["mean"], stats["std"], stats["n"])
    return stats


def _seed_curves(rows: pd.DataFrame, x: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, test) mean-and-band frames of one point's runs (its seeds): per run the
    rank-mean train loss per iteration and rank 0's test accuracy, as :func:`_run_convergence`."""
    trains, tests = [], []
    for _, run in rows.groupby("run_id", sort=False):
        it = run[run["kind"] == "iter"]
        if len(it) and "train_loss" in it.columns and x in it.columns:
            agg = {"train_loss": ("train_loss", "mean")} | ({} if x == "iteration" else {x: (x, "max")})
            trains.append(it.groupby("iteration", sort=True).agg(**agg).reset_index())
        ep = run[run["kind"] == "epoch"]
        if len(ep) and "test_accuracy" in ep.columns and x in ep.columns:
            if "rank" in ep.columns and (ep["rank"] == 0).any():
                ep = ep[ep["rank"] == 0]
            tests.append(ep[list(dict.fromkeys(["iteration", x, "test_accuracy"]))].dropna())
    return _mean_band(trains, x, "train_loss"), _mean_band(tests, x, "test_accuracy")


def _band(xs: pd.Series, low: pd.Series, high: pd.Series, color: str, group: str) -> go.Scatter:
    keep = low.notna() & high.notna()
    xs, low, high = xs[keep].tolist(), low[keep].tolist(), high[keep].tolist()
    return go.Scatter(x=xs + xs[::-1], y=high + low[::-1], fill="toself", mode="none", fillcolor=color,
                      opacity=0.18, legendgroup=group, showlegend=False, hoverinfo="skip")


def convergence_figure(metrics: pd.DataFrame, x: str = "iteration", title: str | None = None,
                       log_loss: bool = False, seeds: bool | None = None) -> go.Figure:
    """Train loss and test accuracy of every run against ``x``.

    Two panels (train loss | test accuracy), one trace per run and panel. Colour encodes
    the method, line dash the density; the legend groups both panels of a run, so a click
    hides the run everywhere. ``x``: "iteration", "epoch", "wall_time_s" or
    "virtual_time_s" (time on the modelled network, the paper's x axis).

    ``seeds``: True draws runs that differ only by ``seed`` as one line per point, the mean
    over its seeds per iteration with a band of the 95% Student-t confidence interval
    (none where one seed is left), on both panels; None (default) does so when the rows
    have a ``seed`` column and some point has several seeds; False draws every run.
    """
    if x not in X_AXES:
        raise ValueError(f"x={x!r} is invalid: expected one of {', '.join(X_AXES)}")
    require_frame("metrics", metrics, ("kind", "iteration", "method", "density", "workers"))
    points = _seed_points(metrics) if seeds is not False else None
    if seeds is True and points is None:
        raise ValueError("seeds=True is invalid for these metrics: expected run_id and seed columns, and runs "
                         "that differ only by their seed")
    if points is not None:
        return _seed_figure(points, x, title, log_loss)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("train loss", "test accuracy"),
                        horizontal_spacing=0.1)
    runs = split_runs(metrics)
    dash = density_dash([m["density"] for _, _, m in runs])
    any_test = False
    for label, rows, meta in runs:
        train, test = _run_convergence(rows, x)
        any_test = any_test or bool(len(test))
        style = dict(color=method_color(meta["method"]), dash=dash[meta["density"]])
        fig.add_trace(go.Scatter(x=train[x].to_numpy(), y=train["train_loss"].to_numpy(), mode="lines",
                                 name=label, legendgroup=label, line=style,
                                 hovertemplate=f"{label}<br>{x}=%{{x}}<br>loss=%{{y:.4f}}<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=test[x].to_numpy(), y=test["test_accuracy"].to_numpy(),
                                 mode="lines+markers", name=label, legendgroup=label, showlegend=False,
                                 line=style,
                                 hovertemplate=f"{label}<br>{x}=%{{x}}<br>accuracy=%{{y:.2%}}<extra></extra>"),
                      row=1, col=2)
    fig.update_xaxes(title_text=X_AXES[x])
    fig.update_yaxes(title_text="loss", type="log" if log_loss else "linear", row=1, col=1)
    fig.update_yaxes(title_text="accuracy", tickformat=".1~%", row=1, col=2)  # 30.5%, not 31% twice
    # before the first evaluation an empty axis would autoscale to -100%..400%
    fig.update_yaxes(**({"autorange": True} if any_test else {"range": [0, 1]}), row=1, col=2)
    fig.update_layout(title=title or f"Convergence vs {X_AXES[x]}", legend_title_text="run",
                      template="plotly_white", height=420)
    return fig


def _seed_figure(points: list[pd.DataFrame], x: str, title: str | None, log_loss: bool) -> go.Figure:
    """:func:`convergence_figure` with one mean line and band per point of seeds."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("train loss", "test accuracy"), horizontal_spacing=0.1)
    labelled = []
    for rows in points:
        label, _, meta = split_runs(rows.assign(run_id="point"))[0]
        labelled.append((label, rows, meta))
    dash = density_dash([m["density"] for _, _, m in labelled])
    most, any_test = 1, False
    for label, rows, meta in labelled:
        n_seeds = int(rows["seed"].nunique())
        most = max(most, n_seeds)
        name = f"{label} ({n_seeds} seeds)" if n_seeds > 1 else label
        train, test = _seed_curves(rows, x)
        any_test = any_test or bool(len(test))
        color = method_color(meta["method"])
        style = dict(color=color, dash=dash[meta["density"]])
        for col, frame, y, fmt in ((1, train, "loss", ".4f"), (2, test, "accuracy", ".2%")):
            if not len(frame):
                continue
            fig.add_trace(_band(frame[x], frame["low"], frame["high"], color, name), row=1, col=col)
            fig.add_trace(go.Scatter(x=frame[x].to_numpy(), y=frame["mean"].to_numpy(),
                                     mode="lines" if col == 1 else "lines+markers", name=name, legendgroup=name,
                                     showlegend=col == 1, line=style,
                                     hovertemplate=f"{name}<br>{x}=%{{x}}<br>{y}=%{{y:{fmt}}} (mean)<extra></extra>"),
                          row=1, col=col)
    fig.update_xaxes(title_text=X_AXES[x])
    fig.update_yaxes(title_text="loss", type="log" if log_loss else "linear", row=1, col=1)
    fig.update_yaxes(title_text="accuracy", tickformat=".1~%", row=1, col=2)
    fig.update_yaxes(**({"autorange": True} if any_test else {"range": [0, 1]}), row=1, col=2)
    note = f"mean over seeds, band: {100 * CONFIDENCE:g}% Student-t confidence interval" if most > 1 else \
        "one seed: no confidence interval"
    fig.update_layout(title=(title or f"Convergence vs {X_AXES[x]}") + f"<br><sup>{note}</sup>",
                      legend_title_text="point", template="plotly_white", height=440)
    return fig
