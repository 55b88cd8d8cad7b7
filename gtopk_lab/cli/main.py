"""The ``gtopk-lab`` command line.

Each sub-command lives in its own module of ``gtopk_lab.cli`` and exposes

    NAME: str                       # the sub-command name
    HELP: str                       # one line for ``gtopk-lab --help``
    def add_arguments(parser: argparse.ArgumentParser) -> None
    def run(args: argparse.Namespace) -> int

Bad input of any kind ends with exit code 2 and one line on stderr, no traceback:
commands raise ``UsageError`` (or ``ValueError``/``TypeError`` from config validation),
and ``main`` turns it into that line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gtopk_lab.cli import (
    bench, calibrate, demo, methods, model, models, report, run, runs, study, sweep, testbed,
)
from gtopk_lab.cli.errors import UsageError

#: Sub-command modules, in the order ``--help`` lists them.
COMMANDS = (run, sweep, study, runs, demo, report, bench, calibrate, model, models, methods, testbed)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gtopk-lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in COMMANDS:
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "_run", None):
            parser.print_help()
            return 2
        return int(args._run(args) or 0)
    except (UsageError, ValueError, TypeError) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"gtopk-lab: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gtopk-lab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
