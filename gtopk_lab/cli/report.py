"""``gtopk-lab report RESULTS_DIR -o report.html``: one self-contained HTML report."""

from __future__ import annotations

import argparse

NAME = "report"
HELP = "write a self-contained HTML report (figures + scaling table) of a results folder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results_dir", help="folder of runs written by gtopk-lab run / sweep / demo")
    parser.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")


def run(args: argparse.Namespace) -> int:
    from gtopk_lab.plotting.report import write_report

    path = write_report(args.results_dir, args.output)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0
