"""Off-wire CPU of a collective when its ranks outnumber the cores they get.

The alpha-beta-gamma model charges the wire (paced rounds) and the merges (gamma, slowed
by :func:`gtopk_lab.network.formulas.merge_contention`). A call also does CPU work that is
neither: the prep (checks, wire dtypes, the local sort), each round's pack and unpack,
and the finish (stats, result). On a core per rank it is a few hundred microseconds and
the model can leave it out; when P ranks share fewer cores, and other jobs take some of
those, a rank's off-wire work waits for a core behind the other ranks' and the jobs', so
it lasts ``max(1, P / cores)`` times its CPU time, like a merge. On a 2-core box at
P = 4 beside two busy loops (cores the ranks got: 1.1-1.35) that is ~0.5 ms x 3 = 1.5-1.8 ms
a gTop-k call, a third to a half of what the model missed (the rest: docs/network.md, "Wake-up
latency of dependent rounds", and :mod:`gtopk_lab.network.wakeup`).

Algorithm:

1. ``c_i`` = each rank's CPU seconds per call in the off-wire phases (prep, pack,
   unpack, finish; :data:`OFF_WIRE_PHASES`), measured once from the per-round profile
   (:mod:`gtopk_lab.bench.profile`); the send/recv phase is left out: its CPU (the
   transport's copies) runs inside the paced wire time, which the pacer stretches to
   alpha + beta n anyway;
2. ``cores`` the cores the ranks got (fractional under other jobs; None: a core per rank);
3. the term is each rank's wall time for its ``c_i`` when all start together and share the
   cores (:func:`off_wire_wall_s`, :func:`processor_sharing_s`), added to the
   alpha-beta-gamma time: ``c * s`` with ``s = max(1, ranks / cores)``
   (:func:`cpu_contention`) where the work is alike, less where the ranks' CPU differs (a
   gTop-k tree's leaves only sort, then wait, and the least loaded finish first). The TCP
   model's step 2 (:mod:`gtopk_lab.network.tcp_fit`) and ``bench collectives`` both price it so.

Cost: O(phases). Worker-side module: standard library only; composable with other
additive terms (e.g. real-TCP terms) since it returns seconds to add.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["OFF_WIRE_PHASES", "cpu_contention", "off_wire_cpu_s", "off_wire_wall_s", "processor_sharing_s",
           "shared_contention"]

#: profile phases whose CPU is on the critical path but neither wire time nor merge
OFF_WIRE_PHASES = ("prep", "pack", "unpack", "finish")


def cpu_contention(ranks: int, cores: float | None) -> float:
    """Step 2: ``max(1, ranks / cores)``; 1.0 when ``cores`` is None (a core per rank)."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks={ranks!r} is invalid: expected an integer >= 1")
    if cores is None:
        return 1.0
    if isinstance(cores, bool) or not isinstance(cores, (int, float)) or not 0 < cores < math.inf:
        raise ValueError(f"cores={cores!r} is invalid: expected a number of cores > 0 or None")
    return max(1.0, ranks / cores)


def shared_contention(ranks: int, cores: float | None, other_ranks: int = 0, cpu_s: float = 0.0,
                      wire_s: float = 0.0) -> float:
    """``s`` when ``other_ranks`` of other jobs share the ``cores`` with this call's ``ranks``.

    1. this call's ranks compute at the same moments (between the same rounds), so every one
       of them contends, as in :func:`cpu_contention`;
    2. another job's ranks run at moments unrelated to this call's: each contends only for
       the share ``u`` of the time it is on a core. For other jobs that run calls like this
       one (the testbed's two jobs), ``u = c s / (w + c s)`` with ``c = cpu_s`` the call's
       CPU per rank and ``w = wire_s`` its wire time;
    3. ``s = max(1, (ranks + other_ranks u) / cores)``, by fixed-point iteration from the
       full count (the right side grows with ``s`` and is bounded, so it settles).

    On the testbed's two P = 4 jobs on 2 cores the full count (s = 4) put gTop-k and Top-k's
    1M calls 24-34% over; step 2 gives s = 2.4-2.9. ``other_ranks`` 0: :func:`cpu_contention`.
    O(iterations), at most 60.
    """
    s = cpu_contention(ranks, cores)
    if isinstance(other_ranks, bool) or not isinstance(other_ranks, int) or other_ranks < 0:
        raise ValueError(f"other_ranks={other_ranks!r} is invalid: expected an integer >= 0")
    for name, value in (("cpu_s", cpu_s), ("wire_s", wire_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value < math.inf):
            raise ValueError(f"{name}={value!r} is invalid: expected a finite number of seconds >= 0")
    if other_ranks == 0 or cores is None or cpu_s == 0:
        return s
    s = max(1.0, (ranks + other_ranks) / cores)
    for _ in range(60):
        share = cpu_s * s / (wire_s + cpu_s * s)
        settled = max(1.0, (ranks + other_ranks * share) / cores)
        if abs(settled - s) < 1e-9:
            break
        s = settled
    return s


def off_wire_cpu_s(phases_cpu_s: Mapping[str, float]) -> float:
    """Step 1 for one rank: CPU seconds per call in :data:`OFF_WIRE_PHASES` (missing: 0)."""
    total = 0.0
    for phase in OFF_WIRE_PHASES:
        value = float(phases_cpu_s.get(phase, 0.0))
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"phases_cpu_s[{phase!r}]={value!r} is invalid: expected a finite number >= 0")
        total += value
    return total


def off_wire_wall_s(cpu_s_per_rank: Sequence[float], ranks: int, cores: float | None) -> list[float]:
    """Step 3: each listed rank's wall seconds for its off-wire CPU per call when ``ranks``
    ranks share ``cores`` (:func:`processor_sharing_s`); ranks beyond those listed are taken
    as busy as the busiest, and ``cores`` None is a core per rank (each rank's own CPU).
    Alike work gives ``c * max(1, ranks / cores)`` for every rank."""
    work = [float(c) for c in cpu_s_per_rank]
    if not work:
        raise ValueError("cpu_s_per_rank is empty: expected one CPU time per listed rank")
    if any(not (w >= 0 and math.isfinite(w)) for w in work):
        raise ValueError(f"cpu_s_per_rank={list(cpu_s_per_rank)!r} is invalid: expected finite seconds >= 0")
    if cores is None:
        return work
    work += [max(work)] * max(0, ranks - len(work))
    return processor_sharing_s(work, cores)[:len(cpu_s_per_rank)]


def processor_sharing_s(work_s: Sequence[float], cores: float) -> list[float]:
    """Each rank's wall seconds to do its ``work_s`` of CPU when all start together and share
    ``cores`` equally, each on at most one core (processor sharing, what a fair scheduler
    gives runnable threads):

    1. sort the work; while ``n`` ranks still have work, each runs at ``min(1, cores / n)``;
    2. the rank with the least work left finishes first, after ``left / rate``; every other
       rank has done as much meanwhile;
    3. repeat with ``n - 1`` ranks; a rank's time is the clock when its work is done.

    Equal work ``w`` gives ``w max(1, n / cores)`` for every rank (:func:`cpu_contention`'s
    count). Unequal work does not: a gTop-k tree's leaves only sort and then wait for the
    broadcast, so the merging ranks share the cores with fewer and fewer of them, while
    counting every rank for the whole call had put the tree's 1M calls at P = 8 on 2 cores
    13-22% over in five testbed runs (docs/network.md). O(n log n).
    """
    if isinstance(cores, bool) or not isinstance(cores, (int, float)) or not 0 < cores < math.inf:
        raise ValueError(f"cores={cores!r} is invalid: expected a number of cores > 0")
    work = [float(w) for w in work_s]
    if not work:
        raise ValueError("work_s is empty: expected one CPU time per rank")
    if any(not (w >= 0 and math.isfinite(w)) for w in work):
        raise ValueError(f"work_s={list(work_s)!r} is invalid: expected finite seconds >= 0")
    done = [0.0] * len(work)
    clock_s = progress_s = 0.0
    order = sorted(range(len(work)), key=work.__getitem__)
    for position, rank in enumerate(order):
        rate = min(1.0, cores / (len(work) - position))
        clock_s += (work[rank] - progress_s) / rate
        progress_s = work[rank]
        done[rank] = clock_s
    return done
