#!/usr/bin/env python3
"""What does the per-message count header cost on a link with real latency?

gTop-k rounds normally send two dependent messages each way (an 8-byte count, then the
pairs), so a round costs ``2 alpha + beta (h + m k)`` on a real link. With exact-k
selections (``gtopk_allreduce(..., exact_k=True)``, what training uses with the ``topk``
selector) every message is k pairs and a round is one message each way:
``alpha + beta m k``. This benchmark measures both on a loopback with real latency: in a
fresh network namespace (``unshare -n``, root) ``tc netem`` delays every packet on ``lo``
by ``--delay``, then P real gloo ranks time ``gtopk_allreduce`` (butterfly and tree) with
and without ``exact_k``, side by side in one run (median of ``--repeats``, slowest rank).

The link is not throttled, so the figures are latency-bound: the ratio header / exact
should approach 2 for small k. Ranks share this machine's cores; with P above the core
count the times include time-sharing (the output says so).

Example::

    sudo .venv/bin/python benchmarks/header_latency.py --delay 1ms --workers 2,4 --k 1000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rank(rank: int, world_size: int, numel: int, k: int, repeats: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    from gtopk_lab.collectives import gtopk_allreduce
    from gtopk_lab.compression.selection import get_selector

    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    values, indices = get_selector("topk")(x, k)
    out: dict[str, float] = {}
    for algorithm in ("butterfly", "tree"):
        for exact in (False, True):
            gtopk_allreduce(values, indices, numel, k, algorithm=algorithm, exact_k=exact)  # warm-up
            times = []
            for _ in range(repeats):
                dist.barrier()
                start = time.perf_counter()
                gtopk_allreduce(values, indices, numel, k, algorithm=algorithm, exact_k=exact)
                times.append(time.perf_counter() - start)
            out[f"{algorithm}/{'exact' if exact else 'header'}"] = statistics.median(times)
    return out


def _child(world_size: int, numel: int, k: int, repeats: int) -> None:
    sys.path.insert(0, str(REPO))
    from gtopk_lab.comm.launch import run_gloo

    per_rank = run_gloo(_rank, world_size, numel, k, repeats, timeout_s=300)
    print(json.dumps({key: max(r[key] for r in per_rank) for key in per_rank[0]}))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", default="1ms", help="netem delay per packet on lo, e.g. 500us, 1ms")
    parser.add_argument("--workers", default="2,4", help="world sizes, e.g. 2,4")
    parser.add_argument("--numel", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--child", nargs=4, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(*args.child)
        return 0
    try:
        workers = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        print(f"error: --workers={args.workers!r} is invalid: expected integers like 2,4", file=sys.stderr)
        return 2
    if not workers or min(workers) < 2 or not 1 <= args.k <= args.numel or args.repeats < 1:
        print("error: expected --workers >= 2, 1 <= --k <= --numel and --repeats >= 1", file=sys.stderr)
        return 2
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("tc") is None:
        print("error: needs root, unshare and tc (iproute2)", file=sys.stderr)
        return 2
    cores = len(os.sched_getaffinity(0))
    print(f"# gtopk_allreduce on lo with netem delay {args.delay} per packet, numel {args.numel}, "
          f"k {args.k} ({8 * args.k} B of pairs), median of {args.repeats} (slowest rank), {cores} cores")
    if max(workers) > cores:
        print(f"# note: up to {max(workers)} ranks share {cores} cores")
    print(f"{'P':>3} {'pattern':<10} {'header ms':>10} {'exact_k ms':>11} {'header/exact':>13}")
    failed = 0
    for p in workers:
        script = (f"set -e; ip link set lo up; tc qdisc add dev lo root netem delay {args.delay}; "
                  f"{sys.executable} {Path(__file__).resolve()} --child {p} {args.numel} {args.k} {args.repeats}")
        res = subprocess.run(["unshare", "-n", "bash", "-c", script], capture_output=True, text=True,
                             timeout=900)
        if res.returncode != 0:
            print(f"{p:>3} failed: {res.stderr.strip()[-300:]}")
            failed += 1
            continue
        out = json.loads(res.stdout.strip().splitlines()[-1])
        for algorithm in ("butterfly", "tree"):
            hdr, exact = out[f"{algorithm}/header"], out[f"{algorithm}/exact"]
            print(f"{p:>3} {algorithm:<10} {hdr * 1e3:>10.2f} {exact * 1e3:>11.2f} {hdr / exact:>13.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
