"""List-valued flags of the sub-commands: commas, spaces or both, as the ControlPanel reads them.

``--workers 1,2,4``, ``--workers 1 2 4``, ``--workers "1, 2 4"`` all give ``[1, 2, 4]``:

1. :data:`LIST_FLAG` (``add_argument(..., **LIST_FLAG)``) takes one or more tokens and joins
   them with a space into one string (a default stays the string it is), so the flag's
   value is what a person typed;
2. :func:`parse_list` splits it with :func:`gtopk_lab.counts.split_list` (the panel's
   splitter too) and converts each item; an empty list or an item that does not convert
   is a :class:`~gtopk_lab.cli.errors.UsageError` naming the flag (exit 2, one line).

Cost: linear in the text's length.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from gtopk_lab.cli.errors import UsageError
from gtopk_lab.counts import split_list

__all__ = ["LIST_FLAG", "JoinedText", "parse_list"]


class JoinedText(argparse.Action):
    """Stores a flag's tokens joined by one space: ``--methods dense topk`` -> ``"dense topk"``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        tokens = [values] if isinstance(values, str) else list(values)
        setattr(namespace, self.dest, " ".join(tokens))


#: Keywords of a list flag: ``grid.add_argument("--workers", default="1,2,4", **LIST_FLAG)``.
LIST_FLAG: dict[str, Any] = {"nargs": "+", "action": JoinedText}

_KINDS = {int: "integers", float: "numbers"}


def parse_list(text: str | None, flag: str, cast: Callable[[str], Any] = str) -> list[Any]:
    """The items of a list flag's text (step 2 of the module docstring), each ``cast``."""
    items = split_list(text)
    if not items:
        raise UsageError(f"{flag}={text!r} is invalid: expected a list (commas or spaces)")
    try:
        return [cast(t) for t in items]
    except ValueError:
        raise UsageError(f"{flag}={text!r} is invalid: expected {_KINDS.get(cast, 'values')} "
                         "separated by commas or spaces") from None
