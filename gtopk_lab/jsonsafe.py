"""The one JSON sanitiser: summaries, configs and tables as strict JSON.

Run summaries hold NaN (a rank that never evaluated), inf, tuples, numpy and torch
scalars; ``json.dumps`` would write ``NaN``/``Infinity`` (not JSON, other readers reject
it) or fail on the scalars. Every writer — the results store, ``gtopk-lab run/runs/sweep
--json``, the torchrun entry's summary — passes its data through :func:`json_safe` first,
so they all write the same JSON for the same data. Standard library only: the worker side
(torchrun) and the client side both import it.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["json_safe"]


def json_safe(value: Any) -> Any:
    """``value`` with only JSON types: NaN/inf -> None, tuples -> lists, keys -> str.

    Scalars with ``.item()`` (numpy, 0-d torch tensors) unwrap to Python numbers;
    anything else that JSON cannot hold becomes ``str(value)``.

    Example::

        json_safe({"loss": float("nan"), "shape": (2, 3)})   # {"loss": None, "shape": [2, 3]}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return json_safe(item())
        except (ValueError, RuntimeError):  # an array of more than one element
            pass
    return str(value)
