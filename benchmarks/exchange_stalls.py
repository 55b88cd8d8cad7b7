#!/usr/bin/env python3
"""How long does a 2-rank gloo exchange take on this machine, and how often does it stall?

Why this exists: on the 2-vCPU development VMs the model-fidelity benchmark
(``gtopk-lab bench collectives``) misses its 25% target at P = 2 in some runs, always in
the same direction (measured slower than modelled). This script isolates the transport.
Two gloo ranks on 127.0.0.1 start every call at an instant both agreed on (the
benchmark's ``common_start_s``), optionally spin ``--busy-ms`` of CPU first (as a rank
does when it merges before its next round), then exchange one message each way, three
ways, measured call by call in turn:

- ``all_gather``: ``dist.all_gather`` into a list (what ``topk_allgather`` does);
- ``isend/irecv``: both ranks post a send and a receive at once (a gTop-k round);
- ``send then recv``: rank 0 sends first, rank 1 receives first (half-duplex order).

Printed per (size, busy): the median, 10th and 90th percentile of the slower rank's time
and the share of calls above ``--stall-ms``. With no stalls every figure is well under a
millisecond for these sizes on any host; a stall shows as a share of calls near 4 ms
whatever the size, i.e. a scheduling delay, not bytes. Example::

    .venv/bin/python benchmarks/exchange_stalls.py --bytes 2000,200000 --busy-ms 0,2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = ("all_gather", "isend/irecv", "send then recv")


def _exchange_rank(rank: int, world_size: int, sizes: list[int], busy_ms: list[float],
                   calls: int) -> dict[str, list[float]]:
    import torch
    import torch.distributed as dist

    from gtopk_lab.bench.collectives import common_start_s

    peer = 1 - rank
    out: dict[str, list[float]] = {}
    for nbytes in sizes:
        buf = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
        for busy in busy_ms:
            for call in range(calls + 2):  # the first two calls warm up connections and buffers
                for mode in MODES:
                    common_start_s()
                    end = time.perf_counter() + busy / 1e3
                    while time.perf_counter() < end:
                        pass
                    t0 = time.perf_counter()
                    if mode == "all_gather":
                        dist.all_gather([torch.empty_like(buf) for _ in range(world_size)], buf)
                    else:
                        got = torch.empty_like(buf)
                        if mode == "isend/irecv":
                            for req in (dist.isend(buf, peer), dist.irecv(got, peer)):
                                req.wait()
                        elif rank == 0:
                            dist.send(buf, peer)
                            dist.recv(got, peer)
                        else:
                            dist.recv(got, peer)
                            dist.send(buf, peer)
                    if call >= 2:
                        out.setdefault(f"{nbytes}|{busy}|{mode}", []).append(time.perf_counter() - t0)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from gtopk_lab.bench.collectives import parse_count_list

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", default="2000,200000", help="message sizes, e.g. 2000,200k")
    parser.add_argument("--busy-ms", default="0,2", help="CPU spin before each call, e.g. 0,2")
    parser.add_argument("--calls", type=int, default=30, help="timed calls per mode and case")
    parser.add_argument("--stall-ms", type=float, default=3.0, help="a call longer than this is a stall")
    args = parser.parse_args(argv)
    try:
        sizes = parse_count_list(args.bytes, "--bytes")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        busy = [float(b) for b in args.busy_ms.split(",") if b.strip()]
    except ValueError:
        print(f"error: --busy-ms={args.busy_ms!r} is invalid: expected milliseconds like 0,2", file=sys.stderr)
        return 2
    if not busy or min(busy) < 0 or args.calls < 10 or args.stall_ms <= 0:
        print("error: expected --busy-ms >= 0, --calls >= 10 (deciles) and --stall-ms > 0", file=sys.stderr)
        return 2

    from gtopk_lab.distributed_utils import run_gloo

    per_rank = run_gloo(_exchange_rank, 2, sizes, busy, args.calls, timeout_s=600)
    cores = len(os.sched_getaffinity(0))
    print(f"# 2 gloo ranks on 127.0.0.1, {cores} cores, common start per call, {args.calls} calls "
          f"per row, slower rank's time; stall = a call over {args.stall_ms:g} ms")
    print(f"{'bytes':>8} {'busy ms':>8} {'exchange':<15} {'median ms':>10} {'p10 ms':>8} "
          f"{'p90 ms':>8} {'stalls':>7}")
    for key in per_rank[0]:
        nbytes, busy_s, mode = key.split("|")
        slow = [max(a, b) for a, b in zip(per_rank[0][key], per_rank[1][key])]
        deciles = statistics.quantiles(slow, n=10)
        stalls = sum(t > args.stall_ms / 1e3 for t in slow) / len(slow)
        print(f"{int(nbytes):>8} {float(busy_s):>8g} {mode:<15} {statistics.median(slow) * 1e3:>10.2f} "
              f"{deciles[0] * 1e3:>8.2f} {deciles[-1] * 1e3:>8.2f} {stalls:>7.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
