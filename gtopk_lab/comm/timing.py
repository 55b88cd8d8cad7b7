"""A common start instant for timed collectives on ranks of one machine (or of network
namespaces on one kernel: the testbed), the share of the cores its ranks get while other
jobs load it, and how long a rank woken at the end of a paced round waits before its
exchange with a peer completes. Worker side: the rank of a link calibration times its calls
with it too."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from gtopk_lab.network.pacing import wait_until

__all__ = ["START_MARGIN_S", "common_start_s", "available_cores", "CORE_PROBE_S", "WAKEUP_ROUNDS",
           "WAKEUP_PERIOD_S", "WAKEUP_WINDOW_S", "wakeup_delays_s",
           "wakeup_delay_s"]

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


#: probe rounds of :func:`wakeup_delay_s`, and the spacing of their starts: 20 x 5 ms is
#: the 0.1 s of :func:`available_cores`, and 5 ms leaves a late round time to finish before
#: the next one starts
WAKEUP_ROUNDS = 20
WAKEUP_PERIOD_S = 0.005
#: default paced length of a probe round: a sparse round of ~100 kB at 1 Gbit/s
WAKEUP_WINDOW_S = 0.001


def wakeup_delays_s(window_s: float = WAKEUP_WINDOW_S, rounds: int = WAKEUP_ROUNDS,
                    period_s: float = WAKEUP_PERIOD_S) -> list[float]:
    """Delay of each paced probe round, on the slowest rank, from the round's paced end
    ("message ready") to this rank running again with its peer's message in: the
    scheduling latency of a dependent round.

    1. agree on a start ``t0`` (:func:`common_start_s`);
    2. round i, as a :class:`~gtopk_lab.network.pacing.LinkPacer` round runs: wait until
       ``t0 + i period_s`` (so the round starts from a rested state, as after a merge), note
       the post time ``s``, exchange one float with the peer ``rank ^ 1`` (isend + irecv; a
       rank without a peer, the last of an odd P, only waits), wait until ``s + window_s``
       (:func:`~gtopk_lab.network.pacing.wait_until`: sleep, then spin the last 0.2 ms) and
       record ``monotonic() - (s + window_s)``;
    3. one MAX all_reduce of the per-round delays (a round waits for its slowest rank);
       every rank returns the same list (:func:`wakeup_delay_s` summarises it).

    What it measures is what a paced round costs beyond its alpha-beta time: the exchange
    overlaps the paced wait, so it adds only where it outlasts it (both peers, and gloo's
    threads that carry the message, must have run), and the rank, asleep at the paced end,
    must be given a core again. With a core per rank that is the sleep's wake-up (a few us,
    the spin absorbs it); where other runnable tasks hold the cores it queues behind them.
    Charged per dependent round on a collective's critical path
    (:mod:`gtopk_lab.network.wakeup`). Cost: ``rounds * period_s`` + one all_reduce.
    """
    if not (isinstance(window_s, (int, float)) and 0.0 <= window_s <= 0.05):
        raise ValueError(f"window_s={window_s!r} is invalid: expected seconds in [0, 0.05]")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= 1000:
        raise ValueError(f"rounds={rounds!r} is invalid: expected an integer in [1, 1000]")
    if not (isinstance(period_s, (int, float)) and window_s < period_s <= 0.1):
        raise ValueError(f"period_s={period_s!r} is invalid: expected seconds in (window_s, 0.1]")
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = rank ^ 1
    out, inp = torch.zeros(1), torch.zeros(1)
    delays = torch.zeros(rounds, dtype=torch.float64)
    t0, _late = common_start_s()
    for i in range(rounds):
        wait_until(t0 + i * period_s, clock=time.monotonic)
        posted = time.monotonic()
        if peer < world:
            out.fill_(float(i))
            reqs = [dist.isend(out, peer), dist.irecv(inp, peer)]
            for req in reqs:
                req.wait()
        deadline = posted + window_s
        wait_until(deadline, clock=time.monotonic)
        delays[i] = time.monotonic() - deadline
    dist.all_reduce(delays, op=dist.ReduceOp.MAX)
    return delays.tolist()



def wakeup_delay_s(window_s: float = WAKEUP_WINDOW_S, rounds: int = WAKEUP_ROUNDS,
                   period_s: float = WAKEUP_PERIOD_S, statistic: str = "mean") -> float:
    """The mean (or ``statistic="median"``: the median, the figure to set beside a median of
    calls when a few rounds stall for milliseconds) of :func:`wakeup_delays_s`."""
    if statistic not in ("mean", "median"):
        raise ValueError(f"statistic={statistic!r} is invalid: expected mean or median")
    delays = wakeup_delays_s(window_s, rounds, period_s)
    return statistics.fmean(delays) if statistic == "mean" else statistics.median(delays)
