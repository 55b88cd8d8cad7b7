#!/usr/bin/env python3
"""How closely does tc shaping (cluster/shape-traffic.sh) hit the requested rate?

For each rate, in a fresh network namespace of its own (``unshare -n``, root), shape the
loopback with cluster/shape-traffic.sh, then run a real 2-rank gloo dense allreduce
(``gtopk_lab.collectives.dense_allreduce``) of ``--mib`` MiB per rank, ``--repeats`` times,
and print measured time, the ideal time at that rate and the effective rate.

On loopback both ranks share the one shaped link, so the ideal time is
``(bytes sent by all ranks) * 8 / rate`` with the ring's 2 (P-1)/P * S bytes per rank.
Cost: one namespace, two spawned ranks and ``repeats`` allreduces per rate (a few seconds
each at >= 100 Mbit/s).

Example::

    sudo .venv/bin/python cluster/bench_shaping.py --rates none,1gbit,500mbit,200mbit --mib 8
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPER = REPO / "cluster" / "shape-traffic.sh"


def _rank(rank: int, world_size: int, numel: int, repeats: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    from gtopk_lab.collectives import dense_allreduce

    dense_allreduce(torch.ones(1024))  # connection set-up outside the timing
    tensor = torch.ones(numel)
    times_s = []
    bytes_sent = 0
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        bytes_sent = dense_allreduce(tensor).stats.bytes_sent
        times_s.append(time.perf_counter() - start)
    return {"median_s": sorted(times_s)[len(times_s) // 2], "bytes_sent": float(bytes_sent)}


def _child(numel: int, repeats: int) -> None:
    sys.path.insert(0, str(REPO))
    from gtopk_lab.comm.launch import run_gloo

    results = run_gloo(_rank, 2, numel, repeats, timeout_s=120)
    print(json.dumps({"median_s": max(r["median_s"] for r in results),
                      "bytes_all_ranks": sum(r["bytes_sent"] for r in results)}))


def _bits_per_s(rate: str) -> float | None:
    if rate == "none":
        return None
    res = subprocess.run(["bash", str(SHAPER), "--dry-run", rate], capture_output=True, text=True,
                         env={**os.environ, "GTOPK_SHAPE_IFACE": "lo"}, timeout=20)
    if res.returncode != 0:
        raise ValueError(res.stderr.strip())
    return float(res.stdout.split(" tbf rate ")[1].split("bit")[0])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="none,1gbit,500mbit,200mbit",
                        help="comma-separated tc rates; 'none' = unshaped")
    parser.add_argument("--mib", type=float, default=8.0, help="allreduce size per rank in MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(*args.child)
        return 0
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("tc") is None:
        print("bench_shaping: needs root, unshare and tc (iproute2)", file=sys.stderr)
        return 2
    if not args.mib > 0 or args.repeats < 1:
        parser.error("--mib must be > 0 and --repeats >= 1")
    numel = int(args.mib * 2**20 / 4)
    print(f"2-rank gloo dense allreduce, {args.mib:g} MiB fp32 per rank, loopback shared by both "
          f"ranks, median of {args.repeats}")
    print(f"{'rate':>10} {'measured s':>11} {'ideal s':>9} {'effective Mbit/s':>17} {'ratio':>6}")
    for rate in args.rates.split(","):
        bits = _bits_per_s(rate)
        shape = "true" if bits is None else (
            f"GTOPK_SHAPE_IFACE=lo GTOPK_SHAPE_BURST=256kb bash {SHAPER} {rate} 2>/dev/null")
        script = (f"set -e; ip link set lo up; {shape}; "
                  f"{sys.executable} {Path(__file__).resolve()} --child {numel} {args.repeats}")
        res = subprocess.run(["unshare", "-n", "bash", "-c", script], capture_output=True,
                             text=True, timeout=600)
        if res.returncode != 0:
            print(f"{rate:>10} failed: {res.stderr.strip()[-300:]}")
            continue
        out = json.loads(res.stdout.strip().splitlines()[-1])
        eff = out["bytes_all_ranks"] * 8 / out["median_s"] / 1e6
        if bits is None:
            print(f"{rate:>10} {out['median_s']:>11.4f} {'-':>9} {eff:>17.0f} {'-':>6}")
        else:
            ideal = out["bytes_all_ranks"] * 8 / bits
            print(f"{rate:>10} {out['median_s']:>11.4f} {ideal:>9.4f} {eff:>17.0f} "
                  f"{out['median_s'] / ideal:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
