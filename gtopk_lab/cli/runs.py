"""``gtopk-lab runs``: list the runs stored in a results folder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gtopk_lab.cli.errors import UsageError
from gtopk_lab.jsonsafe import json_safe

NAME = "runs"
HELP = "list stored runs (status, method, P, density, accuracy, throughput) of a results folder"

COLUMNS: tuple[str, ...] = ("run_id", "status", "method", "workers", "density", "bandwidth",
                            "iterations", "final_test_accuracy", "samples_per_s_virtual",
                            "wall_time_s", "queue_reason")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="results", help="results folder (default results)")
    parser.add_argument("--json", action="store_true",
                        help="print every summary as one JSON list (last line)")
    parser.add_argument("--status", default=None,
                        help="only runs with this status (completed, failed, cancelled, running, queued, "
                             "crashed: its client stopped sending heartbeats, unknown)")


def run(args: argparse.Namespace) -> int:
    from gtopk_lab.orchestration.results import LISTED_STATUSES, load_summaries

    if not Path(args.out).is_dir():
        raise UsageError(f"--out={args.out!r} is invalid: no such folder")
    if args.status is not None and args.status not in LISTED_STATUSES:
        raise UsageError(f"--status={args.status!r} is invalid: expected one of {', '.join(LISTED_STATUSES)}")
    summaries = load_summaries(args.out)
    if args.status is not None:
        summaries = summaries[summaries["status"] == args.status]
    if args.json:
        records = summaries.drop(columns=["path"], errors="ignore").to_dict(orient="records")
        print(json.dumps(json_safe(records), separators=(",", ":")))
        return 0
    if summaries.empty:
        print(f"no runs in {args.out}")
        return 0
    shown = summaries[[c for c in COLUMNS if c in summaries.columns]].copy()
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
