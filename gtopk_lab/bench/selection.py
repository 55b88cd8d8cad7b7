"""Selection benchmark: torch.topk versus every registered selector, on one thread.

For one ``numel``: the median time of each selector on a N(0,1) vector (seed 0), the
count it selected and its speed-up over ``torch.topk``, with ``x.sum()`` (one read pass)
and ``x.abs().sum()`` timed beside them as the memory-bandwidth references. One thread,
because the training ranks run selection with one intra-op thread each.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from gtopk_lab.compression.selection import available_selectors, get_selector
from gtopk_lab.config import k_for

__all__ = ["bench_selection"]


def bench_selection(numel: int, density: float, repeats: int) -> list[dict[str, Any]]:
    """Median single-thread time of each selector on N(0,1) of ``numel`` elements."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(0))
        k = k_for(numel, density)
        rows = []
        # references: x.sum() is one read pass; x.abs().sum() also writes and re-reads a
        # temporary of numel elements (and pays its page faults)
        ref: dict[str, list[float]] = {"sum": [], "abs_sum": []}
        for _ in range(repeats + 1):
            for key, fn in (("sum", torch.sum), ("abs_sum", lambda t: t.abs().sum())):
                t0 = time.perf_counter()
                fn(x)
                ref[key].append(time.perf_counter() - t0)
        one_pass_s = statistics.median(ref["sum"][1:])
        abs_sum_s = statistics.median(ref["abs_sum"][1:])
        for name in available_selectors():
            sel = get_selector(name)
            sel(x, k)  # warm-up
            times, count = [], 0
            for _ in range(repeats):
                t0 = time.perf_counter()
                _, idx = sel(x, k)
                times.append(time.perf_counter() - t0)
                count = idx.numel()
            rows.append({"selector": name, "numel": numel, "k": k, "count": count,
                         "median_s": statistics.median(times), "one_pass_s": one_pass_s,
                         "abs_sum_s": abs_sum_s})
        base = next(r["median_s"] for r in rows if r["selector"] == "topk")
        for r in rows:
            r["speedup_vs_topk"] = base / r["median_s"]
        return rows
    finally:
        torch.set_num_threads(threads)
