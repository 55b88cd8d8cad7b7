#!/usr/bin/env python3
"""gTop-k butterfly vs tree per rank, torch merge path vs compiled merge path, in one run.

Issue 18 item 2 asks for the butterfly to be at least as fast as the tree per rank. On a
2-core box a call's wall time at P = 4 measures the scheduler (four ranks, two cores), so
the figures that decide it are the critical path per call:

- ``max thread``: the slowest rank's thread CPU (median over profiled calls);
- ``virtual``: the slowest rank's alpha-beta time of its rounds on 10GbE plus its merge
  CPU, as the training clock charges a call (``VirtualClock(include_merge_cpu=True)``);

both from the profile mode of ``gtopk-lab bench collectives``
(:func:`gtopk_lab.bench.collective_calls.bench_collectives`), printed beside the call's
wall time (slowest rank, median of the timed calls) and the mean merge CPU per rank.

Algorithm: for ``--rounds`` rounds, run the benchmark once with ``GTOPK_LAB_FAST_MERGE=0``
("torch": the vectorised merge and sort every release before this one ran) and once
without ("numba": :mod:`gtopk_lab.compression.fast_merge`), alternating so that machine
load hits both alike; report per (P, numel, algorithm, path) the median over rounds.
Both paths compute bitwise the same results (tests/test_fast_merge.py).

Example::

    .venv/bin/python benchmarks/butterfly_vs_tree.py --workers 2,4 --numel 1M,25M --rounds 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gtopk_lab.bench.collective_calls import bench_collectives  # noqa: E402
from gtopk_lab.bench.tables import fmt_count  # noqa: E402
from gtopk_lab.bench.timing import host_cores  # noqa: E402
from gtopk_lab.compression.fast_merge import FAST_MERGE_ENV, HAVE_NUMBA, warm_up  # noqa: E402
from gtopk_lab.counts import parse_count_list  # noqa: E402

PATHS = (("torch", "0"), ("numba", "1"))


def one_run(workers: list[int], numels: list[int], density: float, repeats: int, flag: str
            ) -> dict[tuple[int, int, str], dict[str, float]]:
    """One benchmark with ``$GTOPK_LAB_FAST_MERGE=flag``: per (P, numel, algorithm) the figures."""
    os.environ[FAST_MERGE_ENV] = flag  # run_gloo's ranks adopt the caller's environment
    rows = bench_collectives(workers, numels, density, repeats, profile_repeats=repeats)
    out = {}
    for r in rows:
        if r["collective"] != "gtopk_allreduce":
            continue
        prof = r["profile"]
        out[(r["workers"], r["numel"], r["algorithm"])] = {
            "wall": r["median_s"], "max_thread": prof["thread_cpu_max_s"], "virtual": prof["virtual_s"],
            "thread": prof["thread_cpu_mean_s"], "merge_cpu": prof["phases_cpu_mean_s"]["merge"]}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--numel", default="1M,25M")
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--repeats", type=int, default=5, help="timed and profiled calls per case (default 5)")
    parser.add_argument("--rounds", type=int, default=2, help="alternations torch/numba (default 2)")
    args = parser.parse_args(argv)
    try:
        workers, numels = parse_count_list(args.workers, "--workers"), parse_count_list(args.numel, "--numel")
        if args.rounds < 1 or args.repeats < 1:
            raise ValueError(f"--rounds={args.rounds!r}/--repeats={args.repeats!r} is invalid: expected >= 1")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not HAVE_NUMBA:
        print("skipped: numba is not installed, so there is only the torch path")
        return 0
    warm_up()  # compile once here, not in every rank
    runs: dict[str, list[dict]] = {name: [] for name, _ in PATHS}
    for _ in range(args.rounds):
        for name, flag in PATHS:
            runs[name].append(one_run(workers, numels, args.density, args.repeats, flag))
    os.environ.pop(FAST_MERGE_ENV, None)
    cores = host_cores()
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"# gtopk_allreduce (exact-k, gloo on 127.0.0.1), density {args.density}; ms per call, "
          f"median over {args.rounds} alternating rounds of: wall = slowest rank, median of "
          f"{args.repeats} timed calls; max thread / virtual (10GbE + merge CPU) = slowest rank, "
          f"median of {args.repeats} profiled calls; thread, merge cpu = mean over ranks")
    print(f"# host: {cores} cores, load average {load} at end"
          + (f"; up to {max(workers)} ranks share them (wall includes waiting for a core)"
             if max(workers) > cores else ""))
    keys = ("wall", "max_thread", "virtual", "thread", "merge_cpu")
    print(f"{'P':>3} {'numel':>6} {'algorithm':<9} {'path':<6} " + " ".join(f"{k:>10}" for k in keys))
    table: dict[tuple, dict[str, float]] = {}
    for key in runs["torch"][0]:
        for name, _ in PATHS:
            med = {k: statistics.median(run[key][k] for run in runs[name]) for k in keys}
            table[(*key, name)] = med
            p, n, alg = key
            print(f"{p:>3} {fmt_count(n):>6} {alg:<9} {name:<6} "
                  + " ".join(f"{med[k] * 1e3:>10.3f}" for k in keys))
    print("# butterfly / tree (max thread, virtual) per path; < 1 = butterfly faster per rank")
    for p in workers:
        for n in numels:
            cells = []
            for name, _ in PATHS:
                b, t = table[(p, n, "butterfly", name)], table[(p, n, "tree", name)]
                cells.append(f"{name}: {b['max_thread'] / t['max_thread']:.2f}, {b['virtual'] / t['virtual']:.2f}")
            print(f"{p:>3} {fmt_count(n):>6} " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
