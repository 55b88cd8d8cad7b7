"""topk-fast against another version of itself, in read passes of the input, one process.

Each call is timed right after an ``x.sum()`` (one read pass), so both versions and the
reference see the same machine load; prints the median and the minimum of each, in ms and
in passes (median / median of the sums). fp32 N(0,1), one thread; checks both return the
same indices. ``--old`` is a fast_topk.py file, e.g. from another commit::

    git show 30afd98:gtopk_lab/compression/fast_topk.py > /tmp/old_fast_topk.py
    python benchmarks/topk_passes.py --old /tmp/old_fast_topk.py --numel 25M --density 0.001
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import torch

from gtopk_lab.bench.collectives import parse_count_list
from gtopk_lab.bench.selection import cpu_model
from gtopk_lab.compression import fast_topk
from gtopk_lab.config import k_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="path of the fast_topk.py to compare with")
    parser.add_argument("--numel", default="25M", help="sizes, e.g. 1M,25M,100M")
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("old_fast_topk", args.old)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    torch.set_num_threads(1)
    print(f"# CPU: {cpu_model()}; one thread; median of {args.repeats}")
    for numel in parse_count_list(args.numel):
        x = torch.randn(numel, generator=torch.Generator().manual_seed(0))
        k = k_for(numel, args.density)
        versions = {"old": old.numba_select, "new": fast_topk.numba_select}
        ref = [sel(x, k)[1] for sel in versions.values()]
        assert torch.equal(ref[0], ref[1]), "the versions disagree"
        times: dict[str, list[float]] = {"sum": []}
        for _ in range(args.repeats):
            for name, sel in versions.items():
                t0 = time.perf_counter()
                x.sum()
                t1 = time.perf_counter()
                sel(x, k)
                times["sum"].append(t1 - t0)
                times.setdefault(name, []).append(time.perf_counter() - t1)
        one_pass = statistics.median(times["sum"])
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"numel {numel:>10} k {k:>8} {name:<4} median {med * 1e3:8.2f} ms {med / one_pass:5.2f} passes"
                  f"  min {min(ts) * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
