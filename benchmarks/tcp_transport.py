"""gTop-k calls over gloo's point-to-point, the project's own TCP links and shared memory, side by side.

    PYTHONPATH=. .venv/bin/python benchmarks/tcp_transport.py [--testbed] [--calls 200]

1. **One host** (127.0.0.1, ``run_gloo``): P = ``--workers`` ranks make ``--calls`` warm
   gTop-k calls back to back (exact-k, butterfly and tree) on each rank's top-k of a seeded
   random vector, once per transport: ``gloo`` (``GTOPK_LAB_SHM=0 GTOPK_LAB_TCP=0``),
   ``tcp`` (``GTOPK_LAB_SHM=0``: the links between hosts, here on loopback) and ``shm``;
   per case the median over ranks of ms per call and of this thread's CPU ms per call.
2. **Testbed** (``--testbed``, root): P = 4 network namespaces on one bridge, each link
   shaped to ``--rate`` both ways (and unshaped), ranks in the hosts as in training
   (``bind_to_interface``); each call timed from an instant all ranks agreed on, the slowest
   rank's median, for gloo and tcp.

Sizes (``--numel``, ``--density``): the testbed run's ``cnn_wide`` (232k, k = 2,320: 18.6 kB
messages) by default. Results are bitwise the same on every transport
(tests/test_shm_transport.py); this is their time only. Prints the CPU model, load and commit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = {"gloo": ("0", "0"), "tcp": ("0", "1"), "shm": ("1", "1")}


def _inputs(rank: int, numel: int, k: int):  # type: ignore[no-untyped-def]
    import torch

    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    i = x.abs().topk(k).indices
    return x[i], i


def _loop(rank: int, world: int, numel: int, k: int, calls: int) -> dict:
    """Step 1 on one rank: ms and thread-CPU ms per call, per algorithm, and the transport."""
    import torch.distributed as dist

    from gtopk_lab.comm.torch_dist import gtopk_allreduce
    from gtopk_lab.comm.transport_choice import transport_kind

    v, i = _inputs(rank, numel, k)
    out: dict = {"kind": transport_kind()}
    for algorithm in ("butterfly", "tree"):
        for _ in range(10):
            gtopk_allreduce(v, i, numel, k, algorithm=algorithm, exact_k=True)
        dist.barrier()
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(calls):
            gtopk_allreduce(v, i, numel, k, algorithm=algorithm, exact_k=True)
        out[algorithm] = ((time.perf_counter() - t0) / calls * 1e3, (time.thread_time() - c0) / calls * 1e3)
    return out


def one_host(workers: list[int], numel: int, k: int, calls: int) -> list[dict]:
    from gtopk_lab.comm.launch import run_gloo

    rows = []
    for p in workers:
        for mode, (shm, tcp) in MODES.items():
            os.environ["GTOPK_LAB_SHM"], os.environ["GTOPK_LAB_TCP"] = shm, tcp  # the ranks adopt it
            ranks = run_gloo(_loop, p, numel, k, calls, timeout_s=300.0)
            assert {r["kind"] for r in ranks} == {mode}, [r["kind"] for r in ranks]
            for algorithm in ("butterfly", "tree"):
                rows.append({"where": "one host", "P": p, "transport": mode, "algorithm": algorithm,
                             "ms": statistics.median(r[algorithm][0] for r in ranks),
                             "cpu_ms": statistics.median(r[algorithm][1] for r in ranks)})
    for var in ("GTOPK_LAB_SHM", "GTOPK_LAB_TCP"):
        os.environ.pop(var, None)
    return rows


def rank_main(spec_path: str, rank: int) -> None:
    """Step 2 on one rank inside a testbed host."""
    import datetime

    import torch
    import torch.distributed as dist

    from gtopk_lab.comm.launch import bind_to_interface, set_single_thread
    from gtopk_lab.comm.timing import common_start_s
    from gtopk_lab.comm.torch_dist import gtopk_allreduce
    from gtopk_lab.comm.transport_choice import transport_kind

    spec = json.loads(Path(spec_path).read_text())
    world = spec["world"]
    bind_to_interface(spec["addresses"][rank])
    set_single_thread()
    timeout = datetime.timedelta(seconds=120)
    store = dist.TCPStore(spec["addresses"][0], spec["port"], world, rank == 0, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    v, i = _inputs(rank, spec["numel"], spec["k"])
    out: dict = {"kind": transport_kind()}
    for algorithm in ("butterfly", "tree"):
        walls = []
        for rep in range(spec["calls"] + 3):
            start, _ = common_start_s()
            gtopk_allreduce(v, i, spec["numel"], spec["k"], algorithm=algorithm, exact_k=True)
            if rep >= 3:
                walls.append(time.monotonic() - start)
        slowest = torch.tensor(walls, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        out[algorithm] = statistics.median(slowest.tolist()) * 1e3
    dist.barrier()
    dist.destroy_process_group()
    Path(spec["out"], f"rank{rank}.json").write_text(json.dumps(out))


def testbed(rates: list[str], numel: int, k: int, calls: int, folder: Path) -> list[dict]:
    from gtopk_lab.testbed import Testbed

    rows = []
    for rate in rates:
        with Testbed(hosts=4, rate=rate, name="tcptr", dask=False, folder=folder) as tb:
            for n, mode in enumerate(("gloo", "tcp")):
                out = folder / f"{rate}-{mode}"
                out.mkdir(parents=True, exist_ok=True)
                spec = {"world": 4, "addresses": [tb.address(h) for h in range(4)], "port": 29700 + n,
                        "numel": numel, "k": k, "calls": calls, "out": str(out)}
                (out / "spec.json").write_text(json.dumps(spec))
                env = {**os.environ, "GTOPK_LAB_TCP": "1" if mode == "tcp" else "0",
                       "PYTHONPATH": str(REPO)}
                procs = [tb.popen(h, [sys.executable, __file__, "--rank", str(out / "spec.json"), str(h)],
                                  env=env, log=f"{rate}-{mode}-r{h}.log") for h in range(4)]
                for p in procs:
                    p.wait(timeout=300)
                if any(p.returncode for p in procs):
                    raise RuntimeError(f"testbed ranks failed:\n{tb.logs(2000)}")
                got = json.loads((out / "rank0.json").read_text())
                assert got["kind"] == mode, got["kind"]
                for algorithm in ("butterfly", "tree"):
                    rows.append({"where": f"testbed {rate}", "P": 4, "transport": mode, "algorithm": algorithm,
                                 "ms": got[algorithm], "cpu_ms": float("nan")})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,4", help="P on one host (default 2,4)")
    parser.add_argument("--numel", default="232000", help="elements (default 232000: cnn_wide)")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--calls", type=int, default=200, help="timed calls per case (default 200)")
    parser.add_argument("--testbed", action="store_true", help="also P = 4 testbed hosts (root)")
    parser.add_argument("--rates", default="200mbit,none", help="testbed link rates (default 200mbit,none)")
    parser.add_argument("--rank", nargs=2, metavar=("SPEC", "RANK"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank:
        rank_main(args.rank[0], int(args.rank[1]))
        return 0
    from gtopk_lab.counts import parse_count, split_list

    numel = int(parse_count(args.numel))
    k = max(1, int(round(args.density * numel)))
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=REPO).stdout.strip()
    print(f"# {cpu}, {os.cpu_count()} cores, commit {commit}, load {os.getloadavg()[0]:.1f}; "
          f"numel {numel}, k {k} ({8 * k} B a message)")
    rows = one_host([int(w) for w in split_list(args.workers)], numel, k, args.calls)
    if args.testbed:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            rows += testbed(split_list(args.rates), numel, k, max(20, args.calls // 5), Path(tmp))
    print(f"# load after {os.getloadavg()[0]:.1f}")
    print("| where | P | algorithm | gloo ms | tcp ms | shm ms | gloo / tcp | CPU ms gloo / tcp / shm |")
    print("|---|---|---|---|---|---|---|---|")
    cases = sorted({(r["where"], r["P"], r["algorithm"]) for r in rows}, key=lambda c: (c[0] != "one host", c))
    for where, p, algorithm in cases:
        got = {r["transport"]: r for r in rows if (r["where"], r["P"], r["algorithm"]) == (where, p, algorithm)}
        ms = {m: got[m]["ms"] if m in got else float("nan") for m in MODES}
        cpu_ms = " / ".join(f"{got[m]['cpu_ms']:.2f}" if m in got else "-" for m in MODES)
        print(f"| {where} | {p} | {algorithm} | {ms['gloo']:.2f} | {ms['tcp']:.2f} | {ms['shm']:.2f} | "
              f"{ms['gloo'] / ms['tcp']:.1f}x | {cpu_ms} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
