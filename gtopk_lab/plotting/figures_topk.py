"""Top-k operator figures (Shi et al., arXiv:1911.08772): gradient histogram with its
Gaussian fit, Top-k error vs density against its bounds, GaussianK's selected count.

Inputs are raw value vectors (numpy arrays or torch tensors, read without importing
torch) and the small tables these functions build. Pure (numpy, scipy, pandas, plotly).
Re-exported by :mod:`gtopk_lab.plotting.figures`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from scipy.special import ndtri

from gtopk_lab.plotting.figures_base import FALLBACK_COLORS, require_frame

__all__ = ["gradient_histogram_figure", "topk_error_table", "topk_error_figure", "gaussiank_count_figure"]


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
    require_frame("table", table, ("k_over_d", "relative_error"))
    fig = go.Figure()
    for i, (label, rows) in enumerate(_rows_per_label(table, "k_over_d")):
        fig.add_trace(go.Scatter(x=rows["k_over_d"], y=rows["relative_error"], mode="lines+markers",
                                 name=f"measured {label}".strip(),
                                 line=dict(color=FALLBACK_COLORS[i % len(FALLBACK_COLORS)]
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
    require_frame("table", table, ("k", "selected"))
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
                                 marker=dict(color="#AB63FA" if i == 0 else FALLBACK_COLORS[i % 5])))
    fig.update_xaxes(title_text="requested k", type="log")
    fig.update_yaxes(title_text="entries selected", type="log")
    fig.update_layout(title=title or "GaussianK: selected count vs k", template="plotly_white", height=420)
    return fig
