"""Checks of the arguments of ``Lab``'s public calls (``submit``, ``sweep``, ``study``).

Client side. ``RunConfig`` checks its own fields; these are the call's other arguments,
each checked before anything is written or submitted. Every check is O(1) (``configs``:
O(n) for n configs) and raises ``TypeError`` (wrong type) or ``ValueError`` (wrong value)
with one line: ``field=value is invalid: expected ...``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from gtopk_lab.config import RunConfig

__all__ = ["MAX_TIMEOUT_S", "check_bool", "check_optional_bool", "check_seconds", "check_configs"]

#: The longest timeout a run may have: far above any rendezvous or collective, and below
#: what ``datetime.timedelta`` (torch.distributed's timeouts) can hold.
MAX_TIMEOUT_S = 1e6


def check_bool(name: str, value: Any) -> bool:
    """``value`` is a bool (not 1, "yes" or None)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} has type {type(value).__name__}: expected True or False")
    return value


def check_optional_bool(name: str, value: Any) -> bool | None:
    """``value`` is a bool or None (None: the Lab's default)."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} has type {type(value).__name__}: expected True, False or "
                        "None (the Lab's default)")
    return value


def check_seconds(name: str, value: Any, high: float = MAX_TIMEOUT_S) -> float:
    """``value`` is a number of seconds in (0, high] (not NaN, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}={value!r} has type {type(value).__name__}: expected seconds "
                        f"(a number in (0, {high:g}])")
    if not (math.isfinite(value) and 0 < value <= high):
        raise ValueError(f"{name}={value!r} is invalid: expected seconds in (0, {high:g}]")
    return float(value)


def check_configs(configs: Any) -> list[RunConfig]:
    """``configs`` is a non-empty iterable of ``RunConfig`` (or dicts of its fields)."""
    if isinstance(configs, (RunConfig, dict, str, bytes)) or not isinstance(configs, Iterable):
        raise TypeError(f"configs={configs!r} has type {type(configs).__name__}: expected a list "
                        "of RunConfig")
    checked = []
    for i, config in enumerate(configs):
        if isinstance(config, dict):
            config = RunConfig.from_dict(config)
        if not isinstance(config, RunConfig):
            raise TypeError(f"configs[{i}]={config!r} has type {type(config).__name__}: expected "
                            "RunConfig")
        checked.append(config)
    if not checked:
        raise ValueError("configs=[] is invalid: expected at least one RunConfig")
    return checked
