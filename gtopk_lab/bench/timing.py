"""Timing of benchmarked collectives: the common start, the cores the ranks get and the
wake-up delay of a dependent round (:mod:`gtopk_lab.comm.timing`, re-exported here), and
the host's cores."""

from __future__ import annotations

import os

from gtopk_lab.comm.timing import CORE_PROBE_S, START_MARGIN_S, available_cores, common_start_s, wakeup_delay_s, \
    wakeup_delays_s

__all__ = ["START_MARGIN_S", "common_start_s", "host_cores", "available_cores", "CORE_PROBE_S", "wakeup_delay_s",
           "wakeup_delays_s"]


def host_cores() -> int:
    """Cores this process may run on (its affinity mask; ``os.cpu_count()`` off Linux):
    when ranks outnumber them, they time-share and wall times measure the scheduler too."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
