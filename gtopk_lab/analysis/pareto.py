"""The Pareto frontier of runs: which runs no other run beats on both axes at once.

A run ``j`` *dominates* run ``i`` when it is at least as good on both objectives and
strictly better on one (e.g. fewer bytes sent per rank and a higher final accuracy). The
frontier is the set of runs nobody dominates; identical points do not dominate each
other, so duplicates on the frontier all stay on it.

:func:`pareto_front` in O(n log n):

1. turn both objectives into "lower is better" (negate those where higher is better);
   points with a NaN coordinate are never on the frontier
2. sort by the first objective, then the second
3. sweep groups of equal first objective in that order, keeping ``best``, the smallest
   second objective of all earlier groups (strictly smaller first objective): a point is
   on the frontier iff its second objective is its group's minimum and below ``best``

:func:`frontier_points` returns the frontier of a frame sorted along the first axis, what a
figure draws as the frontier's line.

Example::

    mask = pareto_front(runs["bytes_sent_per_rank"], runs["final_test_accuracy"],
                        x_lower_better=True, y_higher_better=True)
    runs[mask]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

__all__ = ["pareto_front", "frontier_points"]


def pareto_front(x: Sequence[float] | np.ndarray | pd.Series, y: Sequence[float] | np.ndarray | pd.Series, *,
                 x_lower_better: bool = True, y_higher_better: bool = True) -> np.ndarray:
    """Boolean mask (one entry per point, input order): True where no other point
    dominates it (module docstring, steps 1-3). ``ValueError`` when x and y differ in length."""
    a = np.asarray(x, dtype=float)
    b = np.asarray(y, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"x and y have shapes {a.shape} and {b.shape}: expected two 1-d sequences of one length")
    a = a if x_lower_better else -a
    b = -b if y_higher_better else b
    mask = np.zeros(a.size, dtype=bool)
    valid = np.flatnonzero(~(np.isnan(a) | np.isnan(b)))
    if not valid.size:
        return mask
    order = valid[np.lexsort((b[valid], a[valid]))]
    best = np.inf
    start = 0
    while start < order.size:
        stop = start
        while stop < order.size and a[order[stop]] == a[order[start]]:
            stop += 1
        group = order[start:stop]
        low = b[group[0]]  # sorted by b within the group: its minimum
        if low < best:
            mask[group[b[group] == low]] = True
            best = low
        start = stop
    return mask


def frontier_points(frame: pd.DataFrame, x: str, y: str, *, x_lower_better: bool = True,
                    y_higher_better: bool = True) -> pd.DataFrame:
    """The rows of ``frame`` on the frontier of (``x``, ``y``), sorted by ``x``."""
    for col in (x, y):
        if col not in frame.columns:
            raise ValueError(f"frame has no column {col!r}: expected the columns {x!r} and {y!r}")
    mask = pareto_front(pd.to_numeric(frame[x], errors="coerce"), pd.to_numeric(frame[y], errors="coerce"),
                        x_lower_better=x_lower_better, y_higher_better=y_higher_better)
    return frame[mask].sort_values([x, y], kind="stable")
