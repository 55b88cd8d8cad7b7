"""System figures: scaling efficiency vs P, time per iteration by phase, bytes per rank.

Inputs: scaling tables (``method, workers, scaling_efficiency`` + optional ``bandwidth``)
and run summaries (``time_breakdown_s``, ``bytes_sent_per_rank_per_iter``). The paper's
reference numbers (Shi et al., ICDCS'19) live here beside the figure that draws them; the
byte formulas come from the method registry, so a user's method is drawn like a built-in
one. Pure (pandas + plotly). Re-exported by :mod:`gtopk_lab.plotting.figures`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from gtopk_lab.analysis.intervals import add_intervals, interval_bounds, interval_note
from gtopk_lab.analysis.predict import formula_of
from gtopk_lab.methods import display_order, get_method
from gtopk_lab.plotting.figures_base import method_color, method_rank, require_frame

__all__ = ["PAPER_SCALING_EFFICIENCY_32_1GBE", "PAPER_BREAKDOWN_GTOPK_32_1GBE_S", "paper_scaling_table",
           "scaling_efficiency_figure", "time_breakdown_figure", "comm_bytes_per_rank_formula",
           "comm_volume_figure"]

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

_BREAKDOWN_PARTS: tuple[tuple[str, str], ...] = (
    ("compute", "compute_s"),
    ("selection", "selection_s"),
    ("communication", "comm_s"),
    ("update", "update_s"),
)
_BREAKDOWN_COLORS = {"compute": "#636EFA", "selection": "#FFA15A", "communication": "#EF553B",
                     "update": "#00CC96"}


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
    ``bandwidth``), solid lines with markers; several rows of one (method, P, bandwidth), e.g.
    one per seed, are averaged and drawn with error bars of their 95% Student-t confidence
    interval (:func:`~gtopk_lab.analysis.intervals.add_intervals`; columns
    ``scaling_efficiency_ci_low`` / ``_high`` given with the rows are drawn as they are).
    ``predicted``: the alpha-beta model's
    prediction in the same schema, dashed lines in the method's colour. ``paper_models``
    adds the paper's 32-worker 1 GbE points (:data:`PAPER_SCALING_EFFICIENCY_32_1GBE`)
    as open reference markers. ``time_basis`` ("virtual" | "wall") only labels the axis:
    which clock the throughputs were measured on.
    """
    if time_basis not in ("virtual", "wall"):
        raise ValueError(f"time_basis={time_basis!r} is invalid: expected 'virtual' or 'wall'")
    require_frame("measured", measured, ("method", "workers", "scaling_efficiency"))
    if predicted is not None:
        require_frame("predicted", predicted, ("method", "workers", "scaling_efficiency"))
    unknown = [m for m in paper_models if m not in PAPER_SCALING_EFFICIENCY_32_1GBE]
    if unknown:
        raise ValueError(f"paper_models={unknown!r} is invalid: expected names from "
                         f"{', '.join(PAPER_SCALING_EFFICIENCY_32_1GBE)}")
    fig = go.Figure()
    seeds = 1
    for frame, kind in ((measured, "measured"), (predicted, "model")):
        if frame is None or not len(frame):
            continue
        keys = ["method", "bandwidth"] if "bandwidth" in frame.columns else ["method"]
        for key, rows in frame.groupby(keys, sort=False):
            key = key if isinstance(key, tuple) else (key,)
            method = str(key[0])
            name = f"{method} ({kind}{', ' + str(key[1]) if len(key) > 1 else ''})"
            rows, error = _with_intervals(rows.sort_values("workers")) if kind == "measured" else (rows, None)
            if error is not None:
                seeds = max(seeds, int(rows["n"].max()))
            fig.add_trace(go.Scatter(
                x=rows["workers"].to_numpy(), y=rows["scaling_efficiency"].to_numpy(),
                mode="lines+markers" if kind == "measured" else "lines", name=name,
                legendgroup=method, error_y=error,
                line=dict(color=method_color(method), dash="solid" if kind == "measured" else "dash"),
                hovertemplate=f"{name}<br>P=%{{x}}<br>efficiency=%{{y:.1%}}<extra></extra>"))
    symbols = ("circle-open", "square-open", "diamond-open", "triangle-up-open", "x-open")
    for i, model in enumerate(paper_models):
        for method, eff in PAPER_SCALING_EFFICIENCY_32_1GBE[model].items():
            fig.add_trace(go.Scatter(
                x=[32], y=[eff], mode="markers", name=f"paper {model}: {method}", legendgroup=method,
                marker=dict(symbol=symbols[i % len(symbols)], size=11, color=method_color(method),
                            line=dict(width=2)),
                hovertemplate=f"paper, 32 workers, 1 GbE<br>{model}<br>{method}: %{{y:.2%}}<extra></extra>"))
    fig.update_xaxes(title_text="workers P", type="log", dtick=math.log10(2))
    fig.update_yaxes(title_text=f"scaling efficiency ({time_basis} time)", tickformat=".0%",
                     rangemode="tozero")
    note = f"<br><sup>{interval_note(seeds, short=True)}</sup>" if seeds > 1 else ""
    fig.update_layout(title=(title or f"Scaling efficiency ({time_basis} time); dashed: alpha-beta model") + note,
                      template="plotly_white", height=450)
    return fig


def _with_intervals(rows: pd.DataFrame) -> tuple[pd.DataFrame, dict | None]:
    """One row per P (the mean over its rows) and plotly's ``error_y`` of the interval, or
    None when no P has two rows and none came with an interval."""
    if {"scaling_efficiency_ci_low", "scaling_efficiency_ci_high"} <= set(rows.columns):
        table = rows.assign(n=rows["n"] if "n" in rows.columns else 2)
    elif rows["workers"].duplicated().any():
        table = add_intervals(rows, ["workers"], "scaling_efficiency").rename(
            columns={"scaling_efficiency_mean": "scaling_efficiency"})
    else:
        return rows, None
    up, down = interval_bounds(table["scaling_efficiency"], table["scaling_efficiency_ci_low"],
                               table["scaling_efficiency_ci_high"])
    return table, {"type": "data", "symmetric": False, "array": up, "arrayminus": down, "visible": True}


# --- time breakdown ----------------------------------------------------------------------
def _breakdown_frame(summaries: pd.DataFrame) -> pd.DataFrame:
    """Mean seconds per iteration of each part, one row per (method, workers)."""
    require_frame("summaries", summaries, ("method", "workers"))
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
    frame = frame.sort_values(["workers", "method"], key=lambda c: c.map(method_rank) if c.name == "method" else c)
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
                                algorithm: str = "butterfly", pair_bytes: int = 8,
                                formula: Mapping[str, Any] | None = None) -> float:
    """Bytes one rank sends per iteration, from the method's collective in the registry.

    (Dense ring allreduce ``2 (P-1)/P * 4 d``; allgather ``(P-1) k m``; gTop-k butterfly
    ``log2(P) k m`` at power-of-two P, tree ``2 (P-1)/P k m``; Ok-Topk ``2k (P-1)/P m``: see
    :mod:`gtopk_lab.methods.formulas`.) ``pair_bytes`` is 8 (fp32 value + int32 index) or 12
    with int64 indices. ``formula``: what the method's formula needs beyond the model size (a
    run summary's ``comm_formula``: PowerSGD's layout; ``ValueError`` without it). O(1).
    """
    if workers < 1:
        raise ValueError(f"workers={workers!r} is invalid: expected an integer >= 1")
    return float(get_method(method).predicted_bytes_per_rank(numel, k, int(workers), pair_bytes, algorithm,
                                                             **dict(formula or {})))


def comm_volume_figure(summaries: pd.DataFrame, numel: int | None = None, k: int | None = None,
                       algorithm: str = "butterfly", title: str | None = None) -> go.Figure:
    """Bytes sent per rank per iteration vs P (log-log): measured markers, formula lines.

    Measured: the summaries' ``bytes_sent_per_rank_per_iter``. Formula:
    :func:`comm_bytes_per_rank_formula` for P = 1..max P, with ``numel``/``k`` taken from
    the summaries (one model) unless given, and what else a method's formula needs from
    their ``comm_formula`` (PowerSGD's layout); a method whose runs lack it gets its
    markers without a formula line.
    """
    require_frame("summaries", summaries, ("method", "workers", "bytes_sent_per_rank_per_iter"))
    fig = go.Figure()
    if not len(summaries):
        return fig
    max_p = int(summaries["workers"].max())
    grid = [p for p in (2 ** i for i in range(0, 12)) if p <= max(max_p, 2)]
    if max_p not in grid:
        grid.append(max_p)
    for method, rows in sorted(summaries.groupby("method"), key=lambda t: display_order(str(t[0]))):
        method = str(method)
        agg = rows.groupby("workers")["bytes_sent_per_rank_per_iter"].mean().reset_index()
        agg = agg[agg["workers"] > 1]
        fig.add_trace(go.Scatter(x=agg["workers"], y=agg["bytes_sent_per_rank_per_iter"], mode="markers",
                                 name=f"{method} (measured)", legendgroup=method,
                                 marker=dict(color=method_color(method), size=10),
                                 hovertemplate=f"{method}<br>P=%{{x}}<br>%{{y:.3s}}B<extra></extra>"))
        d = numel if numel is not None else (int(rows["numel"].iloc[0]) if "numel" in rows.columns else None)
        kk = k if k is not None else (int(rows["k"].iloc[0]) if "k" in rows.columns else None)
        if d is None or kk is None:
            continue
        algo = algorithm
        if "algorithm" in rows.columns and pd.notna(rows["algorithm"].iloc[0]):
            algo = str(rows["algorithm"].iloc[0])
        ps = [p for p in sorted(grid) if p > 1]
        try:
            ys = [comm_bytes_per_rank_formula(method, p, d, kk, algo, formula=formula_of(rows.get("comm_formula")))
                  for p in ps]
        except ValueError:  # a formula that needs what these runs lack (PowerSGD's layout, older runs)
            continue
        fig.add_trace(go.Scatter(x=ps, y=ys, mode="lines", name=f"{method} (formula)", legendgroup=method,
                                 line=dict(color=method_color(method), dash="dash"),
                                 hovertemplate=f"{method} formula<br>P=%{{x}}<br>%{{y:.3s}}B<extra></extra>"))
    fig.update_xaxes(title_text="workers P", type="log", dtick=math.log10(2))
    fig.update_yaxes(title_text="bytes sent per rank per iteration", type="log")
    fig.update_layout(title=title or "Communication volume per rank: measured vs formula",
                      template="plotly_white", height=420)
    return fig
