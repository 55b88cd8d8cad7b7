"""Training iteration time on the testbed: measured against the virtual clock's prediction (issue 28, item 5).

Root only (``gtopk_lab.testbed``; without it one line says why, exit 2). A testbed of
``max(--workers) + 1`` hosts on one bridge, every host's veth shaped to ``--rate`` both ways,
a real ``dask scheduler`` in host 0 and a ``dask worker`` in each other host:

1. **Calibrate** the link between two hosts: ``gtopk-lab calibrate --scheduler`` (ping-pong,
   alpha, beta and the shaper's burst; with ``--tcp-terms fit``, the default, also the TCP
   terms fitted on timed P = 2 calls over the link), saved as ``link.json``.
2. **Run**: for every method and P, ``gtopk-lab run --scheduler ... --bandwidth link.json``
   (``--model``, ``--density``, ``--iterations``), P ranks on P hosts through Dask.
3. **Per iteration**, rank 0's rows from the ``--skip``-th iteration on, medians:
   ``measured`` = the wall time between iterations less the clock's own synchronisation
   (``clock_s``: an all_reduce the run adds to keep the virtual clock, which the model does
   not price); ``clock`` = the virtual time between iterations: the rank's own CPU (compute,
   selection, update) + the communication the calibrated model charges (``comm_charge_s``),
   what the platform predicts for P hosts with these links and a core each;
   ``clock, shared cores`` = the same with the CPU part times ``max(1, P / cores)``: the
   testbed's hosts share this machine's cores, and the ranks compute between the same
   collectives (a real cluster has a core per rank; here P = 4 ranks share 2). The table also
   gives rank 0's measured ``comm_s`` (its collective alone, its wait for the last rank
   included) beside the charge, to split a miss between communication and computation.
4. Prints the table (errors of both predictions), writes ``<out>/<date>-testbed-iterations.
   {log,json}`` and a figure of measured vs predicted iteration time (PNG via kaleido when it
   works, and HTML).

Usage::

    sudo PYTHONPATH=. .venv/bin/python benchmarks/testbed_iterations.py [--workers 2,4] [--methods ...]

Cost: about 3-4 minutes on the 2-core box at the defaults (dense at 200 Mbit/s is ~70 ms an
iteration at P = 4; each run starts its ranks through the scheduler in ~5 s).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tcp_model_report import environment, save_figure  # noqa: E402

from gtopk_lab.counts import split_list  # noqa: E402
from gtopk_lab.testbed import Testbed, testbed_problem  # noqa: E402

CLI = [sys.executable, "-m", "gtopk_lab.cli"]
REPO = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    """The repository importable by the hosts' processes (the testbed already drops
    ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``: ranks find their host's own interface)."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def iteration_times(metrics: pd.DataFrame, workers: int, cores: int, skip: int) -> dict[str, float]:
    """Step 3 of the module docstring for one run's rows (rank 0's, iterations >= ``skip``):
    medians over iterations of ``measured_s``, ``clock_s`` (virtual) and ``shared_s``, and of
    the parts: ``cpu_s`` (virtual time less the communication charge) and ``comm_charge_s``."""
    rows = metrics[(metrics["kind"] == "iter") & (metrics["rank"] == 0)].sort_values("iteration")
    wall, virtual = rows["wall_time_s"].diff(), rows["virtual_time_s"].diff()
    keep = rows["iteration"] >= skip
    if int(keep.sum()) < 3:
        raise ValueError(f"skip={skip} is invalid: it leaves {int(keep.sum())} iterations of {len(rows)}")
    measured = (wall - rows["clock_s"])[keep]
    charge = rows["comm_charge_s"][keep]
    cpu = (virtual[keep] - charge).clip(lower=0.0)
    s = max(1.0, workers / cores)
    return {"measured_s": float(measured.median()), "clock_s": float(virtual[keep].median()),
            "shared_s": float((cpu * s + charge).median()), "cpu_s": float(cpu.median()),
            "comm_charge_s": float(charge.median()), "comm_s": float(rows["comm_s"][keep].median()),
            "contention": s, "iterations": int(keep.sum())}


def _err(pred: float, meas: float) -> str:
    return f"{(pred - meas) / meas:+.0%}"


def table(rows: list[dict[str, Any]]) -> str:
    """One line per run: measured and both predictions (ms) with their errors."""
    lines = ["| method | P | measured ms | comm measured ms | own CPU ms | comm charge ms | clock ms | err clock "
             "| clock, shared cores ms | err shared |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["measured_s"]
        lines.append(f"| {r['method']} | {r['workers']} | {m * 1e3:.2f} | {r['comm_s'] * 1e3:.2f} "
                     f"| {r['cpu_s'] * 1e3:.2f} "
                     f"| {r['comm_charge_s'] * 1e3:.2f} | {r['clock_s'] * 1e3:.2f} | {_err(r['clock_s'], m)} "
                     f"| {r['shared_s'] * 1e3:.2f} | {_err(r['shared_s'], m)} |")
    return "\n".join(lines) + "\n"


def write_figure(rows: list[dict[str, Any]], stem: Path) -> str:
    """Measured vs predicted iteration time (log-log, y = x dashed), both predictions; PNG through
    kaleido when it works, and always HTML; returns the paths written."""
    import plotly.graph_objects as go

    fig = go.Figure()
    meas = [r["measured_s"] * 1e3 for r in rows]
    text = [f"{r['method']} P={r['workers']}" for r in rows]
    fig.add_trace(go.Scatter(x=meas, y=[r["clock_s"] * 1e3 for r in rows], mode="markers+text", text=text,
                             textposition="top center", name="virtual clock (a core per rank)",
                             marker={"symbol": "circle-open", "size": 10}))
    fig.add_trace(go.Scatter(x=meas, y=[r["shared_s"] * 1e3 for r in rows], mode="markers",
                             name="virtual clock, CPU x P / cores (the testbed's shared cores)", text=text,
                             marker={"size": 8}))
    values = meas + [r["clock_s"] * 1e3 for r in rows] + [r["shared_s"] * 1e3 for r in rows]
    lo, hi = min(values) * 0.7, max(values) * 1.4
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="measured = predicted",
                             line={"dash": "dash", "color": "grey"}))
    fig.update_layout(title="Training iteration time on the testbed: measured vs predicted",
                      xaxis={"title": "measured ms per iteration (median, rank 0)", "type": "log"},
                      yaxis={"title": "predicted ms per iteration", "type": "log"}, width=900, height=650)
    return save_figure(fig, stem)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="200mbit", help="every host's rate each way (default 200mbit)")
    parser.add_argument("--workers", default="2,4", help="P values (default 2,4)")
    parser.add_argument("--methods", default="dense,topk,gtopk,oktopk")
    parser.add_argument("--model", default="cnn_wide")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--iterations", type=int, default=40, help="iterations per run (default 40)")
    parser.add_argument("--tcp-terms", default="fit", choices=("fit", "none"),
                        help="fit the TCP terms in the calibration (default) or alpha-beta only")
    parser.add_argument("--skip", type=int, default=5, help="iterations left out at the start (default 5)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "logs"))
    args = parser.parse_args()
    problem = testbed_problem()
    if problem is not None:
        print(f"testbed_iterations: {problem}", file=sys.stderr)
        return 2
    workers = [int(w) for w in split_list(args.workers)]
    methods = split_list(args.methods)
    if not workers or min(workers) < 2:
        print(f"testbed_iterations: --workers {args.workers!r} is invalid: expected P values >= 2", file=sys.stderr)
        return 2
    t0, env = time.monotonic(), environment()
    cores = env["cores"]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="titer-") as tmp:
        folder = Path(tmp)
        with Testbed(hosts=max(workers) + 1, rate=args.rate, name="titer", worker_args=["--no-nanny"],
                     folder=folder, env=_env()) as tb:
            link = folder / "link.json"
            cal = tb.run(0, [*CLI, "calibrate", "--scheduler", tb.scheduler_address, "--sizes",
                             "1K,2K,4K,8K,16K,64K,256K,1M,4M", "--repeats", "5", "--out", str(link),
                             *(["--tcp-terms", "fit"] if args.tcp_terms == "fit" else [])], timeout_s=300)
            if cal.returncode != 0:
                print(f"testbed_iterations: calibration failed: {cal.stderr.strip()[-500:]}", file=sys.stderr)
                return 1
            calibration = json.loads(link.read_text())
            print(f"calibrated ({time.monotonic() - t0:.0f} s): {calibration.get('name', link.name)}", flush=True)
            for p in workers:
                for method in methods:
                    res = tb.run(0, [*CLI, "run", "--scheduler", tb.scheduler_address, "--method", method,
                                     "--workers", str(p), "--model", args.model, "--density", str(args.density),
                                     "--epochs", "1", "--max-iterations", str(args.iterations),
                                     "--bandwidth", str(link), "--out", str(folder / "runs"),
                                     "--no-progress", "--json"], timeout_s=600)
                    if res.returncode != 0:
                        print(f"testbed_iterations: {method} P = {p} failed: {res.stderr.strip()[-800:]}",
                              file=sys.stderr)
                        return 1
                    summary = json.loads(res.stdout.strip().splitlines()[-1])
                    metrics = pd.read_parquet(folder / "runs" / summary["run_id"] / "metrics.parquet")
                    row = {"method": method, "workers": p, "k": summary.get("k"),
                           **iteration_times(metrics, p, cores, args.skip)}
                    rows.append(row)
                    print(f"{method} P = {p}: measured {row['measured_s'] * 1e3:.2f} ms, clock "
                          f"{row['clock_s'] * 1e3:.2f}, shared cores {row['shared_s'] * 1e3:.2f} "
                          f"({time.monotonic() - t0:.0f} s)", flush=True)
    wall = time.monotonic() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{datetime.date.today().isoformat()}-testbed-iterations"
    header = (f"# benchmarks/testbed_iterations.py --workers {args.workers} --methods {args.methods} "
              f"--model {args.model} --density {args.density} --iterations {args.iterations} "
              f"--tcp-terms {args.tcp_terms}\n"
              f"# {env['cpu']}, {cores} cores, commit {env['commit']}, load {env['load']}\n"
              f"# testbed: {max(workers) + 1} hosts at {args.rate}; link: alpha "
              f"{calibration['latency_s'] * 1e6:.1f} us, {calibration['bandwidth_bps'] / 1e6:.1f} Mbit/s, "
              f"TCP terms {json.dumps(calibration.get('tcp'))}; "
              f"wall {wall:.0f} s\n")
    text = header + table(rows)
    print(text)
    stem.with_suffix(".log").write_text(text)
    stem.with_suffix(".json").write_text(json.dumps({"env": env, "args": vars(args), "calibration": calibration,
                                                     "rows": rows, "wall_s": wall}, indent=1))
    print("figure:", write_figure(rows, stem))
    return 0


if __name__ == "__main__":
    sys.exit(main())
