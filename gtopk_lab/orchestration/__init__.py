"""Dask orchestration (client side): ``Lab``, ``RunHandle`` and the results store.

The Dask workers never import this package (what they run is ``gtopk_lab.worker``);
importing it does not pull in Dask's client machinery until ``Lab``/``RunHandle`` is used.
Modules: ``lab`` (Lab), ``handle`` (RunHandle), ``monitor`` (queue, reservations, watch
thread), ``cluster`` (connecting, plugins, eligible workers), ``results`` (the store:
``run_files`` and ``reading`` below it), ``progress`` (tqdm bars).
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
