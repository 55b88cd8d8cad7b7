"""Top-k's allgather on one host over gloo's ``all_gather``, the shm links' ring and the TCP links' ring.

    PYTHONPATH=. .venv/bin/python benchmarks/allgather_transports.py [--workers 2,4] [--calls 300]

P = ``--workers`` real gloo ranks on 127.0.0.1 (``run_gloo``) call ``topk_allgather`` with
``exact_count=k`` on each rank's top-k of a seeded random vector, once per transport: ``gloo``
(``GTOPK_LAB_SHM=0 GTOPK_LAB_TCP=0``: the backend's collective), ``shm`` (the default on one
host: ``comm/allgather_links.py``'s ring over shared memory) and ``tcp`` (``GTOPK_LAB_SHM=0``:
the links between hosts, here on loopback). Each call starts after a barrier; per case the
slowest rank's median ms per call (``--calls`` at 1M elements, a tenth of them, at least 10,
at 25M). Results are bitwise the same on every transport (tests/test_shm_transport.py); this
is their time only. Prints the CPU model, the cores, the load and the commit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gtopk_lab.comm.launch import run_gloo  # noqa: E402
from gtopk_lab.counts import parse_count_list, split_list  # noqa: E402
from gtopk_lab.provenance import cpu_model, short_commit  # noqa: E402

TRANSPORTS = {"gloo": ("0", "0"), "shm": ("1", "1"), "tcp": ("0", "1")}  # (GTOPK_LAB_SHM, GTOPK_LAB_TCP)


def _rank(rank: int, world: int, numel: int, density: float, calls: int) -> tuple[str, float]:
    import torch
    import torch.distributed as dist

    from gtopk_lab.comm.torch_dist import topk_allgather
    from gtopk_lab.comm.transport_choice import transport_kind

    kind = transport_kind()
    k = max(1, int(numel * density))
    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    idx = x.abs().topk(k).indices
    values = x[idx]
    for _ in range(5):
        topk_allgather(values, idx, numel, exact_count=k)
    times = []
    for _ in range(calls):
        dist.barrier()
        t0 = time.perf_counter()
        topk_allgather(values, idx, numel, exact_count=k)
        times.append(time.perf_counter() - t0)
    slowest = torch.tensor([statistics.median(times)])
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return kind, float(slowest.item())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--numels", default="1M,25M")
    parser.add_argument("--densities", default="0.001,0.01", help="one per --numels entry")
    parser.add_argument("--calls", type=int, default=300, help="timed calls at 1M (a tenth at 25M)")
    args = parser.parse_args()
    workers = [int(w) for w in split_list(args.workers)]
    numels = [int(n) for n in parse_count_list(args.numels)]
    densities = [float(d) for d in split_list(args.densities)]
    if len(densities) != len(numels):
        print(f"allgather_transports: --densities has {len(densities)} values: expected one per --numels "
              f"entry ({len(numels)})", file=sys.stderr)
        return 2
    commit = short_commit()
    print(f"# {' '.join(sys.argv)}\n# {cpu_model()}, {len(os.sched_getaffinity(0))} cores, commit {commit}, "
          f"load {os.getloadavg()[0]:.2f}; ms per call, slowest rank's median, each call after a barrier")
    print("| P | numel | rho | gloo ms | shm ms | tcp ms | gloo / shm | gloo / tcp |")
    print("|---|---|---|---|---|---|---|---|")
    for world in workers:
        for numel, density in zip(numels, densities):
            calls = args.calls if numel < 10_000_000 else max(10, args.calls // 10)
            ms = {}
            for name, (shm, tcp) in TRANSPORTS.items():
                os.environ["GTOPK_LAB_SHM"], os.environ["GTOPK_LAB_TCP"] = shm, tcp
                kind, seconds = run_gloo(_rank, world, numel, density, calls, timeout_s=600.0)[0]
                if kind != name:
                    raise RuntimeError(f"{name} run took {kind}")
                ms[name] = seconds * 1e3
            print(f"| {world} | {numel:,} | {density} | {ms['gloo']:.3f} | {ms['shm']:.3f} | {ms['tcp']:.3f} "
                  f"| {ms['gloo'] / ms['shm']:.1f}x | {ms['gloo'] / ms['tcp']:.1f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
