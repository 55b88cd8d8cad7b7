"""Importing this module loads numba and the compiled merge kernels into the process.

:mod:`gtopk_lab.comm.process_start` lists it in the forkserver's preload, so every forked
rank and worker starts with them in memory: loaded from numba's disk cache they cost about
1 s of CPU per process on the 2-core box (0.3 s importing numba, 0.7 s loading the
kernels), which each rank's first merge would otherwise pay. The first import on a machine
compiles them (~8 s, once; numba caches them on disk). A failure here only warns: merges
then load or compile on first use, or take the torch path.
"""

from __future__ import annotations

import warnings

from gtopk_lab.compression.fast_merge import warm_up

try:
    warm_up()
except Exception as exc:  # the preload must never stop the forkserver
    warnings.warn(f"fast_merge: could not preload the compiled kernels ({exc})", RuntimeWarning,
                  stacklevel=1)
