"""A common start instant for timed collectives on ranks of one machine (or of network
namespaces on one kernel: the testbed), and the share of the cores its ranks get while other
jobs load it. Worker side: the rank of a link calibration times its calls with it too."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from gtopk_lab.network.pacing import wait_until

__all__ = ["START_MARGIN_S", "common_start_s", "available_cores", "CORE_PROBE_S"]

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


#: wall seconds each rank computes for :func:`available_cores`
CORE_PROBE_S = 0.1


def available_cores(spin_s: float = CORE_PROBE_S) -> float:
    """Cores the ranks of the default group get when all of them compute at once.

    1. agree on a start (:func:`common_start_s`);
    2. every rank runs a CPU-bound loop for ``spin_s`` wall seconds and takes its share
       ``thread CPU / wall``;
    3. one SUM all_reduce of the shares.

    With P ranks on an otherwise idle C-core host this is min(P, C); every other job that
    wants the cores lowers it (P ranks and L other runnable tasks: about ``C P / (P + L)``).
    Merges that all P ranks run at once then take ``P / available`` times their CPU time,
    which the abg column of ``gtopk-lab bench collectives`` charges. O(spin_s).
    """
    if not (isinstance(spin_s, (int, float)) and 0.0 < spin_s <= 5.0):
        raise ValueError(f"spin_s={spin_s!r} is invalid: expected seconds in (0, 5]")
    common_start_s()
    wall0, cpu0 = time.monotonic(), time.thread_time()
    x = 0
    while time.monotonic() - wall0 < spin_s:
        for i in range(1000):
            x += i
    share = (time.thread_time() - cpu0) / max(time.monotonic() - wall0, 1e-9)
    total = torch.tensor([min(1.0, share)], dtype=torch.float64)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return float(total.item())
