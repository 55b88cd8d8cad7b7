"""Plotly figure builders: DataFrames in, ``go.Figure`` out.

Every function here is pure (no Dask, no torch, no I/O): it reads frames in the schemas
of docs/architecture.md and returns a ``plotly.graph_objects.Figure``. The live variants
in :mod:`gtopk_lab.plotting.live` and the HTML report in :mod:`gtopk_lab.plotting.report` reuse
these builders, so a figure looks the same in a notebook, a live widget and a report.

Inputs
------
- ``metrics``: metric rows (``kind`` = "iter" | "epoch", ``rank``, ``iteration``, ``epoch``,
  ``method``, ``workers``, ``density``, ``k``, ``train_loss``, ``test_accuracy``,
  ``wall_time_s``, ``virtual_time_s``, ...) optionally with a ``run_id`` column (as
  ``results.load_runs`` returns them); without one, runs are told apart by
  (method, density, workers).
- ``summaries``: one row per run (``summary.json`` fields).
- scaling tables: ``method``, ``workers``, ``scaling_efficiency`` (fraction 0..1), and
  optionally ``bandwidth`` (a label) to draw one line per network.

Cost: every builder is O(rows) in pandas plus the size of the traces it emits.

Example::

    from gtopk_lab.plotting import figures
    fig = figures.convergence_figure(metrics_df, x="epoch")
    fig.show()
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from scipy.special import ndtri

from gtopk_lab.methods import BASELINE_METHOD, get_method

__all__ = [
    "METHOD_COLORS",
    "PAPER_SCALING_EFFICIENCY_32_1GBE",
    "PAPER_BREAKDOWN_GTOPK_32_1GBE_S",
    "X_AXES",
    "run_label",
    "convergence_figure",
    "convergence_frames",
    "scaling_efficiency_figure",
    "time_breakdown_figure",
    "comm_volume_figure",
    "comm_bytes_per_rank_formula",
    "gradient_histogram_figure",
    "topk_error_table",
    "topk_error_figure",
    "gaussiank_count_figure",
    "paper_scaling_table",
]

#: One colour per method, shared by every figure so a method is recognisable everywhere.
METHOD_COLORS: dict[str, str] = {
    "dense": "#636EFA",
    "topk": "#EF553B",
    "gtopk": "#00CC96",
    "gaussiank": "#AB63FA",
    "oktopk": "#FFA15A",
}
_FALLBACK_COLORS = ("#19D3F3", "#FF6692", "#B6E880", "#FF97FF", "#FECB52")

#: Scaling efficiency at 32 workers on 1 GbE, as typed into the authors' plotting script
#: (Shi et al., ICDCS'19, scripts/icdcs2019/communication.py, realdata_speedup); fractions.
PAPER_SCALING_EFFICIENCY_32_1GBE: dict[str, dict[str, float]] = {
    "VGG-16 / CIFAR-10": {"dense": 0.0096, "topk": 0.0478, "gtopk": 0.0935},
    "ResNet-20 / CIFAR-10": {"dense": 0.313, "topk": 0.756, "gtopk": 0.857},
    "AlexNet / ImageNet": {"dense": 0.0071, "topk": 0.0532, "gtopk": 0.0909},
    "ResNet-50 / ImageNet": {"dense": 0.203, "topk": 0.578, "gtopk": 0.740},
    "LSTM / PTB": {"dense": 0.0054, "topk": 0.0138, "gtopk": 0.0276},
}

#: Per-iteration breakdown of gTop-k at 32 workers on 1 GbE (seconds), same paper.
PAPER_BREAKDOWN_GTOPK_32_1GBE_S: dict[str, dict[str, float]] = {
    "VGG-16 / CIFAR-10": {"compute": 0.140, "selection": 0.091, "communication": 0.812},
    "ResNet-20 / CIFAR-10": {"compute": 0.146, "selection": 0.0016, "communication": 0.025},
    "AlexNet / ImageNet": {"compute": 0.257, "selection": 0.384, "communication": 3.363},
    "ResNet-50 / ImageNet": {"compute": 4.88, "selection": 0.154, "communication": 1.42},
}

#: Allowed x axes of the convergence figure -> axis title.
X_AXES: dict[str, str] = {
    "iteration": "iteration",
    "epoch": "epoch",
    "wall_time_s": "wall-clock time (s)",
    "virtual_time_s": "virtual time on the modelled network (s)",
}

_BREAKDOWN_PARTS: tuple[tuple[str, str], ...] = (
    ("compute", "compute_s"),
    ("selection", "selection_s"),
    ("communication", "comm_s"),
    ("update", "update_s"),
)
_BREAKDOWN_COLORS = {"compute": "#636EFA", "selection": "#FFA15A", "communication": "#EF553B",
                     "update": "#00CC96"}


# --- helpers -----------------------------------------------------------------------------
def _require_frame(name: str, frame: Any, columns: Iterable[str]) -> pd.DataFrame:
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"{name} has type {type(frame).__name__}: expected pandas.DataFrame")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{name} is missing column(s) {', '.join(missing)}: expected the schema of "
            f"docs/architecture.md (has {', '.join(map(str, frame.columns)) or 'no columns'})"
        )
    return frame


def _method_color(method: str, _cache: dict[str, str] = {}) -> str:  # noqa: B006 - memo
    if method in METHOD_COLORS:
        return METHOD_COLORS[method]
    if method not in _cache:
        _cache[method] = _FALLBACK_COLORS[len(_cache) % len(_FALLBACK_COLORS)]
    return _cache[method]


def _fmt_density(density: float) -> str:
    return f"{density:g}"


def run_label(method: str, density: float, workers: int, extra: str = "") -> str:
    """Legend label of a run: ``"gtopk ρ=0.001 P=4"`` (dense runs omit the density)."""
    parts = [str(method)]
    if method != BASELINE_METHOD:
        parts.append(f"ρ={_fmt_density(float(density))}")
    parts.append(f"P={int(workers)}")
    if extra:
        parts.append(extra)
    return " ".join(parts)


def _run_keys(metrics: pd.DataFrame) -> list[str]:
    return ["run_id"] if "run_id" in metrics.columns else ["method", "density", "workers"]


_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def _density_dash(densities: Sequence[float]) -> dict[float, str]:
    return {d: _DASHES[i % len(_DASHES)] for i, d in enumerate(sorted(set(densities), reverse=True))}


def _runs(metrics: pd.DataFrame) -> list[tuple[str, pd.DataFrame, dict[str, Any]]]:
    """Split metrics into runs: (label, rows, {method, density, workers}), sorted for legends."""
    keys = _run_keys(metrics)
    out: list[tuple[str, pd.DataFrame, dict[str, Any]]] = []
    for _, rows in metrics.groupby(keys, sort=False, dropna=False):
        first = rows.iloc[0]
        meta = {"method": str(first["method"]), "density": float(first["density"]),
                "workers": int(first["workers"])}
        out.append(("", rows, meta))
    # Disambiguate runs that share (method, density, P), e.g. two bandwidths.
    counts: dict[tuple[str, float, int], int] = {}
    for _, _, m in out:
        key = (m["method"], m["density"], m["workers"])
        counts[key] = counts.get(key, 0) + 1
    labelled = []
    for _, rows, m in out:
        extra = ""
        if counts[(m["method"], m["density"], m["workers"])] > 1 and "run_id" in rows.columns:
            extra = f"[{rows['run_id'].iloc[0]}]"
        labelled.append((run_label(m["method"], m["density"], m["workers"], extra), rows, m))
    order = {name: i for i, name in enumerate(METHOD_COLORS)}
    labelled.sort(key=lambda t: (order.get(t[2]["method"], 99), -t[2]["density"], t[2]["workers"], t[0]))
    return labelled


# --- convergence -------------------------------------------------------------------------
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
    _require_frame("metrics", metrics, ("kind", "iteration", "method", "density", "workers"))
    result: dict[str, pd.DataFrame] = {}
    for label, rows, _ in _runs(metrics):
        train, test = _run_convergence(rows, x)
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
    _require_frame("metrics", metrics, ("kind", "iteration", "method", "density", "workers"))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("train loss", "test accuracy"),
                        horizontal_spacing=0.1)
    runs = _runs(metrics)
    dash = _density_dash([m["density"] for _, _, m in runs])
    for label, rows, meta in runs:
        train, test = _run_convergence(rows, x)
        style = dict(color=_method_color(meta["method"]), dash=dash[meta["density"]])
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
    fig.update_yaxes(title_text="accuracy", tickformat=".0%", row=1, col=2)
    fig.update_layout(title=title or f"Convergence vs {X_AXES[x]}", legend_title_text="run",
                      template="plotly_white", height=420)
    return fig


# --- scaling efficiency ------------------------------------------------------------------
def paper_scaling_table() -> pd.DataFrame:
    """The paper's 32-worker 1 GbE scaling efficiencies as a long frame.

    Columns: ``model, method, workers, scaling_efficiency`` (fraction).
    """
    rows = [{"model": model, "method": method, "workers": 32, "scaling_efficiency": eff}
            for model, per in PAPER_SCALING_EFFICIENCY_32_1GBE.items() for method, eff in per.items()]
    return pd.DataFrame(rows)


def scaling_efficiency_figure(measured: pd.DataFrame, predicted: pd.DataFrame | None = None,
                              time_basis: str = "virtual",
                              paper_models: Sequence[str] = ("ResNet-20 / CIFAR-10", "VGG-16 / CIFAR-10"),
                              title: str | None = None) -> go.Figure:
    """Scaling efficiency ``throughput(P) / (P * throughput(1))`` vs P, per method.

    ``measured``: columns ``method, workers, scaling_efficiency`` (+ optional
    ``bandwidth``), solid lines with markers. ``predicted``: the alpha-beta model's
    prediction in the same schema, dashed lines in the method's colour. ``paper_models``
    adds the paper's 32-worker 1 GbE points (:data:`PAPER_SCALING_EFFICIENCY_32_1GBE`)
    as open reference markers. ``time_basis`` ("virtual" | "wall") only labels the axis:
    which clock the throughputs were measured on.
    """
    if time_basis not in ("virtual", "wall"):
        raise ValueError(f"time_basis={time_basis!r} is invalid: expected 'virtual' or 'wall'")
    _require_frame("measured", measured, ("method", "workers", "scaling_efficiency"))
    if predicted is not None:
        _require_frame("predicted", predicted, ("method", "workers", "scaling_efficiency"))
    unknown = [m for m in paper_models if m not in PAPER_SCALING_EFFICIENCY_32_1GBE]
    if unknown:
        raise ValueError(f"paper_models={unknown!r} is invalid: expected names from "
                         f"{', '.join(PAPER_SCALING_EFFICIENCY_32_1GBE)}")
    fig = go.Figure()
    for frame, kind in ((measured, "measured"), (predicted, "model")):
        if frame is None or not len(frame):
            continue
        keys = ["method", "bandwidth"] if "bandwidth" in frame.columns else ["method"]
        for key, rows in frame.groupby(keys, sort=False):
            key = key if isinstance(key, tuple) else (key,)
            method = str(key[0])
            name = f"{method} ({kind}{', ' + str(key[1]) if len(key) > 1 else ''})"
            rows = rows.sort_values("workers")
            fig.add_trace(go.Scatter(
                x=rows["workers"].to_numpy(), y=rows["scaling_efficiency"].to_numpy(),
                mode="lines+markers" if kind == "measured" else "lines", name=name,
                legendgroup=method,
                line=dict(color=_method_color(method), dash="solid" if kind == "measured" else "dash"),
                hovertemplate=f"{name}<br>P=%{{x}}<br>efficiency=%{{y:.1%}}<extra></extra>"))
    symbols = ("circle-open", "square-open", "diamond-open", "triangle-up-open", "x-open")
    for i, model in enumerate(paper_models):
        for method, eff in PAPER_SCALING_EFFICIENCY_32_1GBE[model].items():
            fig.add_trace(go.Scatter(
                x=[32], y=[eff], mode="markers", name=f"paper {model}: {method}", legendgroup=method,
                marker=dict(symbol=symbols[i % len(symbols)], size=11, color=_method_color(method),
                            line=dict(width=2)),
                hovertemplate=f"paper, 32 workers, 1 GbE<br>{model}<br>{method}: %{{y:.2%}}<extra></extra>"))
    fig.update_xaxes(title_text="workers P", type="log", dtick=math.log10(2))
    fig.update_yaxes(title_text=f"scaling efficiency ({time_basis} time)", tickformat=".0%",
                     rangemode="tozero")
    fig.update_layout(title=title or f"Scaling efficiency ({time_basis} time); dashed: alpha-beta model",
                      template="plotly_white", height=450)
    return fig


# --- time breakdown ----------------------------------------------------------------------
def _breakdown_frame(summaries: pd.DataFrame) -> pd.DataFrame:
    """Mean seconds per iteration of each part, one row per (method, workers)."""
    _require_frame("summaries", summaries, ("method", "workers"))
    rows = []
    for _, s in summaries.iterrows():
        parts: dict[str, float] = {}
        tb = s.get("time_breakdown_s") if "time_breakdown_s" in summaries.columns else None
        for part, _ in _BREAKDOWN_PARTS:
            if isinstance(tb, Mapping) and part in tb:
                parts[part] = float(tb[part])
            else:
                for col in (f"time_breakdown_s.{part}", f"time_{part}_s"):
                    if col in summaries.columns and pd.notna(s[col]):
                        parts[part] = float(s[col])
                        break
        if not parts:  # e.g. a failed run without a breakdown
            continue
        rows.append({"method": s["method"], "workers": int(s["workers"]),
                     **{p: parts.get(p, 0.0) for p, _ in _BREAKDOWN_PARTS}})
    if not rows:
        raise ValueError("summaries has no time breakdown: expected a 'time_breakdown_s' dict "
                         "column (or time_<part>_s columns) per docs/architecture.md")
    frame = pd.DataFrame(rows)
    return frame.groupby(["method", "workers"], sort=False).mean().reset_index()


def time_breakdown_figure(summaries: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Stacked bars of mean seconds per iteration: compute / selection / communication / update.

    One bar per (method, P) read from the summaries' ``time_breakdown_s``; runs with the
    same (method, P) are averaged.
    """
    frame = _breakdown_frame(summaries)
    order = {name: i for i, name in enumerate(METHOD_COLORS)}
    frame = frame.sort_values(["workers", "method"], key=lambda c: c.map(order) if c.name == "method" else c)
    x = [[f"P={p}" for p in frame["workers"]], frame["method"].astype(str).tolist()]
    fig = go.Figure()
    for part, _ in _BREAKDOWN_PARTS:
        fig.add_trace(go.Bar(x=x, y=frame[part].to_numpy(), name=part,
                             marker_color=_BREAKDOWN_COLORS[part],
                             hovertemplate=f"{part}: %{{y:.4g}} s<extra></extra>"))
    fig.update_layout(barmode="stack", title=title or "Time per iteration by phase",
                      yaxis_title="seconds per iteration", template="plotly_white", height=420)
    return fig


# --- communication volume ----------------------------------------------------------------
def comm_bytes_per_rank_formula(method: str, workers: int, numel: int, k: int,
                                algorithm: str = "butterfly", pair_bytes: int = 8) -> float:
    """Bytes one rank sends per iteration, from the method's collective in the registry.

    (Dense ring allreduce ``2 (P-1)/P * 4 d``; allgather ``(P-1) k m``; gTop-k butterfly
    ``log2(P) k m`` at power-of-two P, tree ``2 (P-1)/P k m``; Ok-Topk ``2k (P-1)/P m``: see
    :mod:`gtopk_lab.methods.formulas`.) ``pair_bytes`` is 8 (fp32 value + int32 index) or 12
    with int64 indices. O(1).
    """
    if workers < 1:
        raise ValueError(f"workers={workers!r} is invalid: expected an integer >= 1")
    return float(get_method(method).predicted_bytes_per_rank(numel, k, int(workers), pair_bytes, algorithm))


def comm_volume_figure(summaries: pd.DataFrame, numel: int | None = None, k: int | None = None,
                       algorithm: str = "butterfly", title: str | None = None) -> go.Figure:
    """Bytes sent per rank per iteration vs P (log-log): measured markers, formula lines.

    Measured: the summaries' ``bytes_sent_per_rank_per_iter``. Formula:
    :func:`comm_bytes_per_rank_formula` for P = 1..max P, with ``numel``/``k`` taken from
    the summaries (one model) unless given.
    """
    _require_frame("summaries", summaries, ("method", "workers", "bytes_sent_per_rank_per_iter"))
    fig = go.Figure()
    if not len(summaries):
        return fig
    order = {name: i for i, name in enumerate(METHOD_COLORS)}
    max_p = int(summaries["workers"].max())
    grid = [p for p in (2 ** i for i in range(0, 12)) if p <= max(max_p, 2)]
    if max_p not in grid:
        grid.append(max_p)
    for method, rows in sorted(summaries.groupby("method"), key=lambda t: order.get(t[0], 99)):
        method = str(method)
        agg = rows.groupby("workers")["bytes_sent_per_rank_per_iter"].mean().reset_index()
        agg = agg[agg["workers"] > 1]
        fig.add_trace(go.Scatter(x=agg["workers"], y=agg["bytes_sent_per_rank_per_iter"], mode="markers",
                                 name=f"{method} (measured)", legendgroup=method,
                                 marker=dict(color=_method_color(method), size=10),
                                 hovertemplate=f"{method}<br>P=%{{x}}<br>%{{y:.3s}}B<extra></extra>"))
        d = numel if numel is not None else (int(rows["numel"].iloc[0]) if "numel" in rows.columns else None)
        kk = k if k is not None else (int(rows["k"].iloc[0]) if "k" in rows.columns else None)
        if d is None or kk is None:
            continue
        algo = algorithm
        if "algorithm" in rows.columns and pd.notna(rows["algorithm"].iloc[0]):
            algo = str(rows["algorithm"].iloc[0])
        ps = [p for p in sorted(grid) if p > 1]
        ys = [comm_bytes_per_rank_formula(method, p, d, kk, algo) for p in ps]
        fig.add_trace(go.Scatter(x=ps, y=ys, mode="lines", name=f"{method} (formula)", legendgroup=method,
                                 line=dict(color=_method_color(method), dash="dash"),
                                 hovertemplate=f"{method} formula<br>P=%{{x}}<br>%{{y:.3s}}B<extra></extra>"))
    fig.update_xaxes(title_text="workers P", type="log", dtick=math.log10(2))
    fig.update_yaxes(title_text="bytes sent per rank per iteration", type="log")
    fig.update_layout(title=title or "Communication volume per rank: measured vs formula",
                      template="plotly_white", height=420)
    return fig


# --- Top-k operator (Shi et al., arXiv:1911.08772) ---------------------------------------
def _as_1d(name: str, values: Any) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor, without importing torch here
        values = values.detach().cpu().numpy()
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        raise ValueError(f"{name} is empty: expected at least one value")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} holds NaN or inf: expected finite values")
    return arr


def gradient_histogram_figure(values: Any, bins: int = 120, density: float | None = None,
                              title: str | None = None) -> go.Figure:
    """Histogram of (residual-accumulated) gradient values with a fitted Gaussian.

    The Gaussian is N(mu, sigma^2) with the sample mean and standard deviation (the
    maximum-likelihood fit). With ``density`` (rho), vertical lines mark the exact top-k
    threshold (k-th largest |u|) and GaussianK's first threshold
    ``mu + |Phi^-1(rho/2)| * sigma``, showing how close the bell-shape assumption is.
    Cost: O(d) for the moments and histogram, O(d) for the top-k threshold (partition).
    """
    u = _as_1d("values", values)
    if bins < 2:
        raise ValueError(f"bins={bins!r} is invalid: expected an integer >= 2")
    mu, sigma = float(u.mean()), float(u.std())
    counts, edges = np.histogram(u, bins=bins, density=True)
    centers = 0.5 * (edges[:-1] + edges[1:])
    fig = go.Figure()
    fig.add_trace(go.Bar(x=centers, y=counts, name="gradients", marker_color="#636EFA", opacity=0.7,
                         hovertemplate="u=%{x:.3g}<br>density=%{y:.3g}<extra></extra>"))
    if sigma > 0:
        xs = np.linspace(edges[0], edges[-1], 400)
        pdf = np.exp(-0.5 * ((xs - mu) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
        fig.add_trace(go.Scatter(x=xs, y=pdf, mode="lines", name=f"N({mu:.2g}, {sigma:.2g}²)",
                                 line=dict(color="#EF553B")))
    if density is not None:
        if not (0 < density <= 1):
            raise ValueError(f"density={density!r} is invalid: expected a number in (0, 1]")
        k = max(1, int(math.floor(density * u.size)))
        exact = float(np.partition(np.abs(u), u.size - k)[u.size - k])
        gauss = mu + abs(float(ndtri(density / 2.0))) * sigma
        for thr, name, color in ((exact, "exact top-k threshold", "#00CC96"),
                                 (gauss, "GaussianK threshold", "#AB63FA")):
            for sign in (1, -1):
                fig.add_vline(x=sign * thr, line=dict(color=color, dash="dash"))
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"{name} ±{thr:.3g}",
                                     line=dict(color=color, dash="dash")))
    fig.update_layout(title=title or "Distribution of accumulated gradients", xaxis_title="u_i",
                      yaxis_title="probability density", bargap=0, template="plotly_white", height=400)
    return fig



def topk_error_table(values: Any, densities: Sequence[float], label: str = "") -> pd.DataFrame:
    """Relative Top-k error ``||u - topk(u)||^2 / ||u||^2`` at each density k/d.

    Sorting u^2 once (O(d log d)) gives every k at O(1) each via a suffix sum.
    Columns: ``k_over_d, k, relative_error, bound_randomk`` (1 - k/d),
    ``bound_gaussian`` ((1 - k/d)^2, the tighter bound of arXiv:1911.08772) and ``label``.
    """
    u = _as_1d("values", values)
    d = u.size
    sq = np.sort(u * u)[::-1]
    total = float(sq.sum())
    if total == 0:
        raise ValueError("values are all zero: the relative error is undefined")
    kept = np.concatenate([[0.0], np.cumsum(sq)])
    rows = []
    for rho in densities:
        if not (0 < rho <= 1):
            raise ValueError(f"densities contains {rho!r}: expected numbers in (0, 1]")
        k = max(1, int(math.floor(rho * d)))
        rows.append({"k_over_d": k / d, "k": k, "relative_error": max(0.0, (total - kept[k]) / total),
                     "bound_randomk": 1 - k / d, "bound_gaussian": (1 - k / d) ** 2, "label": label})
    return pd.DataFrame(rows)


def _rows_per_label(table: pd.DataFrame, sort_by: str) -> list[tuple[str, pd.DataFrame]]:
    """(label, rows sorted by ``sort_by``) per value of the optional ``label`` column."""
    if "label" not in table.columns:
        return [("", table.sort_values(sort_by))]
    return [(label, table[table["label"] == label].sort_values(sort_by))
            for label in table["label"].unique()]


def topk_error_figure(table: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Measured Top-k error vs k/d against the (1-k/d) and (1-k/d)^2 bounds.

    ``table``: :func:`topk_error_table` output (several labels allowed, e.g. one per
    iteration or model). Log x axis so that rho = 0.001 .. 1 is readable.
    """
    _require_frame("table", table, ("k_over_d", "relative_error"))
    fig = go.Figure()
    for i, (label, rows) in enumerate(_rows_per_label(table, "k_over_d")):
        fig.add_trace(go.Scatter(x=rows["k_over_d"], y=rows["relative_error"], mode="lines+markers",
                                 name=f"measured {label}".strip(),
                                 line=dict(color=_FALLBACK_COLORS[i % len(_FALLBACK_COLORS)]
                                           if i else "#00CC96")))
    grid = np.geomspace(max(float(table["k_over_d"].min()), 1e-6), 1.0, 200)
    fig.add_trace(go.Scatter(x=grid, y=1 - grid, mode="lines", name="1 - k/d (Random-k bound)",
                             line=dict(color="#636EFA", dash="dash")))
    fig.add_trace(go.Scatter(x=grid, y=(1 - grid) ** 2, mode="lines", name="(1 - k/d)² (tighter bound)",
                             line=dict(color="#EF553B", dash="dot")))
    fig.update_xaxes(title_text="k / d", type="log")
    fig.update_yaxes(title_text="||u - topk(u)||² / ||u||²", rangemode="tozero")
    fig.update_layout(title=title or "Top-k operator error vs density", template="plotly_white", height=420)
    return fig


def gaussiank_count_figure(table: pd.DataFrame, title: str | None = None) -> go.Figure:
    """GaussianK's selected count vs the requested k, with the y = k line and the 2k/3..4k/3 band.

    ``table``: columns ``k, selected`` (+ optional ``label``), e.g. from calling the
    ``gaussiank`` selector on accumulated gradients at several densities.
    """
    _require_frame("table", table, ("k", "selected"))
    fig = go.Figure()
    ks = np.sort(table["k"].unique().astype(float))
    if len(ks):
        fig.add_trace(go.Scatter(x=np.concatenate([ks, ks[::-1]]),
                                 y=np.concatenate([ks * 4 / 3, ks[::-1] * 2 / 3]), fill="toself",
                                 fillcolor="rgba(171,99,250,0.12)", line=dict(width=0),
                                 name="2k/3 .. 4k/3 (adjustment band)", hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=ks, y=ks, mode="lines", name="selected = k",
                                 line=dict(color="#636EFA", dash="dash")))
    for i, (label, rows) in enumerate(_rows_per_label(table, "k")):
        fig.add_trace(go.Scatter(x=rows["k"], y=rows["selected"], mode="markers+lines",
                                 name=f"GaussianK {label}".strip(),
                                 marker=dict(color="#AB63FA" if i == 0 else _FALLBACK_COLORS[i % 5])))
    fig.update_xaxes(title_text="requested k", type="log")
    fig.update_yaxes(title_text="entries selected", type="log")
    fig.update_layout(title=title or "GaussianK: selected count vs k", template="plotly_white", height=420)
    return fig
