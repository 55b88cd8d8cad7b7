"""``gtopk-lab report [RESULTS_DIR] -o report.html [--figures DIR]``: one self-contained HTML
report (of the results home, ``gtopk_lab.results_home``, without RESULTS_DIR), and with
``--figures`` each of its figures as a file (PNG, SVG, PDF via kaleido)."""

from __future__ import annotations

import argparse

from gtopk_lab.cli.errors import UsageError

NAME = "report"
HELP = "write a self-contained HTML report (figures + scaling table) of a results folder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gtopk_lab.results_home import RULE, results_home

    parser.add_argument("results_dir", nargs="?", default=str(results_home()),
                        help=f"folder of runs written by gtopk-lab run / sweep / study / demo (default the "
                             f"results home: {RULE}; here {results_home()})")
    parser.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")
    parser.add_argument("--figures", metavar="DIR", default=None,
                        help="also write every figure of the report into DIR (needs kaleido and a Chromium "
                             "for png/svg/pdf: pip install 'gtopk-lab[export]')")
    parser.add_argument("--figure-format", default="png", choices=("png", "svg", "pdf", "html"),
                        help="file format of --figures (default png)")
    parser.add_argument("--target-accuracy", type=float, default=None, metavar="FRACTION",
                        help="test accuracy of the time-to-accuracy figure, e.g. 0.9 (default: 90%% of dense "
                             "S-SGD's worst final accuracy at P > 1)")


def run(args: argparse.Namespace) -> int:
    from gtopk_lab.plotting.report import write_report

    target = args.target_accuracy
    if target is not None and not 0 < target <= 1:
        raise UsageError(f"--target-accuracy={target} is invalid: expected a fraction in (0, 1], e.g. 0.9")
    try:
        path = write_report(args.results_dir, args.output, figures_dir=args.figures,
                            figure_format=args.figure_format, target_accuracy=target)
    except RuntimeError as exc:  # no kaleido or no Chromium: one line, as bad input
        raise UsageError(str(exc)) from exc
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    if args.figures:
        from pathlib import Path

        written = sorted(Path(args.figures).glob(f"*.{args.figure_format}"))
        print(f"wrote {len(written)} figures to {args.figures}")
    return 0
