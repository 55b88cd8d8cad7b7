"""How the project starts its worker processes: a preloaded forkserver where the OS has one.

Every process the project starts (a gloo rank of :func:`gtopk_lab.comm.launch.run_gloo`,
a worker of the embedded Dask ``LocalCluster``) imports torch before it does anything,
and that import costs about 3 s of CPU on the 2-core build machines (7 s with what the
first training step imports lazily: ``torch._dynamo`` through ``torch.optim``). With the ``spawn``
start method every process pays it again; with a ``forkserver`` that imported torch
once, a new process is a ``fork()`` of an already-initialised interpreter (tens of ms).

1. :func:`start_method` picks ``forkserver`` where the platform offers it (Linux, macOS)
   unless ``$GTOPK_LAB_START_METHOD`` says ``spawn``; anything else is a ``ValueError``.
2. :func:`process_context` returns that ``multiprocessing`` context; before the
   forkserver's first start it sets the preload list (:data:`PRELOAD`, module names as
   strings: no import edge to the layers that own them) and starts the server with
   Dask's pre-spawn environment (one OpenMP/BLAS thread), so OpenMP reads it at load.
3. The forkserver's environment and working directory are those of its first start;
   :func:`child_state` snapshots the caller's and :func:`adopt_state` applies them in the
   child, so a child sees what a spawned one would (environment variables set later,
   ``monkeypatch.chdir``).

Cost: one ~3 s import per client process instead of one per started process. The server
never imports ``__main__``, so a script without an ``if __name__ == "__main__":`` guard is
not re-run by the children either (spawn re-runs it).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Mapping
from multiprocessing import forkserver
from typing import Any

__all__ = ["PRELOAD", "start_method", "process_context", "child_state", "adopt_state"]

# what the project's worker processes import first; names only, resolved in the server.
# torch._dynamo: torch.optim's first Optimizer() imports it (about 4 s of CPU here);
# fast_merge_warm: numba + the compiled merge kernels, ~1 s of CPU per process at its first merge
PRELOAD: tuple[str, ...] = (
    "torch", "torch.distributed", "torch.optim", "torch._dynamo", "numpy", "distributed",
    "gtopk_lab.training.loop", "gtopk_lab.worker.rank_task", "gtopk_lab.worker.sim_task",
    "gtopk_lab.compression.fast_merge_warm",
)
# Dask's nanny sets these before spawning a worker; a forkserver reads them only once
_PRE_START_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                  "MALLOC_TRIM_THRESHOLD_": "65536"}
_started = False


def start_method() -> str:
    """``"forkserver"`` where available unless ``$GTOPK_LAB_START_METHOD`` says ``"spawn"``."""
    wanted = os.environ.get("GTOPK_LAB_START_METHOD", "").strip().lower()
    if wanted not in ("", "forkserver", "spawn"):
        raise ValueError(f"GTOPK_LAB_START_METHOD={wanted!r} is invalid: expected forkserver or spawn")
    available = "forkserver" in multiprocessing.get_all_start_methods()
    if wanted == "spawn" or not available:
        return "spawn"
    return "forkserver"


def process_context() -> Any:
    """The ``multiprocessing`` context to start worker processes with (see the module doc)."""
    global _started
    method = start_method()
    ctx = multiprocessing.get_context(method)
    if method == "forkserver" and not _started:
        ctx.set_forkserver_preload(list(PRELOAD))
        saved = {k: os.environ.get(k) for k in _PRE_START_ENV}
        for key, value in _PRE_START_ENV.items():
            os.environ.setdefault(key, value)
        try:
            forkserver.ensure_running()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        _started = True
    return ctx


def child_state() -> dict[str, Any]:
    """The caller's environment and working directory, for :func:`adopt_state` in a child."""
    return {"env": dict(os.environ), "cwd": os.getcwd()}


def adopt_state(state: Mapping[str, Any] | None) -> None:
    """Make this (forked) child's environment and working directory the caller's."""
    if not state:
        return
    env = state.get("env")
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    cwd = state.get("cwd")
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
