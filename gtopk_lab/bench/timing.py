"""A common start instant for timed collectives on ranks of one host, and the host's cores."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from gtopk_lab.network.pacing import wait_until

__all__ = ["START_MARGIN_S", "common_start_s", "host_cores"]

# ---------------------------------------------------------------------------------------
# collectives
#: how far ahead of the agreeing all_reduce the common start lies: long enough for every
#: rank to learn it in time (a gloo collective on a busy 2-core box can stall ~5 ms)
START_MARGIN_S = 0.03
#: the last stretch before the start is spun, not slept, so every rank starts within ~0.1 ms
_SPIN_S = 0.0005


def common_start_s(margin_s: float = START_MARGIN_S) -> tuple[float, bool]:
    """Agree on a start instant with every rank of the default group, then wait for it.

    Returns ``(start, late)``: ``start`` is ``max over ranks (time.monotonic() + margin_s)``
    (one MAX all_reduce), ``late`` is True when this rank learned it after it had passed.
    ``time.monotonic`` is CLOCK_MONOTONIC, one clock for all processes of a machine, so this
    holds for ranks on one host only (as ``run_gloo`` spawns them). Timing a collective from
    a common start, rather than from each rank's exit of a barrier, keeps the barrier's exit
    skew (up to several ms with gloo on few cores) out of the slowest rank's time.
    """
    t = torch.tensor([time.monotonic() + margin_s], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    start = float(t.item())
    late = time.monotonic() > start
    wait_until(start, clock=time.monotonic, spin_s=_SPIN_S)
    return start, late


def host_cores() -> int:
    """Cores this process may run on (its affinity mask; ``os.cpu_count()`` off Linux):
    when ranks outnumber them, they time-share and wall times measure the scheduler too."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
