"""The one exception the sub-commands raise for bad input."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""
