"""Shared pytest configuration for gtopk-lab."""

from __future__ import annotations

import os

# Ranks, Dask workers and notebooks each run many processes on a 2-core machine:
# one intra-op thread per process keeps them from fighting over cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
