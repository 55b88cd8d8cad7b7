"""Confidence intervals over seeds: the mean with a two-sided Student-t interval.

What researchers publish for a quantity measured once per seed (efficiency, final accuracy,
time to accuracy): the sample mean and a 95% confidence interval for the true mean,

    mean +- t_{(1 + c) / 2, n - 1} * s / sqrt(n)

with ``s`` the sample standard deviation (ddof = 1) of the n seeds and ``t`` the quantile
of Student's t with n - 1 degrees of freedom (``scipy.stats.t.ppf``). The interval assumes
the seeds are independent draws of a roughly normal quantity; with few seeds it is wide,
which is the point.

1. :func:`t_interval`: one sample -> :class:`Interval` (mean, low, high, n, std). Missing
   values (NaN) are dropped first; with n = 1 there is no interval (low = high = NaN,
   stated by :data:`ONE_SEED_NOTE`); with n = 0 everything is NaN.
2. :func:`add_intervals`: per group of a frame, ``<prefix>_mean``, ``<prefix>_std``,
   ``<prefix>_ci_low``, ``<prefix>_ci_high``, ``n`` (the tables' columns, e.g.
   ``efficiency_ci_low`` / ``efficiency_ci_high``).
3. :func:`interval_columns`: the same from per-group mean, std and n columns at once (the
   bands of convergence figures: one interval per iteration)
4. :func:`interval_note`: the sentence a figure or table states about its intervals.

Cost: O(n) per sample, one ``t.ppf`` call per distinct n. Pure (numpy, pandas, scipy).

Example::

    t_interval([0.81, 0.84, 0.86])          # Interval(mean=0.837, low=0.775, high=0.899, n=3, ...)
    add_intervals(runs, ["method", "workers"], "efficiency_virtual", prefix="efficiency")
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

__all__ = ["CONFIDENCE", "ONE_SEED_NOTE", "Interval", "t_interval", "add_intervals", "interval_note",
           "interval_bounds", "interval_columns"]

#: The level every figure and table uses unless told otherwise.
CONFIDENCE = 0.95
#: What a figure or table says where a point has a single seed.
ONE_SEED_NOTE = "one seed: no confidence interval"


@dataclass(frozen=True)
class Interval:
    """Mean and its two-sided Student-t confidence interval over ``n`` values."""

    mean: float
    low: float
    high: float
    n: int
    std: float
    confidence: float = CONFIDENCE

    @property
    def half_width(self) -> float:
        """``high - mean`` (NaN without an interval)."""
        return self.high - self.mean


def _check_confidence(confidence: float) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} is invalid: expected a fraction in (0, 1), e.g. 0.95")
    return float(confidence)


@lru_cache(maxsize=256)
def _t_quantile(confidence: float, n: int) -> float:
    # imported here: scipy.stats costs ~1 s of imports, which every CLI command and notebook
    # kernel importing the analysis package would pay before any interval is asked for
    from scipy import stats

    return float(stats.t.ppf((1.0 + confidence) / 2.0, n - 1))


def t_interval(values: Iterable[float], confidence: float = CONFIDENCE) -> Interval:
    """Step 1: the mean of ``values`` (NaN dropped) with its Student-t interval."""
    confidence = _check_confidence(confidence)
    sample = np.asarray([float(v) for v in values], dtype=float)
    sample = sample[~np.isnan(sample)]
    n = int(sample.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, math.nan, confidence)
    mean = float(sample.mean())
    if n == 1:
        return Interval(mean, math.nan, math.nan, 1, math.nan, confidence)
    std = float(sample.std(ddof=1))
    half = _t_quantile(confidence, n) * std / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, std, confidence)


def add_intervals(frame: pd.DataFrame, by: Sequence[str], value: str, *, prefix: str | None = None,
                  confidence: float = CONFIDENCE) -> pd.DataFrame:
    """Step 2: one row per group of ``by`` (NaN keys kept): ``<prefix>_mean``, ``_std``,
    ``_ci_low``, ``_ci_high`` and ``n`` (values present) of column ``value``."""
    confidence = _check_confidence(confidence)
    name = prefix or value
    missing = [c for c in [*by, value] if c not in frame.columns]
    if missing:
        raise ValueError(f"frame has no column {missing[0]!r}: expected the columns {[*by, value]}")
    columns = [*by, f"{name}_mean", f"{name}_std", f"{name}_ci_low", f"{name}_ci_high", "n"]
    rows = []
    values = pd.to_numeric(frame[value], errors="coerce")
    for key, group in values.groupby([frame[c] for c in by], dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        ci = t_interval(group, confidence)
        rows.append([*key, ci.mean, ci.std, ci.low, ci.high, ci.n])
    return pd.DataFrame(rows, columns=columns)


def interval_columns(mean: pd.Series, std: pd.Series, n: pd.Series, confidence: float = CONFIDENCE
                     ) -> tuple[pd.Series, pd.Series]:
    """Step 3: (low, high) per row from its ``mean``, sample ``std`` (ddof = 1) and ``n``;
    NaN where n < 2."""
    confidence = _check_confidence(confidence)
    count = pd.to_numeric(n, errors="coerce").fillna(0).astype(int)
    quantile = count.map(lambda m: _t_quantile(confidence, int(m)) if m > 1 else math.nan).astype(float)
    half = quantile * pd.to_numeric(std, errors="coerce") / np.sqrt(count.where(count > 0, 1))
    return mean - half, mean + half


def interval_bounds(mean: pd.Series, low: pd.Series, high: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(distance up, distance down) from ``mean`` to the interval's ends, 0 where there is
    no interval: plotly's asymmetric ``error_y`` arrays."""
    up = (pd.to_numeric(high, errors="coerce") - pd.to_numeric(mean, errors="coerce")).fillna(0.0)
    down = (pd.to_numeric(mean, errors="coerce") - pd.to_numeric(low, errors="coerce")).fillna(0.0)
    return up.to_numpy(dtype=float), down.to_numpy(dtype=float)


def interval_note(n_max: int, confidence: float = CONFIDENCE, short: bool = False) -> str:
    """Step 4: "error bars and bands: 95% Student-t confidence interval of the mean over
    seeds (n up to 3); ...", or :data:`ONE_SEED_NOTE` when no point has two seeds;
    ``short``: "95% CI over seeds (Student t, n <= 3)", for a figure's subtitle."""
    if n_max < 2:
        return ONE_SEED_NOTE
    if short:
        return f"{100 * confidence:g}% CI over seeds (Student t, n ≤ {n_max})"
    return (f"error bars and bands: {100 * confidence:g}% Student-t confidence interval of the mean "
            f"over seeds (n up to {n_max}); a point with one seed has none")
