"""Outcome figures: time to a target accuracy with confidence intervals, and Pareto figures
(one point per run, the frontier drawn) of what a run achieved against what it cost.

Inputs: :func:`~gtopk_lab.analysis.outcomes.time_to_accuracy_table` (one row per point,
``time_mean``, ``time_ci_low``, ``time_ci_high``, ``reached``, ``n``) and
:func:`~gtopk_lab.analysis.outcomes.run_outcomes` (one row per run: ``final_test_accuracy``,
``final_loss``, ``bytes_sent_per_rank``, ``virtual_time_s``). The frontier is
:func:`~gtopk_lab.analysis.pareto.frontier_points`. Pure (pandas + plotly). Re-exported by
:mod:`gtopk_lab.plotting.figures`.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from gtopk_lab.analysis.intervals import interval_bounds, interval_note
from gtopk_lab.analysis.pareto import frontier_points
from gtopk_lab.plotting.figures_base import method_color, method_rank, require_frame

__all__ = ["PARETO_X", "PARETO_Y", "time_to_accuracy_figure", "pareto_figure"]

#: Cost axes of a Pareto figure -> axis title (lower is better).
PARETO_X: dict[str, str] = {
    "bytes_sent_per_rank": "bytes sent per rank over the run",
    "virtual_time_s": "virtual time of the run on the modelled network (s)",
}
_SHORT_X = {"bytes_sent_per_rank": "bytes sent per rank", "virtual_time_s": "virtual time"}
#: Outcome axes -> (axis title, higher is better).
PARETO_Y: dict[str, tuple[str, bool]] = {
    "final_test_accuracy": ("final test accuracy", True),
    "final_loss": ("final loss (test, else train)", False),
}
_P_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "x", "star", "hexagon")


def _series_label(row: pd.Series, several: dict[str, bool]) -> str:
    parts = [str(row["method"])]
    if several["density"] and pd.notna(row["density"]):
        parts.append(f"ρ={float(row['density']):g}")
    for field in ("link", "source"):
        if several[field]:
            parts.append(str(row[field]))
    return " ".join(parts)


def time_to_accuracy_figure(table: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Virtual seconds to the target test accuracy vs P, one line per (method, density,
    link, source): the mean over the seeds that reached it, error bars of its 95% Student-t
    interval; points no seed reached are named under the title. O(points)."""
    require_frame("table", table, ("method", "density", "workers", "link", "source", "time_mean", "time_ci_low",
                                   "time_ci_high", "reached", "n", "target"))
    fig = go.Figure()
    target = float(table["target"].iloc[0]) if len(table) else math.nan
    several = {c: table[c].nunique(dropna=False) > 1 for c in ("density", "link", "source")} if len(table) else \
        {"density": False, "link": False, "source": False}
    frame = table.assign(_d=table["density"].fillna(-1.0))
    keys = ["method", "_d", "link", "source"]
    groups = sorted(frame.groupby(keys, sort=False, dropna=False), key=lambda t: (method_rank(t[0][0]),
                                                                                  str(t[0]))) if len(frame) else []
    missed: list[str] = []
    seeds = 1
    for _, rows in groups:
        rows = rows.sort_values("workers")
        label = _series_label(rows.iloc[0], several)
        for _, r in rows[rows["reached"] == 0].iterrows():
            missed.append(f"{label} P={int(r['workers'])}")
        rows = rows[rows["reached"] > 0]
        if rows.empty:
            continue
        seeds = max(seeds, int(rows["reached"].max()))
        up, down = interval_bounds(rows["time_mean"], rows["time_ci_low"], rows["time_ci_high"])
        fig.add_trace(go.Scatter(
            x=rows["workers"].to_numpy(), y=rows["time_mean"].to_numpy(), mode="lines+markers", name=label,
            line={"color": method_color(str(rows.iloc[0]["method"])),
                  "dash": "dot" if rows.iloc[0]["source"] == "simulated" else "solid"},
            marker={"size": 9, "symbol": "diamond" if rows.iloc[0]["source"] == "simulated" else "circle"},
            error_y={"type": "data", "symmetric": False, "array": up, "arrayminus": down,
                     "visible": bool((up > 0).any())},
            customdata=list(zip(rows["reached"], rows["n"], rows["iterations_mean"])),
            hovertemplate=f"{label}<br>P=%{{x}}<br>%{{y:.3g}} s (virtual)<br>reached by %{{customdata[0]}} of "
                          "%{customdata[1]} seeds<br>iterations %{customdata[2]:.0f}<extra></extra>"))
    sub = interval_note(seeds, short=True)
    if missed:
        sub += "; not reached: " + ", ".join(missed)
    default = f"Time to {target:.0%} test accuracy (virtual clock)" if math.isfinite(target) else "Time to accuracy"
    head = title or default
    fig.update_layout(title=f"{head}<br><sup>{sub}</sup>", template="plotly_white", height=440,
                      xaxis={"title": "workers P", "type": "log", "dtick": math.log10(2)},
                      yaxis={"title": "virtual seconds to the target", "type": "log"},
                      legend={"orientation": "h", "y": -0.25})
    return fig


def pareto_figure(outcomes: pd.DataFrame, x: str = "bytes_sent_per_rank", y: str = "final_test_accuracy",
                  title: str | None = None) -> go.Figure:
    """One marker per run (colour = method, symbol = P), ``y`` against ``x`` (log axis),
    and the Pareto frontier: the runs no other run beats on both (fewer bytes or less time,
    and a higher accuracy or lower loss) joined as a staircase. O(runs log runs)."""
    if x not in PARETO_X:
        raise ValueError(f"x={x!r} is invalid: expected one of {', '.join(PARETO_X)}")
    if y not in PARETO_Y:
        raise ValueError(f"y={y!r} is invalid: expected one of {', '.join(PARETO_Y)}")
    require_frame("outcomes", outcomes, ("run_id", "method", "density", "workers", x, y))
    y_title, higher = PARETO_Y[y]
    runs = outcomes[pd.to_numeric(outcomes[x], errors="coerce").notna()
                    & pd.to_numeric(outcomes[y], errors="coerce").notna()]
    fig = go.Figure()
    ps = sorted({int(p) for p in runs["workers"]})
    for method, rows in sorted(runs.groupby("method", sort=False), key=lambda t: method_rank(t[0])):
        label = [f"{rid}<br>ρ={d:g}" if pd.notna(d) else str(rid) for rid, d in zip(rows["run_id"], rows["density"])]
        fig.add_trace(go.Scatter(
            x=rows[x].to_numpy(), y=rows[y].to_numpy(), mode="markers", name=str(method),
            marker={"color": method_color(str(method)), "size": 10, "line": {"width": 1, "color": "#333"},
                    "symbol": [_P_SYMBOLS[ps.index(int(p)) % len(_P_SYMBOLS)] for p in rows["workers"]]},
            text=label, customdata=rows["workers"].to_numpy(),
            hovertemplate=f"{method} P=%{{customdata}}<br>%{{text}}<br>{x}=%{{x:.4g}}<br>{y}=%{{y:.4g}}"
                          "<extra></extra>"))
    front = frontier_points(runs, x, y, x_lower_better=True, y_higher_better=higher) if len(runs) else runs
    if len(front):
        fig.add_trace(go.Scatter(x=front[x].to_numpy(), y=front[y].to_numpy(), mode="lines+markers",
                                 name="Pareto frontier",
                                 line={"color": "#222", "dash": "dash", "width": 1.5, "shape": "hv"},
                                 # ringed, so that a frontier of one point (or of runs at one x) still shows
                                 marker={"symbol": "circle-open", "size": 16, "color": "#222"},
                                 hoverinfo="skip"))
    symbols = ", ".join(f"P={p}: {_P_SYMBOLS[i % len(_P_SYMBOLS)]}" for i, p in enumerate(ps))
    fig.update_layout(title=(title or f"{y_title[0].upper() + y_title[1:]} vs {_SHORT_X[x]}, one point per run")
                      + (f"<br><sup>dashed: the Pareto frontier ({len(front)} of {len(runs)} runs); {symbols}</sup>"
                         if len(runs) else ""),
                      margin={"t": 90},
                      template="plotly_white", height=440,
                      xaxis={"title": PARETO_X[x], "type": "log"},
                      yaxis={"title": y_title, **({"tickformat": ".1~%"} if y == "final_test_accuracy" else {})},
                      legend={"orientation": "h", "y": -0.25})
    return fig
