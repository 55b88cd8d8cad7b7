"""``gtopk-lab runs``: list the runs stored in a results folder (the results home by default),
each study's runs together; ``--study ID`` / ``--tag T`` / ``--status S`` keep some of them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gtopk_lab.cli import run as run_cmd
from gtopk_lab.cli.errors import UsageError
from gtopk_lab.jsonsafe import json_safe

NAME = "runs"
HELP = "list stored runs (status, method, P, density, accuracy, throughput) of a results folder"

COLUMNS: tuple[str, ...] = ("study", "run_id", "status", "method", "workers", "density", "bandwidth",
                            "iterations", "final_test_accuracy", "samples_per_s_virtual",
                            "wall_time_s", "queue_reason")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results_dir", nargs="?", default=None,
                        help="results folder, as `gtopk-lab report` takes it (the same as --out)")
    run_cmd.add_out_argument(parser)
    parser.add_argument("--json", action="store_true",
                        help="print every summary as one JSON list (last line)")
    parser.add_argument("--status", default=None,
                        help="only runs with this status (completed, failed, cancelled, running, queued, "
                             "crashed: its client stopped sending heartbeats, unknown)")
    parser.add_argument("--study", action="append", default=None, metavar="ID",
                        help="only runs of this study (gtopk-lab study --study-id; repeat for any of several)")
    parser.add_argument("--tag", action="append", default=None, metavar="T",
                        help="only runs with this tag (repeat: with every one of them)")


def run(args: argparse.Namespace) -> int:
    from gtopk_lab.orchestration.results import LISTED_STATUSES, load_summaries
    from gtopk_lab.orchestration.run_identity import filter_runs, study_order

    if args.results_dir is not None:
        if args.out != _default_out() and Path(args.out) != Path(args.results_dir):
            raise UsageError(f"results_dir={args.results_dir!r} and --out={args.out!r} are two folders: "
                             "give one")
        if not Path(args.results_dir).is_dir():
            raise UsageError(f"results_dir={args.results_dir!r} is invalid: no such folder")
        args.out = args.results_dir
    if not Path(args.out).is_dir():
        raise UsageError(f"--out={args.out!r} is invalid: no such folder")
    if args.status is not None and args.status not in LISTED_STATUSES:
        raise UsageError(f"--status={args.status!r} is invalid: expected one of {', '.join(LISTED_STATUSES)}")
    summaries = study_order(filter_runs(load_summaries(args.out), args.study, args.tag))
    if args.status is not None:
        summaries = summaries[summaries["status"] == args.status]
    if args.json:
        records = summaries.drop(columns=["path"], errors="ignore").to_dict(orient="records")
        print(json.dumps(json_safe(records), separators=(",", ":")))
        return 0
    if summaries.empty:
        which = "".join(f" {flag} {v}" for flag, vs in (("--study", args.study), ("--tag", args.tag))
                        for v in vs or ())
        print(f"no runs in {args.out}" + (f" matching{which}" if which else ""))
        return 0
    summaries = summaries.assign(study=[_study_text(r) for r in summaries.to_dict("records")])
    shown = summaries[[c for c in COLUMNS if c in summaries.columns]].copy()
    if not shown["study"].astype(bool).any():
        shown = shown.drop(columns=["study"])
    if "final_test_accuracy" in shown:
        shown["final_test_accuracy"] = shown["final_test_accuracy"].map(
            lambda v: "" if v is None or v != v else f"{float(v):.1%}")
    for col in ("samples_per_s_virtual", "wall_time_s"):
        if col in shown:
            shown[col] = shown[col].map(lambda v: "" if v is None or v != v else f"{float(v):.4g}")
    if "queue_reason" in shown:  # why a queued run waits; blank for every other run
        shown["queue_reason"] = [r if s == "queued" and isinstance(r, str) else ""
                                 for s, r in zip(shown["status"], shown["queue_reason"])]
        if not shown["queue_reason"].any():
            shown = shown.drop(columns=["queue_reason"])
    print(shown.fillna("").to_string(index=False))
    return 0


def _default_out() -> str:
    """``--out``'s default (the results home), to tell it from a folder given twice."""
    from gtopk_lab.results_home import results_home

    return str(results_home())


def _study_text(row: dict) -> str:
    """The run's studies (first the one that ran it) and tags, as one cell."""
    ids = [s for s in row.get("study_ids") or [] if isinstance(s, str)] \
        if isinstance(row.get("study_ids"), list) else []
    first = row.get("study_id")
    if isinstance(first, str) and first not in ids:
        ids.insert(0, first)
    tags = [t for t in row.get("tags") or [] if isinstance(t, str)] if isinstance(row.get("tags"), list) else []
    return ", ".join(ids) + (f" [{', '.join(tags)}]" if tags else "")
