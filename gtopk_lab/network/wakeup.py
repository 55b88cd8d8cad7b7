"""Wake-up latency of dependent rounds when other runnable tasks hold the cores.

A paced round ends with a wait (:mod:`gtopk_lab.network.pacing`); the rank that waited must
then be given a core before it unpacks and merges, and an exchange completes only when both
peers (and the threads that carry their messages) have run. With a core per rank that costs
tens of microseconds; on a host whose cores other jobs and the other ranks hold, each such
wake-up queues behind them. Neither alpha-beta (the wire), gamma with its contention (CPU
that the ranks run at once) nor the off-wire CPU term (:mod:`.cpu_contention`) describes
it: it is latency, not work, and it is paid once per dependent round on the critical path.

Algorithm:

1. ``d`` = the delay per round from "a paced wait ends" to "the exchange with the peer
   has completed", on the slowest rank, measured on the ranks themselves under the load of
   the moment (:func:`gtopk_lab.comm.timing.wakeup_delay_s`; 0 when not measured); the
   bench takes the median probe round, the figure to set beside its median of calls (a
   few long stalls move the mean, not the typical call);
2. ``n`` = the dependent rounds on the critical path (:func:`critical_rounds`):
   the gTop-k butterfly's ``log2 P`` exchanges (``floor(log2 P) + 2`` with the fold and
   unfold rounds of a P that is not a power of two), each needing both peers running; the
   tree's ``2 ceil(log2 P)`` one-way rounds of rank 0's path (reduce up, broadcast down),
   each needing its receiver running; the library collectives (dense ring allreduce, the
   Top-k allgather) are paced as a whole, once, and their own rounds run (inside gloo, or
   the allgather's ring over the ranks' links) before that paced wait ends, so one wake-up
   follows it;
3. the term is ``n * d`` seconds (:func:`wakeup_time_s`), added to the alpha-beta-gamma
   time (and to the off-wire CPU term: each returns seconds to add).

Cost: O(1). Standard library only (the network model never imports the comm layer).
"""

from __future__ import annotations

import math

__all__ = ["WHOLE_CALL_COLLECTIVES", "critical_rounds", "wakeup_time_s"]

#: collectives paced as one library call: one wake-up after their paced wait
WHOLE_CALL_COLLECTIVES = ("dense_allreduce", "topk_allgather")


def _check_workers(workers: int) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r} is invalid: expected an integer >= 1")


def critical_rounds(collective: str, workers: int, algorithm: str | None = None) -> int:
    """Step 2: wake-ups on the critical path of one call (0 at P = 1: no communication).

    ``collective``: ``"gtopk_allreduce"`` (``algorithm`` ``"butterfly"``, the default, or
    ``"tree"``) or one of :data:`WHOLE_CALL_COLLECTIVES` (``algorithm`` None or ``"ring"``).
    """
    _check_workers(workers)
    if collective in WHOLE_CALL_COLLECTIVES:
        if algorithm not in (None, "ring"):
            raise ValueError(f"algorithm={algorithm!r} is invalid for {collective}: expected ring or None")
        return 0 if workers == 1 else 1
    if collective != "gtopk_allreduce":
        raise ValueError(f"collective={collective!r} is invalid: expected gtopk_allreduce, "
                         f"{', '.join(WHOLE_CALL_COLLECTIVES)}")
    if workers == 1:
        return 0
    if algorithm in (None, "butterfly"):
        rounds = workers.bit_length() - 1  # floor(log2 P)
        return rounds + (2 if workers != 1 << rounds else 0)
    if algorithm == "tree":
        return 2 * (workers - 1).bit_length()  # 2 ceil(log2 P)
    raise ValueError(f"algorithm={algorithm!r} is invalid for gtopk_allreduce: expected butterfly or tree")


def wakeup_time_s(delay_s: float | None, collective: str, workers: int, algorithm: str | None = None) -> float:
    """Step 3: seconds the wake-ups add to a call, ``critical_rounds(...) * delay_s``
    (``delay_s`` None: not measured, 0)."""
    if delay_s is None:
        return 0.0
    if isinstance(delay_s, bool) or not isinstance(delay_s, (int, float)) \
            or not (delay_s >= 0 and math.isfinite(delay_s)):
        raise ValueError(f"delay_s={delay_s!r} is invalid: expected a finite number of seconds >= 0 or None")
    return critical_rounds(collective, workers, algorithm) * float(delay_s)
