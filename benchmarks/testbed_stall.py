"""Where gTop-k's "stall" on real TCP comes from (issue 28, item 0b), on the testbed.

Root only (``gtopk-lab testbed``). Two parts, both printed as tables:

1. **Ping-pong probes** between two hosts of an unshaped testbed, and between two
   processes in one host over loopback, for the patterns of the report: one 40 kB
   message each way, a 16-byte header then a 40 kB payload, one 4 MB message; each with
   gloo (``dist.send``/``dist.recv``) and with plain TCP sockets (``TCP_NODELAY``, send
   buffer sized to the message as gloo sizes it). Median and minimum round trip over
   ``--repeats``.
2. **Training runs** (P = 2, ``cnn_wide``, 20 iterations, ``--rate``): gTop-k on fresh
   ``dask worker`` processes, gTop-k again on the same (warm) workers, then dense; per
   run the first iteration's communication (each rank's, and the smallest over ranks:
   the rank that reached the collective last) and the steady state (iterations 1+: mean
   over ranks, and the median over iterations of the smallest over ranks).

Usage::

    sudo PYTHONPATH=. .venv/bin/python benchmarks/testbed_stall.py [--rate none] [--repeats 30]

Cost: about 1 minute on the 2-core box (the runs dominate).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from gtopk_lab.testbed import Testbed, testbed_problem

PY = sys.executable
PORT = 29531


def _recv_exact(sock: socket.socket, n: int) -> None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError("peer closed")
        got += k


def probe_main(kind: str, rank: int, server: str, own: str, repeats: int) -> None:
    """One side of the ping-pongs (run inside a host; ``server``: the address of gloo's
    store on rank 0, or of rank 1's listening socket; ``own``: this rank's address);
    rank 0 prints a JSON dict."""
    patterns = {"40 kB": [40_000], "16 B header + 40 kB": [16, 40_000], "4 MB": [4_000_000]}
    out: dict[str, list[float]] = {}
    if kind == "gloo":
        import datetime

        import torch
        import torch.distributed as dist

        from gtopk_lab.comm.launch import bind_to_interface

        bind_to_interface(own)
        store = dist.TCPStore(server, PORT, 2, rank == 0, timeout=datetime.timedelta(seconds=60))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=60))
        for name, sizes in patterns.items():
            bufs = [torch.zeros(n, dtype=torch.uint8) for n in sizes]
            times = []
            for i in range(repeats + 3):
                dist.barrier()
                t0 = time.perf_counter()
                for phase in (0, 1):
                    for b in bufs:
                        (dist.send if rank == phase else dist.recv)(b, 1 - rank)
                if i >= 3:
                    times.append(time.perf_counter() - t0)
            out[name] = times
        dist.destroy_process_group()
    else:
        if rank == 1:
            listener = socket.create_server((server, PORT))
            sock, _ = listener.accept()
        else:
            for _ in range(200):
                try:
                    sock = socket.create_connection((server, PORT))
                    break
                except OSError:
                    time.sleep(0.05)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for name, sizes in patterns.items():
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, max(sizes))
            data = [b"x" * n for n in sizes]
            times = []
            for i in range(repeats + 3):
                t0 = time.perf_counter()
                for phase in (0, 1):
                    for d in data:
                        if rank == phase:
                            sock.sendall(d)
                        else:
                            _recv_exact(sock, len(d))
                if i >= 3:
                    times.append(time.perf_counter() - t0)
            out[name] = times
        sock.close()
    if rank == 0:
        print(json.dumps({k: [statistics.median(v), min(v)] for k, v in out.items()}))


def probes(tb: Testbed, repeats: int) -> list[dict[str, object]]:
    rows = []
    for kind in ("gloo", "tcp"):
        for where, hosts in (("two hosts (veth + bridge)", (0, 1)), ("one host (loopback)", (1, 1))):
            own = [tb.address(h) if hosts[0] != hosts[1] else "127.0.0.1" for h in hosts]
            server = own[0] if kind == "gloo" else own[1]
            procs = [tb.popen(hosts[r], [PY, __file__, "--probe", kind, str(r), server, own[r], str(repeats)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (1, 0)]
            outs = [p.communicate(timeout=300) for p in procs]
            result = json.loads(outs[1][0].strip().splitlines()[-1])
            for pattern, (median, best) in result.items():
                rows.append({"transport": kind, "path": where, "pattern": pattern,
                             "median_ms": round(median * 1e3, 3), "min_ms": round(best * 1e3, 3)})
    return rows


def runs(tb: Testbed, out: Path) -> list[dict[str, object]]:
    rows = []
    for label, method in (("gtopk, fresh workers", "gtopk"), ("gtopk, same workers again", "gtopk"),
                          ("dense", "dense")):
        res = tb.run(0, [PY, "-m", "gtopk_lab.cli", "run", "--scheduler", tb.scheduler_address, "--method",
                         method, "--workers", "2", "--model", "cnn_wide", "--max-iterations", "20",
                         "--epochs", "1", "--no-progress", "--json", "--out", str(out)], timeout_s=300)
        if res.returncode != 0:
            raise RuntimeError(res.stderr[-2000:])
        summary = json.loads(res.stdout.strip().splitlines()[-1])
        metrics = pd.read_parquet(out / summary["run_id"] / "metrics.parquet")
        comm = metrics[metrics.kind == "iter"].pivot(index="iteration", columns="rank", values="comm_s") * 1e3
        rows.append({"run": label, "bytes/rank/iter": int(summary["bytes_sent_per_rank_per_iter"]),
                     "iter 0 per rank ms": [round(v, 1) for v in comm.iloc[0]],
                     "iter 0 min over ranks ms": round(comm.iloc[0].min(), 1),
                     "steady mean ms (iters 1+)": round(comm.iloc[1:].values.mean(), 2),
                     "steady median of min over ranks ms": round(comm.iloc[1:].min(axis=1).median(), 2),
                     "mean all iters ms": round(comm.values.mean(), 2)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="none", help="the hosts' rate (default: unshaped veths)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--probe", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        kind, rank, server, own, repeats = args.probe
        probe_main(kind, int(rank), server, own, int(repeats))
        return
    problem = testbed_problem()
    if problem is not None:
        sys.exit(f"testbed_stall: {problem}")
    with Testbed(hosts=3, rate=args.rate, name="stall", worker_args=["--no-nanny"]) as tb:
        print(pd.DataFrame(probes(tb, args.repeats)).to_string(index=False))
        print()
        print(pd.DataFrame(runs(tb, tb.folder / "out")).to_string(index=False))


if __name__ == "__main__":
    main()
