#!/usr/bin/env python3
"""Where does a stalled 2-rank gloo exchange spend its time, thread by thread?

A companion of ``benchmarks/exchange_stalls.py``. Two gloo ranks run ``--calls``
isend/irecv exchanges of ``--bytes``, each from a common start after ``--busy-ms`` of CPU,
and read every thread's ``/proc/self/task/<tid>/schedstat`` around the call. Per call and
rank it prints the call's time and, for each thread that changed by more than 0.2 ms, the
run-queue delay (runnable, not running) and the CPU time it gained, in ms. The kernel
updates these counters at scheduling events, so a thread running when the call starts
(the main thread after its spin) carries some of the time before the call.

On the 2-vCPU VMs (``benchmarks/logs/2026-11-29-2core-exchange-threads.log``), a stalled
call shows the gloo I/O thread (``gloo_tcp_loop``) running 4-5 ms of CPU, against
0.1-0.3 ms in a fast call, while the main thread waits runnable for about as long.
Example::

    .venv/bin/python benchmarks/exchange_threads.py --calls 25 --busy-ms 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _threads() -> dict[str, tuple[int, int]]:
    """``name:tid -> (run ns, run-queue delay ns)`` of every thread of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run_ns, delay_ns, _ = f.read().split()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended
            continue
        out[f"{name}:{tid}"] = (int(run_ns), int(delay_ns))
    return out


def _rank(rank: int, world_size: int, nbytes: int, calls: int, busy_ms: float) -> list[tuple[float, dict]]:
    import torch

    from gtopk_lab.bench.stalls import exchange, start_after_spin

    buf = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    out = []
    for _ in range(calls):
        start_after_spin(busy_ms)
        before, t0 = _threads(), time.perf_counter()
        exchange("isend/irecv", buf, rank, world_size)
        took, after = time.perf_counter() - t0, _threads()
        changed = {}
        for key, (run_ns, delay_ns) in after.items():
            if key in before:
                d_run, d_delay = run_ns - before[key][0], delay_ns - before[key][1]
                if d_run > 200_000 or d_delay > 200_000:
                    changed[key] = (round(d_delay / 1e6, 2), round(d_run / 1e6, 2))
        out.append((took, changed))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=200_000)
    parser.add_argument("--calls", type=int, default=25)
    parser.add_argument("--busy-ms", type=float, default=2.0)
    args = parser.parse_args(argv)
    if args.bytes < 1 or args.calls < 1 or args.busy_ms < 0:
        print("error: expected --bytes >= 1, --calls >= 1 and --busy-ms >= 0", file=sys.stderr)
        return 2
    if not Path("/proc/self/task").is_dir():
        print("error: needs Linux /proc/<pid>/task/<tid>/schedstat", file=sys.stderr)
        return 2

    from gtopk_lab.comm.launch import run_gloo

    per_rank = run_gloo(_rank, 2, args.bytes, args.calls, args.busy_ms, timeout_s=300)
    print(f"# 2 gloo ranks, isend/irecv of {args.bytes} B after {args.busy_ms:g} ms of CPU, "
          f"{len(os.sched_getaffinity(0))} cores; per thread: (run-queue delay ms, CPU ms)")
    for call, (a, b) in enumerate(zip(*per_rank)):
        print(f"{call:>3} {max(a[0], b[0]) * 1e3:6.2f} ms | rank 0 {a[0] * 1e3:5.2f} {a[1]} "
              f"| rank 1 {b[0] * 1e3:5.2f} {b[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
