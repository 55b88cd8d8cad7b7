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
import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from gtopk_lab import __version__
from gtopk_lab.cli.errors import UsageError

#: Sub-command modules of ``gtopk_lab.cli``, in the order ``--help`` lists them. A module is
#: imported only when its command runs (or for the full ``--help``): the commands' own
#: imports (torch, distributed, pandas, scipy) cost 2-4 s of CPU together, and every process
#: Dask spawns from a CLI process imports this main module again (as ``__mp_main__``).
COMMANDS = ("run", "sweep", "study", "runs", "demo", "report", "bench", "calibrate", "model", "models",
            "methods", "testbed")
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


def command_module(name: str) -> ModuleType:
    """The module of sub-command ``name`` (one of :data:`COMMANDS`), imported now."""
    module = importlib.import_module(f"gtopk_lab.cli.{name}")
    assert module.NAME == name, (module.NAME, name)
    return module


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or (``command`` given) one whose other sub-commands are bare names:
    they parse nothing, but a mistyped command's error still lists every choice."""
    parser = _Parser(prog="gtopk-lab", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"gtopk-lab {__version__}")
    _add_debug(parser, False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        if command is not None and name != command:
            sub.add_parser(name)
            continue
        module = command_module(name)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        # SUPPRESS: a sub-command without --debug keeps what the top level parsed
        _add_debug(p, argparse.SUPPRESS)
        p.set_defaults(_run=module.run)
    return parser


def _command_in(argv: Sequence[str] | None) -> str | None:
    """The sub-command ``argv`` names (its first word that is not a flag; the top level takes
    no valued flag), ``""`` (no command's module needed) for a bare ``--version``, else None."""
    tokens = list(sys.argv[1:] if argv is None else argv)
    word = next((t for t in tokens if not t.startswith("-")), None)
    if word is None and "--version" in tokens and not {"-h", "--help"} & set(tokens):
        return ""
    return word if word in COMMANDS else None


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
        parser = build_parser(_command_in(argv))
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
