"""Selection benchmark: torch.topk versus every registered selector, on one thread.

For one ``numel``: the median time of each selector on a N(0,1) vector (seed 0), the
count it selected, its speed-up over ``torch.topk`` and its cost in read passes: the
selector's median over the median of ``x.sum()`` (one read pass of x) timed just before
each of its calls, so both see the same machine load. ``x.abs().sum()`` is timed once
beside them. One thread, because the training ranks run selection with one intra-op
thread each. :func:`cpu_model` names the CPU the figures belong to.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from gtopk_lab.compression.selection import available_selectors, get_selector
from gtopk_lab.config import k_for
from gtopk_lab.provenance import cpu_model

__all__ = ["bench_selection", "cpu_model"]


def _timed(fn: Any, *args: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def bench_selection(numel: int, density: float, repeats: int) -> list[dict[str, Any]]:
    """Median single-thread time of each selector on N(0,1) of ``numel`` elements, and its
    cost in read passes (``passes``; see the module docstring)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(0))
        k = k_for(numel, density)
        # x.abs().sum() also writes and re-reads a temporary of numel elements (and pays its
        # page faults): no one-pass reference, printed for comparison only
        abs_sum_s = statistics.median(_timed(lambda t: t.abs().sum(), x)[0] for _ in range(repeats + 1))
        rows = []
        for name in available_selectors():
            sel = get_selector(name)
            sel(x, k)  # warm-up
            times, sums, count = [], [], 0
            for _ in range(repeats):
                sums.append(_timed(torch.sum, x)[0])
                elapsed, (_, idx) = _timed(sel, x, k)
                times.append(elapsed)
                count = idx.numel()
            median_s, one_pass_s = statistics.median(times), statistics.median(sums)
            rows.append({"selector": name, "numel": numel, "k": k, "count": count,
                         "median_s": median_s, "one_pass_s": one_pass_s,
                         "passes": median_s / one_pass_s, "abs_sum_s": abs_sum_s})
        base = next(r["median_s"] for r in rows if r["selector"] == "topk")
        for r in rows:
            r["speedup_vs_topk"] = base / r["median_s"]
        return rows
    finally:
        torch.set_num_threads(threads)
