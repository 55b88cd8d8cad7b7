"""The ``gtopk-lab`` command line.

Each sub-command lives in its own module of ``gtopk_lab.cli`` and exposes

    NAME: str                       # the sub-command name
    HELP: str                       # one line for ``gtopk-lab --help``
    def add_arguments(parser: argparse.ArgumentParser) -> None
    def run(args: argparse.Namespace) -> int

Bad input of any kind ends with exit code 2 and one line on stderr, no traceback:
commands raise ``UsageError`` (or ``ValueError``/``TypeError`` from config validation),
and ``main`` turns it into that line; ``--debug`` (before or after the sub-command) prints
the traceback above that line. Every parser refuses abbreviated flags (``--meth`` is not
``--method``); ``--version`` prints the package's version. A reader that closes the pipe
early (``gtopk-lab methods | head -1``) ends the command quietly (exit 141, as a tool killed
by SIGPIPE), stdout pointed at ``os.devnull`` so the interpreter's final flush cannot fail
(the recipe of Python's ``signal`` documentation).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from gtopk_lab import __version__
from gtopk_lab.cli import (
    bench, calibrate, demo, methods, model, models, report, run, runs, study, sweep, testbed,
)
from gtopk_lab.cli.errors import UsageError

#: Sub-command modules, in the order ``--help`` lists them.
COMMANDS = (run, sweep, study, runs, demo, report, bench, calibrate, model, models, methods, testbed)
#: Exit status when stdout's reader went away (128 + SIGPIPE, what a shell reports for a
#: tool SIGPIPE killed).
BROKEN_PIPE_EXIT = 141


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No prefix matching: a typo such as ``--meth`` must not silently mean ``--method``.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        raise UsageError(message)


def _add_debug(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("--debug", action="store_true", default=default,
                        help="show the traceback behind a one-line error")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gtopk-lab", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"gtopk-lab {__version__}")
    _add_debug(parser, False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in COMMANDS:
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        # SUPPRESS: a sub-command without --debug keeps what the top level parsed
        _add_debug(p, argparse.SUPPRESS)
        p.set_defaults(_run=module.run)
    return parser


def _wants_debug(argv: Sequence[str] | None, args: argparse.Namespace | None) -> bool:
    if args is not None:
        return bool(getattr(args, "debug", False))
    tokens = list(sys.argv[1:] if argv is None else argv)
    return "--debug" in tokens[:tokens.index("--")] if "--" in tokens else "--debug" in tokens


def _quiet_broken_pipe() -> int:
    # Later writes (and the interpreter's flush at exit) go to devnull instead of raising
    # a second BrokenPipeError; the reader already has all it wanted.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file descriptor (a test's capture)
        pass
    return BROKEN_PIPE_EXIT


def main(argv: Sequence[str] | None = None) -> int:
    args: argparse.Namespace | None = None
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "_run", None):
            parser.print_help()
            return 2
        status = int(args._run(args) or 0)
        sys.stdout.flush()  # inside the try: a closed pipe shows here, not at exit
        return status
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except (UsageError, ValueError, TypeError) as exc:
        if _wants_debug(argv, args):
            traceback.print_exc()
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"gtopk-lab: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gtopk-lab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
