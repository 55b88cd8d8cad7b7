"""Method plugins on Dask workers: the same ``$GTOPK_LAB_METHODS`` modules as the client.

Workers of an embedded LocalCluster inherit the client's environment; workers of a remote
cluster do not. :class:`MethodPlugins` is a Dask ``WorkerPlugin`` that the client's
:class:`~gtopk_lab.orchestration.lab.Lab` registers (``Client.register_plugin``) before any
rank starts: on every worker, present and future, it sets ``GTOPK_LAB_METHODS`` and imports
the modules, so ranks and simulated runs there see the client's methods. A single-file
plugin that the workers cannot import is shipped first with ``Client.upload_file``
(:func:`single_file_plugins` names them).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from gtopk_lab.methods.registry import PLUGINS_ENV, load_plugins, plugin_modules

__all__ = ["MethodPlugins", "ClientProcessState", "single_file_plugins"]


class MethodPlugins(WorkerPlugin):
    """Import the method plugin ``modules`` on every worker (see the module docstring)."""

    name = "gtopk-lab-method-plugins"

    def __init__(self, modules: list[str]) -> None:
        self.modules = list(modules)

    def setup(self, worker: Any) -> None:
        known = plugin_modules()
        os.environ[PLUGINS_ENV] = ",".join(known + [m for m in self.modules if m not in known])
        load_plugins()


class ClientProcessState(WorkerPlugin):
    """Give an embedded cluster's workers the client's environment and working directory.

    A spawned worker starts with both; a worker forked from the preloaded forkserver
    (gtopk_lab.comm.process_start) starts with those of the server's first start, which
    may name a variable the client has dropped since (a test's ``GTOPK_LAB_METHODS``).
    ``keep`` names variables the worker keeps as its nanny set them (Dask's pre-spawn
    ones: one OpenMP thread per worker). It also drops the worker's "Compute Failed" log
    record of a rank the client cancelled (a Ctrl-C would print one traceback per rank).
    """

    name = "gtopk-lab-client-process-state"

    def __init__(self, state: dict[str, Any], keep: list[str]) -> None:
        self.env = dict(state.get("env") or {})
        self.cwd = state.get("cwd")
        self.keep = list(keep)

    def setup(self, worker: Any) -> None:
        _quiet_cancelled_ranks()
        kept = {k: os.environ[k] for k in self.keep if k in os.environ}
        os.environ.clear()
        os.environ.update(self.env)
        os.environ.update(kept)
        if self.cwd and os.path.isdir(self.cwd):
            os.chdir(self.cwd)


class _CancelledRankFilter(logging.Filter):
    """Drops distributed.worker's "Compute Failed" record of a rank the client cancelled:
    the Lab reports the cancellation itself, and Ctrl-C should not print a traceback per rank."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg.startswith("Compute Failed") and "RunCancelled" in record.getMessage())


def _quiet_cancelled_ranks() -> None:
    log = logging.getLogger("distributed.worker")
    if not any(isinstance(f, _CancelledRankFilter) for f in log.filters):
        log.addFilter(_CancelledRankFilter())


def single_file_plugins(modules: list[str]) -> list[str]:
    """Paths of the plugin ``modules`` that are one ``.py`` file outside site-packages (those a
    remote worker is unlikely to have installed: upload them)."""
    paths = []
    for module in modules:
        spec = importlib.util.find_spec(module)
        origin = getattr(spec, "origin", None) if spec is not None else None
        if (origin and origin.endswith(".py") and not spec.submodule_search_locations  # type: ignore[union-attr]
                and "site-packages" not in origin):
            paths.append(origin)
    return paths
