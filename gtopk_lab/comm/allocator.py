"""Keep a rank's message-sized buffers on the heap: glibc malloc thresholds for collectives.

Why: every gTop-k call allocates buffers of a message's size (a 25k-pair message is
200 KB; a merge's union, its kept and dropped parts) and frees them at its end. Dask's
nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536`` (to hand memory back to the OS),
and the project's forkserver starts with the same environment. Setting any malloc
threshold turns glibc's *dynamic* mmap threshold off, so each buffer of 128 KiB or more is
a fresh ``mmap``: its pages fault in on first touch, in every call, and are unmapped when
it is freed; a trim threshold of 64 KiB hands smaller heap tops back the same way.

:func:`tune_for_collectives`:
  1. on glibc, ``mallopt(M_MMAP_THRESHOLD, 16 MiB)``: buffers below that come from the
     heap, whose pages stay mapped between calls;
  2. ``mallopt(M_TRIM_THRESHOLD, 64 MiB)``: freed heap is handed back only above that;
  3. elsewhere (macOS, musl), or with ``GTOPK_LAB_MALLOC_TUNING=0`` (read at the first
     call; the benchmarks' A/B switch, and for a deployment that wants Dask's trimming),
     nothing, and it returns False.
Cost: two library calls per process; up to 64 MiB of freed heap stays with the process
(Dask's memory monitor counts it). Gain, ``gtopk-lab bench collectives --workers 2
--numel 25M --density 0.001`` on the 2-core box: wall per call 2.9-4.4 ms -> 2.3-2.7 ms
(pack 0.08-0.24 -> 0.02-0.07 ms, merge 0.6-1.7 -> 0.4-1.0 ms), same results.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["MALLOC_TUNING_ENV", "MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "tune_for_collectives"]

#: ``GTOPK_LAB_MALLOC_TUNING=0`` leaves the process's malloc as it started
MALLOC_TUNING_ENV = "GTOPK_LAB_MALLOC_TUNING"

#: allocations below this come from the heap (glibc's default starts at 128 KiB)
MMAP_THRESHOLD_BYTES = 16 * 2**20
#: freed memory at the heap's top is returned to the OS only above this
TRIM_THRESHOLD_BYTES = 64 * 2**20
# glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_tuned: bool | None = None


def tune_for_collectives() -> bool:
    """Set the thresholds once per process (see the module doc); True where glibc took them."""
    global _tuned
    if _tuned is None:
        _tuned = False
        if sys.platform.startswith("linux") and os.environ.get(MALLOC_TUNING_ENV, "1") != "0":
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                mallopt = libc.mallopt
            except (OSError, AttributeError):  # not glibc (musl has no mallopt)
                return False
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            _tuned = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                          and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    return _tuned
