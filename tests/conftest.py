"""Shared pytest configuration for gtopk-lab."""

from __future__ import annotations

import os

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
