"""A script that starts an embedded cluster without ``if __name__ == "__main__":``.

Client side. ``Lab()`` without a scheduler starts a ``LocalCluster`` whose worker processes
are *spawned* (Dask's default start method): each one imports the main script again. A
script that calls ``Lab()`` at its top level, unguarded, would start a cluster inside
every worker while it boots, and Python ends that with a page of multiprocessing
tracebacks. :func:`check_main_guard` runs before the cluster starts and ends such a script
with one line instead (:class:`MissingMainGuard`, a ``SystemExit``: no traceback):

1. In a process that is still booting as a spawned child (``multiprocessing``'s own
   ``_inheriting`` flag, the one its bootstrapping error reads), stop at once.
2. Otherwise find the frame of the main script's top-level code on the call stack (none:
   a notebook, the REPL, ``python -c``, a thread: nothing to check), parse the script
   with ``ast`` and look for an ``if`` whose test compares ``__name__`` with
   ``"__main__"`` around the statement that is running. No such ``if``: stop.

Cost: one parse of the main script per embedded cluster start (milliseconds); a script
whose source cannot be read is not checked.
"""

from __future__ import annotations

import ast
import multiprocessing
import sys
from pathlib import Path
from types import FrameType

__all__ = ["MissingMainGuard", "check_main_guard", "guarded_spans", "unguarded_line"]

_ADVICE = ('add `if __name__ == "__main__":` and indent the code that uses Lab under it '
           "(README, \"Using it\")")


class MissingMainGuard(SystemExit):
    """Raised instead of starting worker processes that would re-run an unguarded script.
    A ``SystemExit``: Python prints its one-line message and exits with status 1."""


def _is_main_test(test: ast.expr) -> bool:
    """Whether an ``if`` test compares ``__name__`` with ``"__main__"`` (either order, also
    inside ``and``/``or``)."""
    for node in ast.walk(test):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            names = any(isinstance(p, ast.Name) and p.id == "__name__" for p in parts)
            main = any(isinstance(p, ast.Constant) and p.value == "__main__" for p in parts)
            if names and main:
                return True
    return False


def guarded_spans(source: str) -> list[tuple[int, int]]:
    """``(first, last)`` line numbers of every ``if __name__ == "__main__":`` body in ``source``."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.body:
            spans.append((node.body[0].lineno, node.end_lineno or node.body[-1].lineno))
    return sorted(spans)


def _main_script_frame() -> FrameType | None:
    main = sys.modules.get("__main__")
    if not getattr(main, "__file__", None):
        return None
    spec = getattr(main, "__spec__", None)
    if spec is not None and (spec.name == "__main__" or spec.name.endswith(".__main__")):
        # ``python -m package``: spawned children do not run a package's __main__ again
        # (multiprocessing skips it), so no guard is needed there
        return None
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            return frame
        frame = frame.f_back
    return None


def unguarded_line() -> tuple[str, int] | None:
    """``(script, line)`` when the main script's top-level statement now running is not
    under a ``__main__`` guard; None when it is, or when there is nothing to check."""
    frame = _main_script_frame()
    if frame is None:
        return None
    path = Path(frame.f_code.co_filename)
    try:
        spans = guarded_spans(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    line = frame.f_lineno
    if any(first <= line <= last for first, last in spans):
        return None
    return path.name, line


def check_main_guard(start_method: str = "spawn") -> None:
    """Raise :class:`MissingMainGuard` (one line) when starting worker processes by
    ``start_method`` would re-run an unguarded main script; see the module docstring."""
    if start_method == "fork":  # forked children do not import the main script again
        return
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise MissingMainGuard(f"gtopk-lab: Lab() ran while a worker process was starting: the "
                               f"main script has no __main__ guard; {_ADVICE}")
    where = unguarded_line()
    if where is not None:
        script, line = where
        raise MissingMainGuard(f"gtopk-lab: Lab() at line {line} of {script} runs again in every "
                               f"worker process it starts; {_ADVICE}")
