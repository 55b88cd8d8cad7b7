#!/usr/bin/env python3
"""How fast is the gTop-k merge (2k -> k) on one CPU thread, and what made it so?

``merge_sparse`` adds the two operands' values at shared indices and keeps the k entries
of largest magnitude. Three implementations are timed side by side, call by call in
turn (so machine noise hits all alike), on canonical operands of k pairs each:

- ``merge_sparse``: the project's merge (a stable index sort, neighbour pairs added, one
  order statistic, one 1-byte class sort), with the CPU order statistics in numpy;
- ``same, torch order statistics``: the same algorithm with ``torch.sort`` /
  ``torch.kthvalue``, which is what runs on CUDA;
- ``coalesce then select``: the former merge, ``coalesce_sparse`` of the union then
  ``top_magnitude_mask`` and a split.

All three return identical tensors (checked). A last row times ``sort_by_index`` of one
``torch.topk`` selection (magnitude order), which gTop-k does once per call so that its
merges see ascending runs: numpy radix passes against ``torch.sort``, which is a
comparison sort below 32768 keys. Example::

    .venv/bin/python benchmarks/merge_speed.py --numel 1M,25M --density 0.001 --repeats 50
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gtopk_lab.bench.collectives import parse_count_list  # noqa: E402
from gtopk_lab.compression import merge as merge_mod  # noqa: E402


def _canonical(gen: torch.Generator, numel: int, k: int, shared_from: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """k random pairs, ascending indices; half of the indices taken from ``shared_from``."""
    idx = torch.randperm(numel, generator=gen)[:k]
    if shared_from is not None:
        idx = torch.cat([shared_from[: k // 2].long(), idx]).unique()[:k]
    idx = idx.sort().values.to(merge_mod.index_dtype(numel))
    return torch.randn(idx.numel(), generator=gen), idx


def _torch_order_statistics(v_a, i_a, v_b, i_b, k):
    saved = merge_mod.stable_argsort, merge_mod.kth_largest
    merge_mod.stable_argsort = lambda key: torch.sort(key, stable=True).indices
    merge_mod.kth_largest = lambda m, kk: torch.kthvalue(m, m.numel() - kk + 1).values
    try:
        return merge_mod.merge_sparse(v_a, i_a, v_b, i_b, k)
    finally:
        merge_mod.stable_argsort, merge_mod.kth_largest = saved


def _coalesce_then_select(v_a, i_a, v_b, i_b, k):
    values, indices = merge_mod.coalesce_sparse(torch.cat([v_a, v_b]), torch.cat([i_a, i_b]))
    if values.numel() <= k:
        return values, indices, values[:0], indices[:0]
    keep = merge_mod.top_magnitude_mask(values, k)
    n_keep = int(keep.sum())
    order = torch.sort((~keep).to(torch.uint8), stable=True).indices
    kept, dropped = order[:n_keep], order[n_keep:]
    return (values.index_select(0, kept), indices.index_select(0, kept),
            values.index_select(0, dropped), indices.index_select(0, dropped))


VARIANTS: dict[str, Callable] = {
    "merge_sparse": lambda *a: merge_mod.merge_sparse(*a),
    "same, torch order statistics": _torch_order_statistics,
    "coalesce then select": _coalesce_then_select,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/merge_speed.py", description=__doc__.splitlines()[0])
    parser.add_argument("--numel", default="1M,25M", help="buffer sizes, e.g. 1M,25M (default)")
    parser.add_argument("--density", type=float, default=0.001, help="k = density * numel (default 0.001)")
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per variant (default 50)")
    args = parser.parse_args(argv)
    try:
        numels = parse_count_list(args.numel, "--numel")
        if not 0.0 < args.density <= 1.0:
            raise ValueError(f"--density={args.density!r} is invalid: expected a number in (0, 1]")
        if args.repeats < 1:
            raise ValueError(f"--repeats={args.repeats!r} is invalid: expected an integer >= 1")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    print(f"# one thread, median of {args.repeats}, variants called in turn; "
          "vs merge = variant time / merge_sparse time")
    print(f"{'operands':<22} {'k':>7} {'variant':<30} {'ms':>8} {'vs merge':>9} {'same':>5}")
    gen = torch.Generator().manual_seed(0)
    for numel in numels:
        k = max(1, int(numel * args.density))
        v_a, i_a = _canonical(gen, numel, k)
        for label, (v_b, i_b) in (("random indices", _canonical(gen, numel, k)),
                                  ("half the indices shared", _canonical(gen, numel, k, i_a))):
            operands = (v_a, i_a, v_b, i_b, k)
            times: dict[str, list[float]] = {name: [] for name in VARIANTS}
            outputs = {}
            for rep in range(args.repeats + 1):
                for name, fn in VARIANTS.items():
                    t0 = time.perf_counter()
                    outputs[name] = fn(*operands)
                    if rep:  # the first round is a warm-up
                        times[name].append(time.perf_counter() - t0)
            base = statistics.median(times["merge_sparse"])
            for name in VARIANTS:
                same = all(torch.equal(a, b) for a, b in zip(outputs[name], outputs["merge_sparse"]))
                med = statistics.median(times[name])
                print(f"{label:<22} {k:>7} {name:<30} {med * 1e3:>8.3f} {med / base:>8.2f}x {str(same):>5}")
        _, order = torch.topk(torch.randn(numel, generator=gen).abs(), k)  # magnitude order
        sel_i = order.to(merge_mod.index_dtype(numel))
        sel_v = torch.randn(k, generator=gen)
        sort_times: dict[str, list[float]] = {"sort_by_index": [], "torch.sort": []}
        for rep in range(args.repeats + 1):
            t0 = time.perf_counter()
            fast = merge_mod.sort_by_index(sel_v, sel_i)
            t1 = time.perf_counter()
            perm = torch.sort(sel_i, stable=True).indices
            slow = (sel_v.index_select(0, perm), sel_i.index_select(0, perm))
            t2 = time.perf_counter()
            if rep:
                sort_times["sort_by_index"].append(t1 - t0)
                sort_times["torch.sort"].append(t2 - t1)
        same = all(torch.equal(a, b) for a, b in zip(fast, slow))
        base = statistics.median(sort_times["sort_by_index"])
        for name, ts in sort_times.items():
            med = statistics.median(ts)
            print(f"{'topk selection':<22} {k:>7} {name:<30} {med * 1e3:>8.3f} {med / base:>8.2f}x {str(same):>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
