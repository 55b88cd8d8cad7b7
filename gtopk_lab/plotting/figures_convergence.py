"""Convergence figures: train loss and test accuracy of every run against a chosen x axis.

Input: metric rows (``kind`` = "iter" | "epoch", ``iteration``, ``method``, ``density``,
``workers``, ``train_loss``, ``test_accuracy``, the time columns of :data:`X_AXES`),
optionally with ``run_id``. Pure (pandas + plotly). Re-exported by
:mod:`gtopk_lab.plotting.figures`.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

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
    for label, rows, _ in split_runs(metrics):
        train, test = _run_convergence(rows, x)
        any_test = any_test or bool(len(test))
        result[label] = pd.concat([train.assign(series="train"), test.assign(series="test")],
                                  ignore_index=True)
    return result


def convergence_figure(metrics: pd.DataFrame, x: str = "iteration", title: str | None = None,
                       log_loss: bool = False) -> go.Figure:
    """Train loss and test accuracy of every run against ``x``.

    Two panels (train loss | test accuracy), one trace per run and panel. Colour encodes
    the method, line dash the density; the legend groups both panels of a run, so a click
    hides the run everywhere. ``x``: "iteration", "epoch", "wall_time_s" or
    "virtual_time_s" (time on the modelled network, the paper's x axis).
    """
    if x not in X_AXES:
        raise ValueError(f"x={x!r} is invalid: expected one of {', '.join(X_AXES)}")
    require_frame("metrics", metrics, ("kind", "iteration", "method", "density", "workers"))
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
