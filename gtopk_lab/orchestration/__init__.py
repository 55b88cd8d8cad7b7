"""Dask orchestration (client side): ``Lab``, ``RunHandle`` and the results store.

``rank_task`` is the only module the Dask workers import; importing this package
does not pull in Dask's client machinery until ``Lab``/``RunHandle`` is used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Lab", "RunHandle", "RunFailed", "SchedulerUnreachable", "load_runs", "completed_runs",
           "config_hash"]


def __getattr__(name: str) -> Any:
    if name in ("Lab", "RunHandle", "RunFailed", "SchedulerUnreachable"):
        from gtopk_lab.orchestration import lab

        return getattr(lab, name)
    if name in ("load_runs", "completed_runs", "config_hash"):
        from gtopk_lab.orchestration import results

        return getattr(results, name)
    raise AttributeError(f"module 'gtopk_lab.orchestration' has no attribute {name!r}")
