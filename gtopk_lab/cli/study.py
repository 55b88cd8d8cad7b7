"""``gtopk-lab study``: a grid of runs on the cluster (methods x P x network x density x seeds)
and its scaling-efficiency table, mean +- std over seeds, with the model check.

``gtopk-lab study --methods dense,topk,gtopk --workers 1,2,4,8,16 --bandwidth 1GbE,10GbE
--seeds 3``:

1. the grid (:func:`~gtopk_lab.orchestration.study_grid.expand_grid`) is validated before
   anything starts: an empty list, a P below 1, an unknown method or seeds < 1 exit 2
   with one line
2. an embedded LocalCluster of ``--n-workers`` (default: the largest P, at most this
   machine's cores) or ``--scheduler``; P up to its workers (``--real-max-workers``) run
   as real ranks, larger P as simulator tasks on the workers; ``--both-ways 2`` runs P = 2
   both ways (the fidelity check); ``--simulate`` simulates every point
3. a progress bar over points; Ctrl-C cancels the running runs within 10 s, keeps the
   completed points, and the same command afterwards runs only what is missing
4. the table (efficiency per method, P, source: mean +- std, n), the baseline note and
   the check against the alpha-beta(-gamma) prediction

Every rank, real or simulated, is charged its workload's compute time and merge gamma,
calibrated once on a worker and kept in ``--out`` (``--compute calibrated``, the default:
:mod:`gtopk_lab.orchestration.calibration`); ``--compute measured`` charges each rank its
own CPU time, which on a shared or oversubscribed machine measures the contention.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import pandas as pd

from gtopk_lab.cli import run as run_cmd
from gtopk_lab.cli.errors import UsageError
from gtopk_lab.cli.lists import LIST_FLAG, parse_list
from gtopk_lab.config_flags import add_config_flags, config_kwargs
from gtopk_lab.jsonsafe import json_safe
from gtopk_lab.network.model import DEFAULT_NETWORK, format_bandwidth

NAME = "study"
HELP = "run a study (methods x workers x network x density x seeds) on the cluster; print efficiency"

#: RunConfig fields the study takes as comma-separated lists.
GRID_FLAGS: dict[str, str] = {"methods": "method", "workers": "workers", "density": "density",
                              "bandwidth": "bandwidth", "latency": "latency", "algorithms": "algorithm"}
#: Exit status after Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED_EXIT = 130


def add_arguments(parser: argparse.ArgumentParser) -> None:
    grid = parser.add_argument_group("grid (lists: commas, spaces or both)")
    grid.add_argument("--methods", default="dense,topk,gtopk", help="default dense,topk,gtopk", **LIST_FLAG)
    grid.add_argument("--workers", default="1,2,4", help="ranks P (default 1,2,4; dense P=1 always runs)", **LIST_FLAG)
    grid.add_argument("--density", default="0.01", help="densities rho (default 0.01)", **LIST_FLAG)
    grid.add_argument("--bandwidth", default=DEFAULT_NETWORK, **LIST_FLAG,
                      help=f"modelled links (default {DEFAULT_NETWORK}, with its latency; none: no communication cost)")
    grid.add_argument("--latency", default=None, help="latencies (default: the link's own)", **LIST_FLAG)
    grid.add_argument("--algorithms", default="butterfly", help="gTop-k patterns (default butterfly)", **LIST_FLAG)
    grid.add_argument("--seeds", type=int, default=1, help="seeds per point: seed .. seed+n-1 (default 1)")
    parser.add_argument("--real-max-workers", type=int, default=None,
                        help="largest P on real ranks (default: the cluster's workers); larger P simulated")
    parser.add_argument("--both-ways", default="", help="P values run real and simulated (fidelity check)",
                        **LIST_FLAG)
    parser.add_argument("--simulate", action="store_true", help="simulate every point (on the cluster)")
    parser.add_argument("--no-skip", action="store_true", help="rerun points already completed in --out")
    parser.add_argument("--json", action="store_true", help="print the table as JSON records (last line)")
    parser.add_argument("--compute", choices=("calibrated", "measured"), default="calibrated",
                        help="compute and merges charged to each rank: calibrated once per workload on a "
                             "worker (default) or each rank's measured CPU time")
    add_config_flags(parser, exclude=set(GRID_FLAGS.values()) | {"run_id", "seed"})
    parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    run_cmd.add_identity_arguments(parser)
    run_cmd.add_cluster_arguments(parser)


def grid_axes(args: argparse.Namespace) -> dict[str, Any]:
    """The study's axes from the flags (lists checked here; values by RunConfig)."""
    axes: dict[str, Any] = {"method": parse_list(args.methods, "--methods"),
                            "workers": parse_list(args.workers, "--workers", int),
                            "density": parse_list(args.density, "--density", float),
                            "bandwidth": parse_list(args.bandwidth, "--bandwidth"),
                            "algorithm": parse_list(args.algorithms, "--algorithms")}
    if args.latency is not None:
        axes["latency"] = parse_list(args.latency, "--latency")
    if args.seeds < 1:
        raise UsageError(f"--seeds={args.seeds} is invalid: expected n >= 1")
    axes["seeds"] = args.seeds
    return axes


def build_points(args: argparse.Namespace, real_max_workers: int) -> list[Any]:
    """The validated points (exit 2 on bad input, before any cluster starts)."""
    from gtopk_lab.orchestration.study_grid import expand_grid

    base = config_kwargs(args, exclude=set(GRID_FLAGS.values()) | {"run_id"})
    try:
        both = parse_list(args.both_ways, "--both-ways", int) if args.both_ways.strip() else []
        points = expand_grid(base, grid_axes(args), real_max_workers=real_max_workers,
                             both_ways=both, simulate=args.simulate)
        for point in points:
            run_cmd.validate_config(point.config)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    return points


def embedded_workers(args: argparse.Namespace, largest_p: int) -> int:
    """Workers of the embedded cluster: ``--n-workers``, else the largest P, at most the cores."""
    if args.n_workers is not None:
        return args.n_workers
    return max(1, min(largest_p, os.cpu_count() or 1))


def format_efficiency(table: pd.DataFrame) -> str:
    """Method x P rows with ``mean +- std [95% CI] (n)`` efficiencies in percent (no
    interval with one seed)."""
    if table.empty:
        return "(no completed points)"
    shown = table.copy()
    nan = pd.Series(float("nan"), index=shown.index)
    shown["efficiency"] = [
        ("" if pd.isna(m) else f"{m:.1%}") + ("" if pd.isna(s) else f" +- {s:.1%}")
        + ("" if pd.isna(lo) or pd.isna(hi) else f" [{lo:.1%}, {hi:.1%}]") + f" (n={n})"
        + (" provisional" if p else "")
        for m, s, lo, hi, n, p in zip(shown["efficiency_mean"], shown["efficiency_std"],
                                      shown.get("efficiency_ci_low", nan), shown.get("efficiency_ci_high", nan),
                                      shown["n"], shown["provisional"])]
    shown["density"] = shown["density"].map(lambda d: "-" if pd.isna(d) else f"{d:g}")
    shown["link"] = shown["bandwidth_bps"].map(lambda b: "unthrottled" if b == float("inf") else format_bandwidth(b))
    return shown[["method", "density", "link", "source", "workers", "efficiency"]].to_string(index=False)


def run(args: argparse.Namespace) -> int:
    from gtopk_lab.analysis.scaling import baseline_note
    from gtopk_lab.orchestration.study import Study

    run_cmd.validate_cluster_args(args)
    study_id, tags = run_cmd.identity_args(args)
    if args.real_max_workers is not None and args.real_max_workers < 0:
        raise UsageError(f"--real-max-workers={args.real_max_workers} is invalid: expected >= 0")
    largest = max(parse_list(args.workers, "--workers", int))
    n_workers = embedded_workers(args, largest) if args.scheduler is None else None
    real_max = args.real_max_workers if args.real_max_workers is not None else (n_workers or largest)
    points = build_points(args, real_max)
    progress = not args.no_progress and not args.json
    with run_cmd.open_lab(args, n_workers or 1, progress=progress) as lab:
        if args.scheduler is not None and args.real_max_workers is None:
            points = build_points(args, len(lab.worker_info()))
        if args.compute == "calibrated":
            from gtopk_lab.orchestration.calibration import CALIBRATION_FILE, with_calibrated_costs

            points = with_calibrated_costs(lab, points, args.out)
            if not args.json:
                shown = sorted({p.config.compute_charge.compute_time_s * 1e3 for p in points})
                print(f"compute: {', '.join(f'{ms:.2f}' for ms in shown)} ms per iteration charged to every rank, "
                      f"merges at a calibrated gamma and each sparse method's calibrated selection "
                      f"({os.path.join(str(args.out), CALIBRATION_FILE)}); communication modelled", file=sys.stderr)
        study = Study(lab, points, skip_completed=not args.no_skip, progress=progress,
                      study_id=study_id, tags=tags)
        if not args.json:
            print(f"study {study.study_id}: {len(points)} point(s)"
                  + (f", tags {', '.join(tags)}" if tags else ""), file=sys.stderr)
        try:
            study.wait(cancel_on_interrupt=True)
        except KeyboardInterrupt:
            done = int((study.status()["status"].str.startswith("completed")).sum())
            print(f"\ninterrupted: cancelled the running runs; {done} completed point(s) kept in "
                  f"{args.out}; run the same command again to resume", file=sys.stderr)
            return INTERRUPTED_EXIT
        table = study.efficiency()
        lines = study.check_lines()
        failed = int((~study.status()["status"].str.startswith("completed")).sum())
    if args.json:
        print(json.dumps(json_safe(table.to_dict(orient="records")), separators=(",", ":")))
    else:
        print(format_efficiency(table))
        print(baseline_note(["dense P=1"]) + " Seeds and sources (real / simulated) have their own baseline.")
        for line in lines:
            print(line)
        print(f"\n{len(points)} point(s), {failed} not completed; results in {args.out} "
              f"(gtopk-lab runs --study {study.study_id})")
    return 0 if failed == 0 else 1
