"""Shared pytest configuration for gtopk-lab."""

from __future__ import annotations

import os
from typing import Any

# Ranks, Dask workers and notebooks each run many processes on a 2-core machine:
# one intra-op thread per process keeps them from fighting over cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


def pytest_sessionstart(session: object) -> None:
    """Compile the numba merge kernels once, here, before any test spawns ranks: on a fresh
    clone each gloo rank would otherwise compile them at once (~8 s of CPU each on 2 cores)
    inside a test's timeout; afterwards numba's disk cache makes this a few ms."""
    from gtopk_lab.compression.fast_merge import warm_up

    warm_up()


#: files whose tests share no module-scoped fixture: each test is a unit of its own, and they
#: run last, so that the two xdist workers finish together (the notebooks run 20-45 s each;
#: as one file, name order left one worker ~50 s after the other). Putting the heaviest
#: files first instead ran the browser and the notebooks at once: 20% more CPU in all.
SPLIT_FILES: frozenset[str] = frozenset({"test_notebooks.py"})


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """For ``--dist loadgroup --no-loadscope-reorder`` (the Makefile's): every file is one
    xdist group (its module fixtures are built once) except :data:`SPLIT_FILES`, which come
    last. The order within a file is kept; it is the same on every worker (xdist requires it)."""
    import pytest

    for item in items:
        if item.path.name not in SPLIT_FILES:
            item.add_marker(pytest.mark.xdist_group(name=item.path.name))
    items.sort(key=lambda item: item.path.name in SPLIT_FILES)  # stable: else as collected
