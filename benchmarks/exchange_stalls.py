#!/usr/bin/env python3
"""How long does a 2-rank gloo exchange take on this machine, and how often does it stall?

Why this exists: on the 2-vCPU development VMs the model-fidelity benchmark
(``gtopk-lab bench collectives``) misses its 25% target at P = 2 in some runs, always in
the same direction (measured slower than modelled). This script isolates the transport:
two gloo ranks exchange one message each way from a common start, optionally after a CPU
spin (``--busy-ms``, as a merge before the next round), as ``all_gather``, ``isend/irecv``,
``irecv/isend`` and ``send then recv``, call by call in turn (``gtopk_lab.bench.stalls``).

Printed per (size, busy, exchange): the median, 10th and 90th percentile of the slower
rank's time and the share of calls above ``--stall-ms``. Where each rank has a core no
call of these sizes takes over 3 ms; a stall shows as a share of calls near 4 ms whatever
the size, i.e. a scheduling delay, not bytes. Example::

    .venv/bin/python benchmarks/exchange_stalls.py --bytes 2000,200k --busy-ms 0,2 --calls 30
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: Sequence[str] | None = None) -> int:
    from gtopk_lab.bench.collectives import parse_count_list

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", default="2000,200000", help="message sizes, e.g. 2000,200k")
    parser.add_argument("--busy-ms", default="0,2", help="CPU spin before each call, e.g. 0,2")
    parser.add_argument("--calls", type=int, default=30, help="timed calls per exchange and case")
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

    from gtopk_lab.bench.stalls import exchange_times_rank, summarise_exchanges
    from gtopk_lab.comm.launch import run_gloo

    per_rank = run_gloo(exchange_times_rank, 2, sizes, busy, args.calls, timeout_s=600)
    cores = len(os.sched_getaffinity(0))
    print(f"# 2 gloo ranks on 127.0.0.1, {cores} cores, common start per call, {args.calls} calls "
          f"per row, slower rank's time; stall = a call over {args.stall_ms:g} ms")
    print(f"{'bytes':>8} {'busy ms':>8} {'exchange':<15} {'median ms':>10} {'p10 ms':>8} "
          f"{'p90 ms':>8} {'stalls':>7}")
    for r in summarise_exchanges(per_rank, args.stall_ms / 1e3):
        print(f"{r['bytes']:>8} {r['busy_ms']:>8g} {r['mode']:<15} {r['median_s'] * 1e3:>10.2f} "
              f"{r['p10_s'] * 1e3:>8.2f} {r['p90_s'] * 1e3:>8.2f} {r['stall_share']:>7.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
