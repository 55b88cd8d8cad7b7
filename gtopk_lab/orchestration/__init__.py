"""Dask orchestration (client side): ``Lab``, ``RunHandle`` and the results store.

The Dask workers never import this package (what they run is ``gtopk_lab.worker``);
it re-exports ``Lab``, ``RunHandle``, their errors and the store's listings (no module
``__getattr__``: importing any module of the package imports these, about 0.2 s beyond the
store's own imports).
Modules: ``lab`` (Lab), ``handle`` (RunHandle), ``monitor`` (queue, reservations, watch
thread), ``cluster`` (connecting, plugins, eligible workers), ``results`` (the store:
``run_files`` and ``reading`` below it), ``progress`` (tqdm bars).
"""

from __future__ import annotations

from gtopk_lab.orchestration.lab import Lab, RunFailed, RunHandle, SchedulerUnreachable
from gtopk_lab.orchestration.results import completed_runs, config_hash, load_runs

__all__ = ["Lab", "RunHandle", "RunFailed", "SchedulerUnreachable", "load_runs", "completed_runs",
           "config_hash"]
