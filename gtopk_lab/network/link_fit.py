"""Fits of a link's one-way message time from a ping-pong: Hockney's line, and one with a shaper's burst.

:func:`fit_alpha_beta`: weighted least squares ``t(n) = alpha + beta * n`` (weights ``1 / t``:
relative error, so the small sizes still pin down alpha). :func:`fit_alpha_beta_burst`:
``t(n) = alpha + beta * max(0, n - B)`` where the sizes show a token-bucket shaper's kink
(``gtopk_lab.network.tcp_terms.TcpTerms.burst_bytes``), else the line. Both keep every constant
>= 0 and are exact on noiseless data (the burst up to its grid's step).

Worker-side module: standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["BURST_GAIN", "BURST_SIDE_POINTS", "LINE_MISS_RMS", "MISSED_LINE_GAIN", "fit_alpha_beta",
           "fit_alpha_beta_burst"]


#: a burst must cut the weighted squared residual of the straight-line fit by this factor
BURST_GAIN = 4.0
#: and have at least this many of the (distinct) sizes on each side of it
BURST_SIDE_POINTS = 2
#: a straight line whose root-mean-square relative residual exceeds this misses the link (noise
#: of a ping-pong's medians is a few per cent: lines through +-6-10% noise read 5-10%)
LINE_MISS_RMS = 0.15
#: and then a kink that cuts its weighted squared residual by this factor is taken: the 2026-12-08
#: testbed's 50 Mbit/s port read 1K-16K messages at 64-93 Mbit/s and 1M-4M at 47, so the line
#: (through the origin) priced 4 MB 28% fast and a kink at 3 kB cut the residual 3.7x
MISSED_LINE_GAIN = 2.0


def _weighted_sse(sizes: Sequence[float], times: Sequence[float], alpha: float, beta: float) -> float:
    return sum(((alpha + beta * n - t) / t) ** 2 for n, t in zip(sizes, times))


def fit_alpha_beta_burst(sizes_bytes: Sequence[float], times_s: Sequence[float]) -> tuple[float, float, float]:
    """``(alpha_s, beta_s_per_byte, burst_bytes)`` of ``t = alpha + beta * max(0, n - B)``: a link
    whose shaper lets the first B bytes of a message out at line rate (``TcpTerms.burst_bytes``).

    1. The straight line (:func:`fit_alpha_beta`, relative weights) and its weighted squared
       residual S0.
    2. For candidate kinks B on a geometric grid (64 per decade) between the sizes, with at
       least :data:`BURST_SIDE_POINTS` distinct sizes at or below B and as many above: the same
       fit of ``t`` on ``max(0, n - B)``, its residual S(B).
    3. The B of the smallest S(B) if ``S(B) * BURST_GAIN <= S0`` (a clear kink, not noise that a
       third constant always absorbs), or ``S(B) * MISSED_LINE_GAIN <= S0`` where the line
       misses the sizes by more than :data:`LINE_MISS_RMS` (root mean square of its relative
       residuals: no noise makes a line miss by that much, and a line through a shaper's
       gradual bend prices its large messages tens of per cent fast); else B = 0 and step 1's
       line. Exact on noiseless data of either shape up to the grid's step. Cost: O(sizes x grid).
    """
    alpha, beta = fit_alpha_beta(sizes_bytes, times_s)
    n = [float(x) for x in sizes_bytes]
    t = [float(y) for y in times_s]
    best = (_weighted_sse(n, t, alpha, beta), alpha, beta, 0.0)
    distinct = sorted(set(n))
    if len(distinct) < 2 * BURST_SIDE_POINTS:
        return alpha, beta, 0.0
    low, high = distinct[BURST_SIDE_POINTS - 1], distinct[-BURST_SIDE_POINTS]
    steps = int(64 * math.log10(high / low)) if high > low else 0
    missed = math.sqrt(best[0] / len(n)) > LINE_MISS_RMS
    threshold = best[0] / (MISSED_LINE_GAIN if missed else BURST_GAIN)
    for i in range(steps + 1):
        b = low * (high / low) ** (i / max(steps, 1))
        if b >= high:
            break
        shifted = [max(0.0, x - b) for x in n]
        if len(set(shifted)) < 2:
            continue
        a_b, beta_b = fit_alpha_beta(shifted, t)
        sse = _weighted_sse(shifted, t, a_b, beta_b)
        if sse <= threshold and sse < best[0]:
            best = (sse, a_b, beta_b, b)
    return best[1], best[2], best[3]


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float],
                   weighted: bool = True) -> tuple[float, float]:
    """Least-squares fit of ``t = alpha + beta * n``; returns ``(alpha_s, beta_s_per_byte)``.

    With ``weighted`` each point has weight ``1 / t`` (minimises relative error). Both
    constants are kept >= 0: a negative alpha refits through the origin, a negative beta
    refits a constant. Exact on noiseless data. O(len(sizes)).
    """
    if len(sizes_bytes) != len(times_s) or len(sizes_bytes) < 2:
        raise ValueError(f"got {len(sizes_bytes)} sizes and {len(times_s)} times: expected equal lengths >= 2")
    n = [float(x) for x in sizes_bytes]
    t = [float(y) for y in times_s]
    if any(not (v > 0 and math.isfinite(v)) for v in t):
        raise ValueError(f"times_s={t!r} is invalid: expected finite times > 0")
    if len(set(n)) < 2:
        raise ValueError(f"sizes_bytes={n!r} is invalid: need at least two distinct sizes")
    w = [1.0 / (y * y) if weighted else 1.0 for y in t]  # squared weights of the residuals
    sw = sum(w)
    swn = sum(wi * ni for wi, ni in zip(w, n))
    swt = sum(wi * ti for wi, ti in zip(w, t))
    swnn = sum(wi * ni * ni for wi, ni in zip(w, n))
    swnt = sum(wi * ni * ti for wi, ni, ti in zip(w, n, t))
    det = sw * swnn - swn * swn
    beta = (sw * swnt - swn * swt) / det
    alpha = (swt - beta * swn) / sw
    if beta < 0:
        return swt / sw, 0.0
    if alpha < 0:
        return 0.0, max(0.0, swnt / swnn)
    return alpha, beta
