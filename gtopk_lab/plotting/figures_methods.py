"""Method-comparison figures: time to a target loss per network, and loss against the
virtual clock (issue 17's comparison; notebooks/05_modern_methods.ipynb).

Inputs: the table of :func:`gtopk_lab.analysis.reprice.method_comparison` (``network``,
``method``, ``workers``, ``source``, ``time_to_target_s``, ...) and metric rows with
``run_id`` (repriced with :func:`~gtopk_lab.analysis.reprice.reprice_metrics` for another
network). Pure (pandas + plotly). Re-exported by :mod:`gtopk_lab.plotting.figures`.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gtopk_lab.analysis.intervals import interval_bounds
from gtopk_lab.plotting.figures_base import method_color, require_frame

__all__ = ["time_to_target_figure", "loss_vs_time_figure"]


def time_to_target_figure(table: pd.DataFrame, *, target_loss: float | None = None,
                          title: str | None = None) -> go.Figure:
    """One panel per network: bars of time to the target loss (virtual clock, log axis)
    per method in its colour, one bar per P (darker: larger P); the methods that never
    reached it are listed in the panel's title. With ``time_to_target_ci_low`` / ``_high``
    columns (:func:`~gtopk_lab.analysis.reprice.method_comparison`, two seeds or more) each
    bar carries its 95% Student-t interval as an error bar. O(rows)."""
    require_frame("table", table, ("network", "method", "workers", "time_to_target_s"))
    networks = list(dict.fromkeys(table["network"]))
    methods = list(dict.fromkeys(table["method"]))
    titles = []
    for network in networks:
        panel = table[table["network"] == network]
        missed = [m for m in methods if not panel[panel["method"] == m]["time_to_target_s"].notna().any()]
        titles.append(network + (f"<br><sup>not reached: {', '.join(missed)}</sup>" if missed else ""))
    fig = make_subplots(rows=1, cols=max(1, len(networks)), subplot_titles=titles, shared_yaxes=True)
    has_source = "source" in table.columns
    frame = table.assign(source=table["source"] if has_source else "")
    series = sorted({(int(p), str(src)) for p, src in zip(frame["workers"], frame["source"])})
    several = {p for p, _ in series if sum(q == p for q, _ in series) > 1}
    shown: set[str] = set()
    has_ci = {"time_to_target_ci_low", "time_to_target_ci_high"} <= set(frame.columns)
    for col, network in enumerate(networks, start=1):
        panel = frame[frame["network"] == network]
        for i, (p, source) in enumerate(series):
            cell = panel[(panel["workers"] == p) & (panel["source"] == source)].groupby("method", sort=False)
            rows = cell["time_to_target_s"].mean().reindex(methods)
            error = None
            if has_ci:
                up, down = interval_bounds(rows, cell["time_to_target_ci_low"].mean().reindex(methods),
                                           cell["time_to_target_ci_high"].mean().reindex(methods))
                error = {"type": "data", "symmetric": False, "array": up, "arrayminus": down,
                         "visible": bool((up > 0).any())}
            label = f"P={p} {source}" if p in several else f"P={p}"
            fig.add_trace(go.Bar(x=methods, y=rows.to_numpy(), name=label, legendgroup=label, error_y=error,
                                 showlegend=label not in shown, offsetgroup=label,
                                 marker={"color": [method_color(m) for m in methods],
                                         "opacity": 0.35 + 0.65 * (i + 1) / len(series)},
                                 hovertemplate="%{x}<br>" + label + "<br>%{y:.3g} s<extra></extra>"),
                          row=1, col=col)
            shown.add(label)
    target = f" {target_loss:.3g}" if target_loss is not None and math.isfinite(target_loss) else ""
    fig.update_layout(title=title or f"Time to the target training loss{target} (virtual clock)",
                      template="plotly_white", height=460, barmode="group", margin={"t": 110},
                      legend={"orientation": "h", "y": -0.3})
    fig.update_yaxes(type="log", title_text="seconds (virtual)", col=1)
    fig.update_xaxes(tickangle=-35)
    return fig


def loss_vs_time_figure(metrics: pd.DataFrame, *, workers: int, window: int = 5,
                        target_loss: float | None = None, title: str | None = None) -> go.Figure:
    """Training loss (mean over ranks, trailing mean over ``window`` iterations) against
    virtual time, one line per method, for the runs with ``workers`` ranks (seeds pooled per
    iteration); a dashed line at ``target_loss``. O(rows)."""
    require_frame("metrics", metrics, ("kind", "method", "workers", "iteration", "train_loss", "virtual_time_s"))
    rows = metrics[(metrics["kind"] == "iter") & (metrics["workers"] == workers)]
    fig = go.Figure()
    for method, sub in rows.groupby("method", sort=False):
        per = sub.groupby("iteration").agg(loss=("train_loss", "mean"), t=("virtual_time_s", "mean"))
        smooth = per["loss"].rolling(window, min_periods=1).mean()
        fig.add_trace(go.Scatter(x=per["t"], y=smooth, mode="lines", name=str(method),
                                 line={"color": method_color(str(method))}))
    if target_loss is not None and math.isfinite(target_loss):
        fig.add_hline(y=target_loss, line={"dash": "dash", "color": "gray"}, annotation_text="target")
    fig.update_layout(title=title or f"Training loss against the virtual clock, P = {workers}",
                      template="plotly_white", height=400, xaxis={"title": "virtual time (s)", "type": "log"},
                      yaxis={"title": f"train loss (mean of {window} iterations)"},
                      legend={"orientation": "h", "y": -0.2})
    return fig
