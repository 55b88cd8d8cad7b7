#!/usr/bin/env python3
"""Every row's top-k of a ``[P, d]`` matrix: the compiled row kernel against ``torch.topk``.

The simulator's batched steps select the top k of each of P ranks' compensated gradients
(:func:`gtopk_lab.training.batched_step.batched_topk`). This times, call by call in turn on
the same matrix so that the machine's noise hits both alike, on one thread:

- ``torch.topk``: ``torch.topk(x.abs(), k, dim=1, sorted=False)`` (what batched_topk ran
  before, and still runs on the rows the kernel flags);
- ``rows``: :func:`gtopk_lab.compression.fast_topk_rows.numba_rows_topk`;
- ``batched_topk``: the kernel plus the fallback and the dtype conversion, as the simulator
  calls it.

Rows are x ~ N(0, 1) scaled per row (1e-3 .. 1e3), and the kernel's sets are checked against
``torch.topk``'s on every row it does not flag. Example::

    PYTHONPATH=. .venv/bin/python benchmarks/rows_topk.py --shapes 64x5710x57,256x5710x57,8x235000x2350
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gtopk_lab.bench.selection import cpu_model  # noqa: E402
from gtopk_lab.compression.fast_topk_rows import numba_rows_topk  # noqa: E402
from gtopk_lab.provenance import git_commit  # noqa: E402
from gtopk_lab.training.batched_step import batched_topk  # noqa: E402


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for part in text.split(","):
        try:
            p, d, k = (int(v) for v in part.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes: {part!r} is invalid: expected PxDxK, e.g. 64x5710x57") from None
        if not (p >= 1 and 1 <= k < d):
            raise SystemExit(f"--shapes: {part!r} is invalid: expected P >= 1 and 1 <= K < D")
        shapes.append((p, d, k))
    return shapes


def interleaved_ms(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median ms per call of each callable, timed one call of each in turn."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():  # warm: compilation, caches
        fn()
    for _ in range(repeats):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="64x5710x57,256x5710x57,8x235000x2350",
                        help="P x d x k, comma-separated (default: the MNIST-1D CNN at P = 64 and 256, "
                             "the wide CNN at P = 8, density 0.01)")
    parser.add_argument("--repeats", type=int, default=200, help="calls of each, in turn (default 200)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    torch.set_num_threads(1)
    print(f"# {cpu_model()}, {os.cpu_count()} cores, commit {(git_commit() or 'unknown')[:7]}, one torch thread, "
          f"median of {args.repeats} interleaved calls")
    print("| P | d | k | torch.topk ms | rows kernel ms | batched_topk ms | torch.topk / batched_topk | rows flagged |")
    print("|---|---|---|---|---|---|---|---|")
    for p, d, k in parse_shapes(args.shapes):
        gen = torch.Generator().manual_seed(p * d + k)
        x = torch.randn(p, d, generator=gen) * torch.logspace(-3, 3, p).unsqueeze(1)
        values, indices, ok = numba_rows_topk(x, k)
        own = torch.topk(x.abs(), k, dim=1, sorted=False).indices
        for r in torch.nonzero(ok).flatten().tolist():
            if not torch.equal(indices[r], own[r].sort().values):
                raise SystemExit(f"row {r} of {p}x{d}, k={k}: the kernel's set differs from torch.topk's")
        ms = interleaved_ms({"torch": lambda: torch.topk(x.abs(), k, dim=1, sorted=False),
                             "rows": lambda: numba_rows_topk(x, k),
                             "batched": lambda: batched_topk(x, k)}, args.repeats)
        print(f"| {p} | {d} | {k} | {ms['torch']:.3f} | {ms['rows']:.3f} | {ms['batched']:.3f} | "
              f"{ms['torch'] / ms['batched']:.2f}x | {int((~ok).sum())} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
