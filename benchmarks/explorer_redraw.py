"""Redraw time of the what-if explorer (gtopk_lab.plotting.explorer): the issue's bound is
100 ms per slider change.

    .venv/bin/python benchmarks/explorer_redraw.py [--changes 50] [--repeats 3]

1. An ``Explorer`` with the stated default costs (no cluster, no front end: the kernel
   side of a redraw, which is what a slider change waits for; the browser's own plotly
   redraw follows the messages) showing 3 methods (dense, topk, gtopk) or every method
   of the registry.
2. ``--changes`` slider changes per control in turn: the density slider (log-spaced
   values), the P slider, the latency slider, the link (presets in turn); each change
   is one redraw (``Explorer.redraw``: predict every shown method over P = 1 ... 1024,
   update both FigureWidgets in one batch each, send their state).
3. The median and the 90th percentile of ``Explorer.last_redraw_s`` per (methods,
   control), and the time of a methods change (the traces rebuilt), repeated
   ``--repeats`` times (the median of the medians is printed).

Prints one table with the CPU model, the host's cores and the commit.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any, Callable

import numpy as np

from gtopk_lab.methods import available_methods
from gtopk_lab.network.model import PRESETS
from gtopk_lab.plotting.explorer import Explorer
from gtopk_lab.plotting.explorer_model import WORKERS
from gtopk_lab.provenance import cpu_model, short_commit


def _changes(explorer: Explorer, n: int) -> dict[str, Callable[[int], Any]]:
    densities = np.logspace(-4, -1, n)
    latencies = np.logspace(0, 4, n)
    presets = [p for p in PRESETS if p != "none"]

    def set_density(i: int) -> None:
        explorer.density.value = float(densities[i])

    def set_workers(i: int) -> None:
        explorer.workers.value = WORKERS[i % len(WORKERS)] if WORKERS[i % len(WORKERS)] != explorer.workers.value \
            else WORKERS[(i + 1) % len(WORKERS)]

    def set_latency(i: int) -> None:
        explorer.latency.value = float(latencies[i])

    def set_link(i: int) -> None:
        choices = [p for p in presets if p != explorer.link.value]
        explorer.link.value = choices[i % len(choices)]

    return {"density": set_density, "P": set_workers, "latency": set_latency, "link": set_link}


def measure(methods: tuple[str, ...], n: int) -> dict[str, tuple[float, float]]:
    """{control: (median, p90) seconds per redraw} over ``n`` changes of each control."""
    explorer = Explorer(methods=methods)
    out: dict[str, tuple[float, float]] = {}
    for name, change in _changes(explorer, n).items():
        times = []
        for i in range(n):
            before = explorer.redraws
            change(i)
            assert explorer.redraws == before + 1, f"{name} change {i} did not redraw once"
            times.append(explorer.last_redraw_s)
        out[name] = (statistics.median(times), float(np.percentile(times, 90)))
    rebuild = []
    for i in range(max(3, n // 5)):
        explorer.methods.value = methods[: 1 + (i % len(methods))] if i % 2 else methods
        rebuild.append(explorer.last_redraw_s)
    out["methods"] = (statistics.median(rebuild), float(np.percentile(rebuild, 90)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=50, help="slider changes per control (default 50)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats; medians of medians (default 3)")
    args = parser.parse_args()
    sets = {"3 (dense, topk, gtopk)": ("dense", "topk", "gtopk"),
            f"all {len(available_methods())}": tuple(available_methods())}
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores), commit {short_commit()}, "
          f"{args.changes} changes per control, {args.repeats} repeat(s)")
    print(f"{'methods':<24}{'control':<10}{'median ms':>11}{'p90 ms':>9}")
    worst = 0.0
    for label, methods in sets.items():
        runs = [measure(methods, args.changes) for _ in range(args.repeats)]
        for control in runs[0]:
            median = statistics.median(r[control][0] for r in runs) * 1e3
            p90 = statistics.median(r[control][1] for r in runs) * 1e3
            worst = max(worst, median)
            print(f"{label:<24}{control:<10}{median:>11.1f}{p90:>9.1f}")
    print(f"largest median: {worst:.1f} ms per redraw (bound: 100 ms)")


if __name__ == "__main__":
    main()
