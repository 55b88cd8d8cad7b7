"""``gtopk-lab demo``: what ``make demo`` runs.

A small sweep on an embedded LocalCluster (4 worker processes on 127.0.0.1): MNIST-1D
1-D CNN, dense / Top-k / gTop-k S-SGD at P in {1, 2, 4}, density 0.01, the paper's
fitted 1 GbE network (alpha 0.436 ms, beta 9e-9 s/B) in virtual time, a few hundred
iterations at most. With that latency the message counts matter as in the paper: at P = 4
gTop-k's virtual scaling efficiency comes out well above dense's and Top-k's. It prints the
scaling-efficiency table (every method divided by the dense P = 1 run, the paper's definition;
see ``gtopk_lab.analysis.scaling.add_scaling_efficiency``) and writes the HTML report
(``gtopk_lab.plotting.report.write_report``, same rule) to ``<out>/report.html``. Takes a few minutes on 2 cores; rerunning it skips the runs
already completed in ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gtopk_lab.cli.errors import UsageError
from gtopk_lab.cli import run as run_cmd
from gtopk_lab.cli import sweep as sweep_cmd

NAME = "demo"
HELP = "small MNIST-1D sweep (dense/topk/gtopk x P=1,2,4) on an embedded cluster + HTML report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="results/demo", help="results folder (default results/demo)")
    parser.add_argument("--methods", default="dense,topk,gtopk", help="default dense,topk,gtopk")
    parser.add_argument("--workers", default="1,2,4",
                        help="ranks P (default 1,2,4; dense also runs at P=1, the efficiency baseline)")
    parser.add_argument("--density", default="0.01", help="default 0.01")
    parser.add_argument("--bandwidth", default="1GbE",
                        help="modelled network (default 1GbE: the paper's fitted constants)")
    parser.add_argument("--max-iterations", type=int, default=250,
                        help="iterations per run (default 250)")
    parser.add_argument("--epochs", type=int, default=4,
                        help="epochs per run (default 4), capped by --max-iterations")
    parser.add_argument("--no-report", action="store_true", help="skip the HTML report")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--timeout", dest="timeout_s", type=float, default=60.0,
                        help="rendezvous/collective timeout per rank, s (default 60)")


def run(args: argparse.Namespace) -> int:
    if args.max_iterations < 1:
        raise UsageError(f"--max-iterations={args.max_iterations} is invalid: expected an integer >= 1")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out={args.out!r} is invalid: it exists and is not a folder")
    sweep_args = argparse.Namespace(
        methods=args.methods, workers=args.workers, density=args.density, bandwidth=args.bandwidth,
        algorithms="butterfly", model="cnn", dataset="mnist1d", max_iterations=args.max_iterations,
        epochs=args.epochs, train_samples=4000, test_samples=1000, sink_every=10,
        scheduler=None, n_workers=None, tls_ca_file=None, tls_cert=None, tls_key=None,
        timeout_s=args.timeout_s, connect_timeout_s=10.0, out=str(out), no_progress=args.no_progress,
        simulate=False, no_skip=False, json=False,
    )
    configs = sweep_cmd.build_grid(sweep_args)
    run_cmd.validate_cluster_args(sweep_args)
    print(f"gtopk-lab demo: {len(configs)} runs on an embedded Dask cluster -> {out}", file=sys.stderr)
    summaries = sweep_cmd.execute_sweep(sweep_args, configs, progress=not args.no_progress)
    table = sweep_cmd.sweep_efficiency_table(summaries)
    print(sweep_cmd.format_table(table))
    failed = int((summaries["status"] != "completed").sum()) if len(summaries) else 0
    print(f"\n{len(summaries)} run(s), {failed} not completed; results in {out}")
    if not args.no_report:
        try:
            from gtopk_lab.plotting.report import write_report
        except ImportError:
            print("note: gtopk_lab.plotting.report is not available; skipped the HTML report", file=sys.stderr)
        else:
            html = write_report(out, out / "report.html")
            print(f"report: {html}")
    return 0 if failed == 0 else 1
