"""Where a warm gTop-k call's time goes over shared memory: own work vs waiting, and call counts.

    PYTHONPATH=. .venv/bin/python benchmarks/gtopk_call_profile.py --workers 2 --numel 1M

1. ``--workers`` real ranks (``run_gloo``, ``GTOPK_LAB_SHM=1``) make 10 warm-up calls of
   ``gtopk_allreduce`` (exact-k, density 0.001, the reference benchmark's inputs), then
   ``--calls`` timed ones back to back per algorithm;
2. per call: wall (``perf_counter``), the time spent inside the ring's blocking wait
   (``ShmLinks._wait_until``, wrapped here; the library is unchanged) and their difference,
   this rank's own work (which still includes any preemption);
3. then the same calls under cProfile: Python and torch calls per call, those made by the
   ring-wait loop itself (its direct callees) left out, so the count does not grow with the wait.

Prints per rank and algorithm: b2b mean, median wall, median wait, own work p25 and min (us),
calls per call. Cost: a few seconds a world size.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rank(rank: int, world: int, numel: int, k: int, calls: int) -> dict:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(REPO / "benchmarks"))
    from reference_gtopk import rank_inputs

    from gtopk_lab.comm import shm_links
    from gtopk_lab.comm.torch_dist import gtopk_allreduce

    waited = [0.0]
    inner = shm_links.ShmLinks._wait_until

    def timed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            return inner(self, *args, **kwargs)
        finally:
            waited[0] += time.perf_counter() - t

    shm_links.ShmLinks._wait_until = timed  # this process only
    v, i = (torch.from_numpy(a) for a in rank_inputs(0, rank, numel, k))
    import gtopk_lab
    out: dict = {"_from": gtopk_lab.__file__}
    for algorithm in ("tree", "butterfly"):
        def call() -> None:
            gtopk_allreduce(v, i, numel, k, algorithm=algorithm, exact_k=True)
        for _ in range(10):
            call()
        dist.barrier()
        walls, waits = [], []
        start = time.perf_counter()
        for _ in range(calls):
            waited[0] = 0.0
            t0 = time.perf_counter()
            call()
            walls.append(time.perf_counter() - t0)
            waits.append(waited[0])
        b2b = (time.perf_counter() - start) / calls
        own = [w - x for w, x in zip(walls, waits)]
        dist.barrier()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            call()
        prof.disable()
        stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        wait_fns = {f for f in stats if f[2] == "_wait_until"}
        n_all = n_torch = 0
        for f, (cc, _nc, _tt, _ct, callers) in stats.items():
            if f in wait_fns:
                continue
            n = sum(c[0] if isinstance(c, tuple) else c for g, c in callers.items() if g not in wait_fns) \
                if callers else cc
            n_all += n
            n_torch += n if ("torch" in f[0] or "torch" in f[2] or "Tensor" in f[2]) else 0
        out[algorithm] = {"b2b": b2b, "wall": statistics.median(walls), "wait": statistics.median(waits),
                          "own_p25": statistics.quantiles(own, n=4)[0], "own_min": min(own),
                          "calls": n_all / calls, "torch_calls": n_torch / calls}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--numel", default="1M")
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from gtopk_lab.comm.launch import run_gloo

    from gtopk_lab.counts import parse_count_list

    numels = parse_count_list(args.numel, "--numel")
    if len(numels) != 1:
        parser.error(f"--numel={args.numel!r} is invalid: expected one size")
    numel = numels[0]
    k = max(1, numel // 1000)
    os.environ["GTOPK_LAB_SHM"] = "1"
    print(f"# {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; numel {numel}, k {k}, {args.calls} warm calls; us")
    print("  P  algorithm  rank     b2b   wall   wait  own p25  own min  calls  torch")
    for world in parse_count_list(args.workers, "--workers"):
        for rank, per in enumerate(run_gloo(_rank, world, numel, k, args.calls, timeout_s=300)):
            origin = per.pop("_from")
            if rank == 0:
                print(f"# P = {world}: ranks import {origin}")
            for algorithm, r in per.items():
                print(f"  {world}  {algorithm:9s}  {rank:4d}  {r['b2b'] * 1e6:6.0f} {r['wall'] * 1e6:6.0f} "
                      f"{r['wait'] * 1e6:6.0f}  {r['own_p25'] * 1e6:7.0f}  {r['own_min'] * 1e6:7.0f}  "
                      f"{r['calls']:5.0f}  {r['torch_calls']:5.0f}")
    import gtopk_lab
    print(f"# load at end {os.getloadavg()[0]:.1f}; gtopk_lab from {Path(gtopk_lab.__file__).parent} (start it from"
          " outside another checkout: the ranks import from the working directory first)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
