"""Shared pytest configuration for gtopk-lab."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

import suite_schedule

#: tests/plugins: the test-only methods of every shape (lab_test_methods.py)
PLUGINS = Path(__file__).with_name("plugins")

# Ranks, Dask workers and notebooks each run many processes on a 2-core machine:
# one intra-op thread per process keeps them from fighting over cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# Every default results folder (Lab(), the CLI's --out, the notebooks) is the results home
# (gtopk_lab.results_home): in tests a tmp dir, so that no test writes into the repository's
# results/ nor into a developer's own $GTOPK_LAB_RESULTS; child processes inherit it.
os.environ["GTOPK_LAB_RESULTS"] = tempfile.mkdtemp(prefix="gtopk-lab-test-results-")
# removed when this process exits (each xdist process made its own), so that suites leave
# no folders behind in /tmp
atexit.register(shutil.rmtree, os.environ["GTOPK_LAB_RESULTS"], ignore_errors=True)


def pytest_sessionstart(session: object) -> None:
    """Compile the numba merge kernels once, here, before any test spawns ranks: on a fresh
    clone each gloo rank would otherwise compile them at once (~8 s of CPU each on 2 cores)
    inside a test's timeout; afterwards numba's disk cache makes this a few ms."""
    from gtopk_lab.compression.fast_merge import warm_up

    warm_up()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadfile``: the testbed files in one process, the longest files first
    (tests/suite_schedule.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    return suite_schedule.make_scheduler(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist process, collect the longest files first (every process collects the same
    order; the scheduler above keeps it). A serial run keeps pytest's own order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    order = suite_schedule.longest_first([item.nodeid for item in items], suite_schedule.recorded_seconds())
    items[:] = [items[i] for i in order]


@pytest.fixture(scope="module")
def lab_test_methods():
    """Register the test plugin (tests/plugins/lab_test_methods.py) for this module and make it
    importable and named for every child process ($GTOPK_LAB_METHODS, $PYTHONPATH). Both, and
    the registries the plugin added to, are restored afterwards: a later module in the same
    xdist process (tests/suite_schedule.py decides which) sees the built-in methods only."""
    from gtopk_lab.compression import selection
    from gtopk_lab.methods import registry

    saved = [(table, table.copy()) for table in (registry._METHODS, registry._COLLECTIVES, registry._ALIASES,
                                                 registry._loaded_plugins, selection.SELECTORS,
                                                 selection.EXACT_K_SELECTORS)]
    sys.path.insert(0, str(PLUGINS))
    old_env, old_path = os.environ.get("GTOPK_LAB_METHODS"), os.environ.get("PYTHONPATH")
    os.environ["GTOPK_LAB_METHODS"] = "lab_test_methods"
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(PLUGINS), old_path) if p)
    import lab_test_methods  # noqa: F401
    yield
    for key, old in (("GTOPK_LAB_METHODS", old_env), ("PYTHONPATH", old_path)):
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old
    sys.path.remove(str(PLUGINS))
    for table, before in saved:
        table.clear()
        table.update(before)
    sys.modules.pop("lab_test_methods", None)  # the next module's fixture registers it afresh
