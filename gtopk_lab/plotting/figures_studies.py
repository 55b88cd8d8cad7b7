"""Studies side by side: scaling efficiency vs P and convergence of one or several studies,
each study a legend group.

What the ControlPanel's live tabs and ``live_scaling`` draw. A :class:`ShownStudy` is one
study's frames (its :meth:`~gtopk_lab.orchestration.study.Study.points`, ``metrics`` and
``status``) and its legend group; :func:`shown_study` takes them from a ``Study`` (live, or
reloaded with ``Study.load``).

:func:`scaling_studies_figure`:

1. per study, efficiency on the chosen clock by the paper's definition (dense P = 1 of the
   same network, seed and source), one series per method, density, pattern, link and
   source, mean over seeds with error bars of its 95% Student-t interval (none with one
   seed; :mod:`~gtopk_lab.analysis.intervals`), the alpha-beta(-gamma) prediction dashed;
   provisional points (the run or its baseline still going) are hollow markers
2. every series of every study is named by :func:`~gtopk_lab.plotting.legend_names.legend_names`
   (its method and only the fields that vary between all shown series: ``gtopk ρ=0.001 1GbE``)
3. a study's traces share a ``legendgroup`` with its title (``legendgrouptitle``); a click on
   the legend hides or shows the whole study (``groupclick="togglegroup"``); every study but
   the newest is drawn at :data:`FADED_OPACITY`

:func:`convergence_studies_figure`: train loss of rank 0 per iteration, one panel per method,
one line per series and P (mean over seeds, with a band of its 95% Student-t interval when
there are several), grouped, named and faded as steps 2-3.

Cost per figure: the studies' tables, O(points + rows). Client side; plotly and pandas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gtopk_lab.analysis.intervals import CONFIDENCE, interval_bounds, interval_columns, interval_note
from gtopk_lab.analysis.study_tables import aggregate_seeds, point_efficiency, predicted_efficiency
from gtopk_lab.plotting.figures_base import method_color
from gtopk_lab.plotting.legend_names import legend_names

__all__ = ["FADED_OPACITY", "PANELS_PER_ROW", "ShownStudy", "shown_study", "scaling_studies_figure",
           "convergence_studies_figure"]

#: Opacity of every study but the newest (which is drawn at 1).
FADED_OPACITY = 0.35
#: Panels per row of the convergence figure (one per method).
PANELS_PER_ROW = 5
#: The config fields of a run that make a convergence series (seeds are averaged).
_SERIES_FIELDS = ("method", "workers", "density", "algorithm", "bandwidth", "latency", "source")


@dataclass(frozen=True)
class ShownStudy:
    """One study as the figures draw it: its frames and its legend group (``key``, ``title``;
    an empty title: no group title, as for a figure of one study)."""

    points: pd.DataFrame = field(default_factory=pd.DataFrame)
    metrics: pd.DataFrame = field(default_factory=pd.DataFrame)
    status: pd.DataFrame = field(default_factory=pd.DataFrame)
    key: str = "study"
    title: str = ""


def shown_study(study: Any, title: str = "", *, metrics: bool = True) -> ShownStudy:
    """``study``'s frames now (``metrics=False`` skips reading its rows)."""
    key = str(getattr(study, "study_id", None) or id(study))
    return ShownStudy(points=study.points(), metrics=study.metrics() if metrics else pd.DataFrame(),
                      status=study.status(), key=key, title=title)


def _group(shown: ShownStudy, faded: bool, first: bool) -> dict[str, Any]:
    """The legend-group arguments of one trace of ``shown``."""
    args: dict[str, Any] = {"legendgroup": shown.key, "opacity": FADED_OPACITY if faded else 1.0}
    if first and shown.title:
        args["legendgrouptitle"] = {"text": shown.title}
    return args


def _finish_legend(fig: go.Figure, several: bool, below: bool) -> None:
    legend: dict[str, Any] = {"orientation": "h", "y": -0.25} if below else {}
    if several:
        legend["groupclick"] = "togglegroup"
    fig.update_layout(legend=legend)


# --- scaling efficiency ------------------------------------------------------------------
def _scaling_series(shown: ShownStudy, time: str) -> tuple[list[tuple[dict[str, Any], pd.DataFrame]], pd.DataFrame, int, int]:
    """A study's series ``(legend record, rows by P)``, its prediction, provisional points, seeds."""
    points = shown.points
    table = aggregate_seeds(point_efficiency(points, time), time) if len(points) else pd.DataFrame()
    predicted = predicted_efficiency(points) if len(points) else pd.DataFrame()
    if not len(table):
        return [], predicted, 0, 0
    provisional, seeds = int(table["provisional"].sum()), int(table["n"].max())
    table = table[table["efficiency_mean"].notna()]
    keys = ["method", "_density", "_algorithm", "bandwidth_bps", "latency_s", "source"]
    table = table.assign(_density=table["density"].fillna(-1.0), _algorithm=table["algorithm"].fillna("-"))
    series = []
    for _, group in table.groupby(keys, sort=True, dropna=False):
        group = group.sort_values("workers")
        row = group.iloc[0]
        record = {"method": row.method, "density": row.density, "algorithm": row.algorithm,
                  "bandwidth_bps": row.bandwidth_bps, "latency_s": row.latency_s, "source": row.source,
                  "seeds": int(group["n"].max())}
        series.append((record, group))
    return series, predicted, provisional, seeds


def _prediction(predicted: pd.DataFrame, record: dict[str, Any]) -> pd.DataFrame:
    if not len(predicted):
        return predicted
    pred = predicted[(predicted["method"] == record["method"]) & (predicted["source"] == record["source"])
                     & (predicted["bandwidth_bps"] == record["bandwidth_bps"])]
    density = record["density"]
    if density is not None and not (isinstance(density, float) and math.isnan(density)):
        pred = pred[pred["density"] == density]
    return pred.groupby("workers", as_index=False)["predicted"].mean() if len(pred) else pred


def scaling_studies_figure(studies: Sequence[ShownStudy], time: str = "virtual") -> go.Figure:
    """Steps 1-3 of the module docstring; the last study is the newest (not faded)."""
    per_study = [_scaling_series(shown, time) for shown in studies]
    records = [record for series, *_ in per_study for record, _ in series]
    names = iter(legend_names(records))
    fig = go.Figure()
    provisional = sum(p for _, _, p, _ in per_study)
    seeds = max([s for *_, s in per_study] or [0])
    for i, (shown, (series, predicted, _, n_seeds)) in enumerate(zip(studies, per_study)):
        faded = i < len(studies) - 1
        for j, (record, group) in enumerate(series):
            label = next(names)
            color = method_color(str(record["method"]))
            up, down = interval_bounds(group["efficiency_mean"], group["efficiency_ci_low"],
                                       group["efficiency_ci_high"])
            fig.add_trace(go.Scatter(
                x=group["workers"], y=group["efficiency_mean"] * 100, mode="lines+markers", name=label,
                line={"color": color, "dash": "dot" if record["source"] == "simulated" else "solid"},
                marker={"symbol": ["circle-open" if p else "circle" for p in group["provisional"]], "size": 9},
                error_y={"type": "data", "symmetric": False, "array": (up * 100).tolist(),
                         "arrayminus": (down * 100).tolist(), "visible": bool(group["n"].max() > 1)},
                customdata=list(zip(group["n"], group["provisional"], group["efficiency_ci_low"] * 100,
                                    group["efficiency_ci_high"] * 100)),
                hovertemplate="P=%{x}<br>%{y:.1f}%"
                              + (" [%{customdata[2]:.1f}, %{customdata[3]:.1f}]" if n_seeds > 1 else "")
                              + "<br>n=%{customdata[0]}<br>provisional=%{customdata[1]}",
                **_group(shown, faded, first=j == 0)))
            pred = _prediction(predicted, record)
            if len(pred):
                fig.add_trace(go.Scatter(x=pred["workers"], y=pred["predicted"] * 100, mode="lines",
                                         name=f"{label} (alpha-beta)", showlegend=False,
                                         line={"color": color, "dash": "dash", "width": 1},
                                         **_group(shown, faded, first=False)))
    title = f"Scaling efficiency ({time} clock; dense P=1 = 100%)"
    if seeds > 1:
        title += f"<br><sup>{interval_note(seeds, short=True)}</sup>"
    if provisional:
        title += f" - {provisional} provisional (hollow: still running)"
    fig.update_layout(title=title, template="plotly_white", height=420,
                      xaxis={"title": "workers P", "type": "log", "dtick": math.log10(2)},
                      yaxis={"title": "efficiency (%)", "rangemode": "tozero"})
    _finish_legend(fig, len(studies) > 1, below=True)
    return fig


# --- convergence -------------------------------------------------------------------------
def _convergence_series(shown: ShownStudy) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """A study's convergence series ``(legend record, rank-0 iteration rows)``."""
    metrics = shown.metrics
    if metrics.empty or "kind" not in metrics.columns:
        return []
    rows = metrics[(metrics["kind"] == "iter") & (metrics["rank"] == 0)]
    status = shown.status
    if len(status) and "run_id" in rows.columns and "run_id" in status.columns:
        # the run's config fields (link, pattern, source) from the study's status
        config = status.dropna(subset=["run_id"]).drop_duplicates("run_id").set_index("run_id")
        extra = [c for c in _SERIES_FIELDS + ("seed",) if c in config.columns and c not in ("method", "workers")]
        rows = rows.drop(columns=[c for c in extra if c in rows.columns]).join(config[extra], on="run_id")
    fields = [c for c in _SERIES_FIELDS if c in rows.columns]
    filled = rows.assign(**{c: rows[c].astype(object).where(rows[c].notna(), "-") for c in fields})
    series = []
    for key, group in filled.groupby(fields, sort=True):
        values = dict(zip(fields, key if isinstance(key, tuple) else (key,)))
        record = {k: (None if v == "-" else v) for k, v in values.items()}
        record["seeds"] = int(group["seed"].nunique()) if "seed" in group.columns else 1
        series.append((record, rows.loc[group.index]))
    return series


def convergence_studies_figure(studies: Sequence[ShownStudy]) -> go.Figure:
    """Train loss vs iteration of every study: one panel per method (see the module docstring)."""
    per_study = [_convergence_series(shown) for shown in studies]
    records = [record for series in per_study for record, _ in series]
    if not records:
        return go.Figure().update_layout(title="Convergence (no rows yet)", template="plotly_white")
    methods = sorted({str(r["method"]) for r in records})
    cols = max(1, min(len(methods), PANELS_PER_ROW))  # ten panels in a row leave no room
    n_rows = max(1, math.ceil(len(methods) / cols))
    fig = make_subplots(rows=n_rows, cols=cols, subplot_titles=methods, shared_yaxes=True,
                        vertical_spacing=0.3 / n_rows if n_rows > 1 else 0.0)
    names = iter(legend_names(records))
    seeds = 1
    for i, (shown, series) in enumerate(zip(studies, per_study)):
        faded = i < len(studies) - 1
        for j, (record, rows) in enumerate(series):
            label = next(names)
            row, col = divmod(methods.index(str(record["method"])), cols)
            stats = rows.groupby("iteration")["train_loss"].agg(["mean", "std", "count"]).reset_index()
            seeds = max(seeds, int(stats["count"].max()))
            color = method_color(str(record["method"]))
            p = int(record.get("workers") or 1)
            fig.add_trace(go.Scatter(x=stats["iteration"], y=stats["mean"], mode="lines", name=label,
                                     line={"color": color, "width": 1 + math.log2(max(p, 1)) / 2},
                                     **_group(shown, faded, first=j == 0)),
                          row=row + 1, col=col + 1)
            if stats["count"].max() > 1:
                lower, upper = interval_columns(stats["mean"], stats["std"], stats["count"])
                lower, upper = lower.fillna(stats["mean"]), upper.fillna(stats["mean"])
                # A loss is never negative, but a 2-seed t interval (multiplier 12.7) reaches below
                # zero on noisy iterations; the band shows the interval's part that can hold a loss.
                lower = lower.clip(lower=0.0)
                band = _group(shown, faded, first=False)
                band["opacity"] = 0.15 * band["opacity"]
                fig.add_trace(go.Scatter(x=list(stats["iteration"]) + list(stats["iteration"][::-1]),
                                         y=list(upper) + list(lower[::-1]), fill="toself", mode="none",
                                         fillcolor=color, showlegend=False, name=f"{label} (band)", **band),
                              row=row + 1, col=col + 1)
    band_text = (f"mean over seeds, band: {100 * CONFIDENCE:g}% Student-t confidence interval" if seeds > 1
                 else "one seed: no confidence interval")
    fig.update_layout(title=f"Convergence (train loss, rank 0; {band_text})",
                      template="plotly_white", height=380 + 260 * (n_rows - 1))
    _finish_legend(fig, len(studies) > 1, below=False)
    fig.update_xaxes(title_text="iteration", row=n_rows)
    fig.update_yaxes(title_text="train loss", col=1)
    return fig
