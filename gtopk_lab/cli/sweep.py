"""``gtopk-lab sweep``: a grid of runs (methods x P x density x bandwidth) and its
scaling-efficiency table.

Scaling efficiency of method m at P workers = throughput(m, P) / (P * throughput(dense, 1))
(samples per second; the paper's definition, ``gtopk_lab.analysis.scaling.add_scaling_efficiency``),
computed both on the virtual clock (modelled network, ``--bandwidth``) and on the wall clock.
When dense is among ``--methods`` the grid always holds dense at P=1 (the baseline), even if
``--workers`` leaves 1 out; without it each method falls back to its own P=1 run and the
table's ``baseline`` column says so. The sweep is resumable: configs that already completed in
``--out`` are not run again; a damaged run folder there is renamed ``<run>.damaged-<UTC stamp>``
(with a warning) and its config runs again.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from typing import Any

import pandas as pd

from gtopk_lab.cli.errors import UsageError
from gtopk_lab.cli.lists import LIST_FLAG, parse_list
from gtopk_lab.cli import run as run_cmd
from gtopk_lab.config import RunConfig
from gtopk_lab.config_flags import add_config_flags, config_kwargs
from gtopk_lab.jsonsafe import json_safe
from gtopk_lab.methods import BASELINE_METHOD, display_order, get_method, patterns_of
from gtopk_lab.network.model import DEFAULT_NETWORK, bandwidth_label
from gtopk_lab.analysis.scaling import add_scaling_efficiency, baseline_note

NAME = "sweep"
HELP = "run a grid of configs (methods x workers x density x bandwidth) and print scaling efficiency"

#: RunConfig fields that the sweep takes as comma-separated lists instead.
GRID_FIELDS = {"method", "workers", "density", "bandwidth", "algorithm"}


def _split(text: str, flag: str) -> list[str]:
    return parse_list(text, flag)  # commas, spaces or both (gtopk_lab.cli.lists)


def _ints(text: str, flag: str) -> list[int]:
    return parse_list(text, flag, int)


def _floats(text: str, flag: str) -> list[float]:
    return parse_list(text, flag, float)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    grid = parser.add_argument_group("grid (lists: commas, spaces or both)")
    grid.add_argument("--methods", default="dense,topk,gtopk", help="default dense,topk,gtopk", **LIST_FLAG)
    grid.add_argument("--workers", default="1,2,4",
                      help="ranks P per run (default 1,2,4; dense also runs at P=1, the efficiency baseline)",
                      **LIST_FLAG)
    grid.add_argument("--density", default="0.01", help="densities rho (default 0.01; dense ignores it)", **LIST_FLAG)
    grid.add_argument("--bandwidth", default=DEFAULT_NETWORK, **LIST_FLAG,
                      help=f"modelled links (default {DEFAULT_NETWORK}, with its latency; none: no communication cost)")
    grid.add_argument("--algorithms", default="butterfly", help="gTop-k patterns (default butterfly)", **LIST_FLAG)
    add_config_flags(parser, exclude=GRID_FIELDS | {"run_id"})
    run_cmd.add_identity_arguments(parser)
    run_cmd.add_cluster_arguments(parser)
    parser.add_argument("--simulate", action="store_true",
                        help="simulator tasks on the cluster's workers: P may exceed the cluster")
    parser.add_argument("--no-skip", action="store_true", help="rerun configs already completed in --out")
    parser.add_argument("--json", action="store_true", help="print the table as JSON records (last line)")


def build_grid(args: argparse.Namespace) -> list[RunConfig]:
    """The validated configs of the sweep, in a stable order (P ascending inside each group).

    Dense S-SGD does not depend on density or on the gTop-k pattern, so it is run
    once per (P, bandwidth) with the first density listed, and always at P=1 too: that
    run is the baseline of every efficiency in its bandwidth's group.
    """
    methods = _split(args.methods, "--methods")
    workers = _ints(args.workers, "--workers")
    densities = _floats(args.density, "--density")
    bandwidths = _split(args.bandwidth, "--bandwidth")
    algorithms = _split(args.algorithms, "--algorithms")
    base = config_kwargs(args, exclude=GRID_FIELDS | {"run_id"})
    configs: list[RunConfig] = []
    seen: set[tuple[Any, ...]] = set()
    for method, bandwidth, density, algorithm, p in itertools.product(
            methods, bandwidths, densities, algorithms, sorted(set(workers) | {1})):
        if p == 1 and 1 not in workers and method != BASELINE_METHOD:
            continue
        if get_method(method).dense:  # density does not apply: one density and pattern
            density, algorithm = densities[0], algorithms[0]
        elif not get_method(method).patterns:  # no pattern to choose (Top-k, Ok-Topk): one run
            algorithm = algorithms[0]
        key = (method, bandwidth, density, algorithm, p)
        if key in seen:
            continue
        seen.add(key)
        config = RunConfig(**base, method=method, workers=p, density=density, bandwidth=bandwidth,
                           algorithm=algorithm)
        configs.append(config)
    for config in configs:
        run_cmd.validate_config(config)
    return configs


def sweep_table(summaries: pd.DataFrame) -> pd.DataFrame:
    """One row per completed run of the sweep: throughput and scaling efficiency (the long
    table the sweep prints; ``analysis.scaling.scaling_table`` is the method x P pivot).

    Efficiency follows the project's rule (``add_scaling_efficiency``): against dense S-SGD
    at P=1 of the same model, batch and network, else the method's own P=1 run, as the
    ``baseline`` column says ("dense P=1" / "own P=1" / "none": NaN). ``efficiency_virtual``
    uses ``samples_per_s_virtual`` (modelled network), ``efficiency_wall`` the wall clock.
    """
    columns = ["method", "algorithm", "density", "bandwidth", "workers", "iterations",
               "iter_time_virtual_s", "samples_per_s_virtual", "efficiency_virtual",
               "samples_per_s_wall", "efficiency_wall", "baseline", "final_test_accuracy", "status"]
    if summaries.empty:
        return pd.DataFrame(columns=columns)
    frame = summaries.copy()
    for col in ("algorithm", "bandwidth", "samples_per_s_virtual", "samples_per_s_wall",
                "virtual_time_s", "iterations", "final_test_accuracy"):
        if col not in frame.columns:
            frame[col] = None
    frame = frame[frame["status"] == "completed"].copy()
    for col in ("samples_per_s_virtual", "samples_per_s_wall", "virtual_time_s", "iterations"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    frame["iter_time_virtual_s"] = frame["virtual_time_s"] / frame["iterations"]
    frame = add_scaling_efficiency(frame, times=("virtual", "wall"))
    shown = ["method", "density", "bandwidth", "algorithm"]
    frame[shown] = frame[shown].astype(str)
    frame["bandwidth"] = frame["bandwidth"].map(bandwidth_label)  # calibrated: its name
    frame["_m"] = frame["method"].map(lambda m: display_order(m)[0])
    frame = frame.sort_values(["bandwidth", "density", "_m", "algorithm", "workers"])
    return frame[columns].reset_index(drop=True)


def format_table(table: pd.DataFrame) -> str:
    if table.empty:
        return "(no completed runs)"
    shown = table.copy()
    for col in ("efficiency_virtual", "efficiency_wall", "final_test_accuracy"):
        shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else f"{float(v):.1%}")
    for col in ("samples_per_s_virtual", "samples_per_s_wall"):
        shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else f"{float(v):.0f}")
    shown["iter_time_virtual_s"] = shown["iter_time_virtual_s"].map(
        lambda v: "" if pd.isna(v) else f"{float(v) * 1e3:.2f} ms")
    shown = shown.rename(columns={"iter_time_virtual_s": "iter_virtual", "samples_per_s_virtual":
                                  "samples/s_virt", "efficiency_virtual": "eff_virt",
                                  "samples_per_s_wall": "samples/s_wall", "efficiency_wall": "eff_wall",
                                  "final_test_accuracy": "test_acc"})
    # The pattern means nothing for a method without a choice of patterns (the registry says).
    shown["algorithm"] = shown["algorithm"].where(shown["method"].map(lambda m: bool(patterns_of(m))), "-")
    text = shown.drop(columns=["status"]).to_string(index=False)
    return "\n".join((text, baseline_note(table["baseline"]),
                      clock_note(int(pd.to_numeric(table["workers"]).max()))))


def clock_note(max_workers: int, cores: int | None = None) -> str:
    """Which clock to read: virtual when ranks outnumber this machine's cores."""
    cores = cores or os.cpu_count() or 1
    if max_workers > cores:
        return (f"note: up to {max_workers} ranks ran on {cores} CPU cores, so wall-clock figures "
                "(samples/s_wall, eff_wall) measure CPU contention; read the virtual ones "
                "(measured compute and merge CPU time + modelled network, docs/network.md).")
    return ("note: virtual = measured compute and merge CPU time + modelled network; wall = real clock "
            "(one rank per core here, so both are meaningful).")


def execute_sweep(args: argparse.Namespace, configs: list[RunConfig], progress: bool) -> pd.DataFrame:
    """Run (or skip) every config as one study (real ranks, or with ``--simulate`` simulator
    tasks on the cluster's workers); return the summaries of this sweep."""
    from gtopk_lab.cli.study import embedded_workers

    if args.simulate:
        need = embedded_workers(args, len(configs))  # simulations run side by side
    else:
        need = max(c.workers for c in configs)
    with run_cmd.open_lab(args, need, progress=progress) as lab:
        study_id, tags = run_cmd.identity_args(args)
        return lab.sweep(configs, skip_completed=not args.no_skip, progress=progress,
                         simulate=args.simulate, study_id=study_id, tags=tags)


def run(args: argparse.Namespace) -> int:
    configs = build_grid(args)
    run_cmd.validate_cluster_args(args)
    run_cmd.identity_args(args)  # bad --study-id / --tag: exit 2 before a cluster starts
    progress = not args.no_progress and not args.json
    try:
        summaries = execute_sweep(args, configs, progress)
    except KeyboardInterrupt:  # the study cancelled its running runs before re-raising
        print(f"\ninterrupted: cancelled the running runs; completed points are kept in {args.out}; "
              "run the same command again to resume", file=sys.stderr)
        return 130
    table = sweep_table(summaries)
    failed = int((summaries.get("status") != "completed").sum()) if len(summaries) else 0
    if args.json:
        print(json.dumps(json_safe(table.to_dict(orient="records")), separators=(",", ":")))
    else:
        print(format_table(table))
        print(f"\n{len(summaries)} run(s), {failed} not completed; results in {args.out}")
    return 0 if failed == 0 else 1
