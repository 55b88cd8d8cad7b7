"""The network model against real TCP on the testbed (issue 28, items 3-4).

Root only (``gtopk_lab.testbed``; without it one line says why, exit 2). On N network
namespaces on one bridge, every host's veth shaped to ``--rate`` both ways (no Dask: the
ranks are plain gloo processes inside the hosts, ``benchmarks/tcp_model_rank.py``):

1. **Calibrate** alpha, beta and the shaper's burst by ping-pong between hosts 0 and 1
   (``pingpong_medians``, the fit of ``gtopk-lab calibrate``: ``alpha + beta * max(0, n - B)``).
2. **Sweep**: dense ring allreduce, Top-k allgather, gTop-k butterfly and tree, Ok-Topk at
   P = ``--workers`` hosts, ``--numels`` x ``--densities`` (dense: once per size); plus the
   **incast** case (every rank sends its k pairs to rank 0 at once). Median over calls of the
   slowest rank's wall time, each call from a common start.
3. **Two jobs** at once: two P = N/2 groups on disjoint hosts of the same bridge, case by case
   in the same time slots.
4. **Straggler**: a second testbed of 4 hosts, the last one on ``--straggler-rate``
   (``Testbed(rate_per_host=...)``), its link to host 0 calibrated as in step 1 (one flow
   gets another share of a slower port: on 200 / 50 Mbit/s ``tbf`` ports 158-162 / 44-45
   Mbit/s, a ratio of 3.6, not the rates' 4).
5. **Model**, per call (``gtopk_lab.network.tcp_fit.predict_call``): calibrated alpha-beta of the
   rounds really sent (``ab``), + each rank's off-wire CPU as the cores shared by every rank's
   (processor sharing: ``c max(1, P / cores)`` for alike work) and the links' I/O where,
   so stretched, it outlasts the wire (``+cpu``; the ranks of all hosts share this box's
   cores; the other job's ranks count by their share of a core), + the TCP terms (``+tcp``:
   the burst, per-message CPU, incast; the straggler's rounds at its calibrated link).
   The constants are fitted on the P <= 4 sweep and incast calls only; P = 8, the two jobs and
   the straggler are held out.

Prints the error table, writes ``benchmarks/logs/<date>-tcp-model.{log,json}``, the fitted
terms (``...-tcp-terms.json``, readable by ``gtopk-lab calibrate --tcp-terms``) and a figure
of measured vs predicted (PNG via kaleido when it works, and HTML).

Usage::

    sudo PYTHONPATH=. .venv/bin/python benchmarks/tcp_model.py [--quick]

Cost: about 4-6 minutes on the 2-core box (dense 25M at 200 Mbit/s is seconds a call).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tcp_model_report import environment, error_table, write_figure  # noqa: E402

from gtopk_lab.counts import parse_count_list, split_list  # noqa: E402
from gtopk_lab.network.calibrate import result_from_medians  # noqa: E402
from gtopk_lab.network.model import NetworkModel  # noqa: E402
from gtopk_lab.network.tcp_fit import fit_terms, merge_rank_reports, predict_row  # noqa: E402
from gtopk_lab.network.tcp_terms import TcpTerms  # noqa: E402
from gtopk_lab.testbed import Testbed, testbed_problem  # noqa: E402

PY = sys.executable
RANK = str(Path(__file__).resolve().parent / "tcp_model_rank.py")
SPARSE = ("topk_allgather", "gtopk_butterfly", "gtopk_tree", "oktopk_allreduce")
#: two sizes or more on each side of a shaper's bucket (a few kB at 200 Mbit/s), so its burst can be fitted
PINGPONG_SIZES = [1 << 10, 2 << 10, 4 << 10, 8 << 10, 16 << 10, 64 << 10, 1 << 20, 4 << 20]


def sweep_cases(numels: list[int], densities: list[float], repeats: int, big_repeats: int,
                incast: bool = True, small_repeats: int | None = None) -> list[dict[str, Any]]:
    """Step 2's cases, grouped by (numel, density) so a rank holds one size at a time.
    ``small_repeats`` (default ``repeats``): timed calls of the sparse cases below 10M elements,
    whose milliseconds vary most from call to call; dense from 10M on takes ``big_repeats``."""
    cases = []
    for numel in numels:
        big = numel >= 10_000_000
        reps = repeats if big or small_repeats is None else small_repeats
        cases.append({"collective": "ring_allreduce", "numel": numel, "density": densities[0],
                      "repeats": big_repeats if big else repeats})
        for density in densities:
            for name in SPARSE:
                cases.append({"collective": name, "numel": numel, "density": density, "repeats": reps})
            if incast and density == max(densities):
                cases.append({"collective": "incast", "numel": numel, "density": density, "repeats": reps})
    return cases


def held_out_cases(numel: int, density: float, repeats: int, small_repeats: int) -> list[dict[str, Any]]:
    """Steps 3-4's cases (two jobs, the straggler): each collective once at one size, the
    sparse ones timed ``small_repeats`` times, dense ``repeats``."""
    return [{"collective": c, "numel": numel, "density": density,
             "repeats": repeats if c == "ring_allreduce" else small_repeats}
            for c in ("ring_allreduce", *SPARSE)]


def run_group(tb: Testbed, hosts: list[int], cases: list[dict[str, Any]], tag: str, port: int,
              extra: dict[str, Any] | None = None, timeout_s: float = 420.0) -> list[subprocess.Popen]:
    """Start one gloo group, rank r in host ``hosts[r]``; returns the processes (not waited)."""
    out = tb.folder / tag
    out.mkdir(parents=True, exist_ok=True)
    spec = {"world": len(hosts), "addresses": [tb.address(h) for h in hosts], "port": port,
            "cases": cases, "out": str(out), "timeout_s": timeout_s, **(extra or {})}
    (out / "spec.json").write_text(json.dumps(spec))
    return [tb.popen(h, [PY, RANK, str(out / "spec.json"), str(r)], log=f"{tag}-rank{r}.log")
            for r, h in enumerate(hosts)]


def wait_group(tb: Testbed, procs: list[subprocess.Popen], tag: str, timeout_s: float = 420.0
               ) -> list[dict[str, Any]]:
    """Wait for a group; every rank's JSON (RuntimeError with the logs' ends if one failed)."""
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.wait(timeout=max(1.0, deadline - time.monotonic()))
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"group {tag} failed: {[p.returncode for p in procs]}\n{tb.logs(1500)}")
    return [json.loads((tb.folder / tag / f"rank{r}.json").read_text()) for r in range(len(procs))]


def merge_ranks(ranks: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """One row per case from every rank's report (times: the slowest rank's)."""
    return [{"kind": kind, **row} for row in merge_rank_reports([r["cases"] for r in ranks])]


def calibrate(tb: Testbed, hosts: tuple[int, int] = (0, 1), tag: str = "calib") -> NetworkModel:
    """Step 1: ping-pong ``hosts``, fit alpha, beta and the shaper's burst (the model's
    ``tcp.burst_bytes``; ``gtopk-lab calibrate``'s fit, ``result_from_medians``: sizes on both
    sides of the bucket)."""
    start = time.monotonic()
    procs = run_group(tb, list(hosts), [], tag, 29600,
                      {"pingpong_sizes": PINGPONG_SIZES, "pingpong_repeats": 5})
    ranks = wait_group(tb, procs, tag)
    return result_from_medians({r: ranks[r]["pingpong_s"] for r in (0, 1)}, PINGPONG_SIZES, backend="testbed",
                               repeats=5, wall_s=time.monotonic() - start).model


def predict(rows: list[dict[str, Any]], net: NetworkModel, tcp: TcpTerms, cores_total: int,
            slow: NetworkModel) -> None:
    """Step 5 for every row, in place (``gtopk_lab.network.tcp_fit.predict_row``): the other
    job's ranks share the box's cores by the share of a call they spend on one
    (``cpu_contention.shared_contention``); the straggler's rounds that cross its link run on
    ``slow``, that link's calibration."""
    for row in rows:
        p = row["workers"]
        row.update(predict_row(net, tcp, row, cores_total, other_ranks=p if row["kind"] == "two jobs" else 0,
                               link=slow if row["kind"] == "straggler" else None,
                               slow_ranks=(p - 1,) if row["kind"] == "straggler" else ()))


def fit_and_predict(rows: list[dict[str, Any]], net: NetworkModel, cores_total: int,
                    slow: NetworkModel) -> TcpTerms:
    """Step 5 with the fit: every row priced with the fitted constants zero, the TCP terms
    fitted on the P <= 4 sweep only (the held-out rows never shape them), every row priced
    again with them; returns the fitted terms."""
    predict(rows, net, TcpTerms(), cores_total, slow)
    train = [r for r in rows if r["kind"] == "sweep" and r["workers"] <= 4]
    tcp = fit_terms(net, train, cores_total)
    predict(rows, net, tcp, cores_total, slow)
    return tcp


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="200mbit", help="every host's rate each way (default 200mbit)")
    parser.add_argument("--straggler-rate", default="50mbit", help="the straggler's rate (default 50mbit)")
    parser.add_argument("--workers", default="2,4,8")
    parser.add_argument("--numels", default="1M,25M")
    parser.add_argument("--densities", default="0.001,0.01")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per case (default 3)")
    parser.add_argument("--big-repeats", type=int, default=2, help="timed calls of 25M dense (default 2)")
    parser.add_argument("--small-repeats", type=int, default=9,
                        help="timed calls of each sparse case below 10M elements (default 9)")
    parser.add_argument("--quick", action="store_true", help="P = 2, 4 and 1M only (a smoke run)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "logs"))
    args = parser.parse_args()
    problem = testbed_problem()
    if problem is not None:
        print(f"tcp_model: {problem}", file=sys.stderr)
        return 2
    workers = [int(w) for w in split_list(args.workers)]
    numels = [int(n) for n in parse_count_list(args.numels)]
    densities = [float(d) for d in split_list(args.densities)]
    if args.quick:
        workers, numels = [w for w in workers if w <= 4], [min(numels)]
    t0 = time.monotonic()
    env = environment()
    rows: list[dict[str, Any]] = []
    hosts = max(workers)
    with Testbed(hosts=max(hosts, 2), rate=args.rate, name="tcpm", dask=False) as tb:
        net = calibrate(tb)
        print(f"calibrated: {net} ({time.monotonic() - t0:.0f} s)", flush=True)
        for p in workers:
            cases = sweep_cases(numels, densities, args.repeats, args.big_repeats,
                                small_repeats=args.small_repeats)
            rows += merge_ranks(wait_group(tb, run_group(tb, list(range(p)), cases, f"p{p}", 29601), f"p{p}"),
                                "sweep")
            print(f"P = {p} done ({time.monotonic() - t0:.0f} s)", flush=True)
        if hosts >= 4:
            half = hosts // 2
            cases = held_out_cases(min(numels), max(densities), args.repeats, args.small_repeats)
            base = {"slot_s": 4.0, "base_monotonic_s": time.monotonic() + 25.0}
            jobs = [run_group(tb, list(range(half)), cases, "jobA", 29602, base),
                    run_group(tb, list(range(half, hosts)), cases, "jobB", 29603, base)]
            for tag, procs in zip(("jobA", "jobB"), jobs):
                rows += merge_ranks(wait_group(tb, procs, tag), "two jobs")
            print(f"two jobs done ({time.monotonic() - t0:.0f} s)", flush=True)
    rates = [args.rate] * 3 + [args.straggler_rate]
    with Testbed(hosts=4, rate=args.rate, rate_per_host=rates, name="tcps", dask=False) as tb:
        slow = calibrate(tb, (0, 3), "calib-straggler")
        print(f"straggler's link calibrated: {slow} ({time.monotonic() - t0:.0f} s)", flush=True)
        cases = held_out_cases(min(numels), max(densities), args.repeats, args.small_repeats)
        rows += merge_ranks(wait_group(tb, run_group(tb, [0, 1, 2, 3], cases, "strag", 29604), "strag"),
                            "straggler")
    print(f"straggler done ({time.monotonic() - t0:.0f} s)", flush=True)
    cores_total = env["cores"]
    tcp = fit_and_predict(rows, net, cores_total, slow)
    wall_s = time.monotonic() - t0
    table = error_table(rows)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    head = (f"# benchmarks/tcp_model.py {' '.join(sys.argv[1:])}\n# {env['cpu']}, {env['cores']} cores, "
            f"commit {env['commit']}, load before {env['load']}, after {environment()['load']}\n"
            f"# testbed: {max(hosts, 2)} hosts at {args.rate} (straggler {args.straggler_rate}), "
            f"wall {wall_s:.0f} s\n# calibrated: alpha {net.latency_s * 1e6:.1f} us, beta "
            f"{net.beta_s_per_byte:.4g} s/B ({net.bandwidth_bps / 1e6:.1f} Mbit/s), shaper's burst "
            f"{net.tcp.burst_bytes if net.tcp else 0:.0f} B; the straggler's link: alpha "
            f"{slow.latency_s * 1e6:.1f} us, {slow.bandwidth_bps / 1e6:.1f} Mbit/s\n"
            f"# fitted on P <= 4 sweep: {tcp}\n")
    text = head + table
    print(text)
    (out / f"{stamp}-tcp-model.log").write_text(text)
    (out / f"{stamp}-tcp-model.json").write_text(json.dumps(
        {"env": env, "args": vars(args), "network": net.to_dict(), "straggler_network": slow.to_dict(),
         "tcp": tcp.to_dict(),
         "rows": rows, "wall_s": wall_s}, indent=1))
    (out / f"{stamp}-tcp-terms.json").write_text(json.dumps(
        {"tcp": tcp.to_dict(), "fitted_on": "sweep calls P <= 4", "rate": args.rate,
         "commit": env["commit"]}, indent=2))
    print("figure:", write_figure(rows, out / f"{stamp}-tcp-model"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
