"""Message schedules shared by the real (torch.distributed) and simulated collectives.

Every function here is a pure function of ``(rank, world_size)`` (plus sizes for the ring
byte counts): it says *who talks to whom in which round*, never *how*. ``collectives.py``
runs the steps with point-to-point messages; ``collectives_sim.py`` runs the very same steps
between virtual ranks in one process. Keeping the pattern in one place is what makes the
simulator's CommStats equal the real ones.

A sparse schedule is a list of :class:`Step`, one per communication round of this rank:

- ``"send"``: send my current vector to ``peer``;
- ``"recv"``: receive ``peer``'s vector; ``merge`` says whether it is merged into mine
  (reduce phases) or replaces mine (broadcast / unfold phases);
- ``"exchange"``: send mine to ``peer`` and receive theirs in the same round (butterfly).

``charge_drops`` marks the one rank that owns the entries a merge drops (mass-conserving
residual rule): the receiver in a tree or fold, the lowest rank of the merged group in a
butterfly round.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Step", "SPARSE_ALGORITHMS", "largest_power_of_two", "butterfly_schedule", "tree_schedule",
    "sparse_schedule", "cached_schedule", "ring_allreduce_steps", "ring_allgather_steps",
]

SPARSE_ALGORITHMS: tuple[str, ...] = ("butterfly", "tree")


@dataclass(frozen=True)
class Step:
    """One communication round of one rank in a sparse schedule."""

    op: Literal["send", "recv", "exchange"]
    peer: int
    #: recv/exchange: merge the received vector into mine (True) or replace mine (False).
    merge: bool = False
    #: This rank owns the entries the merge of this step drops.
    charge_drops: bool = False
    #: "fold" | "butterfly" | "unfold" | "reduce" | "broadcast" (for reading and debugging).
    phase: str = ""


def _check(rank: int, world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} is invalid: expected an integer >= 1")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r} is invalid: expected an integer in [0, {world_size})")


def largest_power_of_two(n: int) -> int:
    """2**floor(log2 n) for n >= 1."""
    if n < 1:
        raise ValueError(f"n={n!r} is invalid: expected an integer >= 1")
    return 1 << (n.bit_length() - 1)


def butterfly_schedule(rank: int, world_size: int) -> list[Step]:
    """Recursive doubling with fold/unfold for any world size.

    With m = 2**floor(log2 P) and e = P - m extra ranks:
      1. fold: extra rank m + j sends its vector to rank j (j < e), which merges it;
      2. butterfly: for r = 0 .. log2(m) - 1, rank i < m exchanges with i XOR 2**r and both
         merge; the merged group is the aligned block of 2**(r+1) ranks and its lowest rank
         is charged the drops;
      3. unfold: rank j sends the result back to rank m + j.
    Rounds: log2(m) (+2 for fold partners and extra ranks). Cost per round: one k-sparse
    message each way, i.e. log2(P) alpha + 2 k log2(P) * 8 beta for powers of two.
    """
    _check(rank, world_size)
    m = largest_power_of_two(world_size)
    extra = world_size - m
    steps: list[Step] = []
    if rank >= m:
        return [Step("send", rank - m, phase="fold"), Step("recv", rank - m, merge=False, phase="unfold")]
    if rank < extra:
        steps.append(Step("recv", rank + m, merge=True, charge_drops=True, phase="fold"))
    for r in range(int(math.log2(m))):
        block = 2 << r
        steps.append(Step("exchange", rank ^ (1 << r), merge=True, charge_drops=rank % block == 0,
                          phase="butterfly"))
    if rank < extra:
        steps.append(Step("send", rank + m, phase="unfold"))
    return steps


def tree_schedule(rank: int, world_size: int) -> list[Step]:
    """Binomial-tree reduce to rank 0, then binomial-tree broadcast (the paper's pattern).

    Reduce, level r = 0 .. ceil(log2 P) - 1: rank i with i mod 2**(r+1) == 2**r sends to
    i - 2**r and leaves the reduce; rank i with i mod 2**(r+1) == 0 receives from i + 2**r
    (if it exists) and merges, charged the drops. Broadcast mirrors it from the top level
    down. Works for any P without fold. Rank 0 takes 2 ceil(log2 P) rounds:
    2 log2(P) alpha + 2 k log2(P) * 8 beta on its link (the paper's model counts 4k per level).
    """
    _check(rank, world_size)
    levels = (world_size - 1).bit_length()
    reduce: list[Step] = []
    for r in range(levels):
        half, block = 1 << r, 2 << r
        if rank % block == half:
            reduce.append(Step("send", rank - half, phase="reduce"))
            break
        if rank % block == 0 and rank + half < world_size:
            reduce.append(Step("recv", rank + half, merge=True, charge_drops=True, phase="reduce"))
    bcast: list[Step] = []
    for r in reversed(range(levels)):
        half, block = 1 << r, 2 << r
        if rank % block == half:
            bcast.append(Step("recv", rank - half, merge=False, phase="broadcast"))
        elif rank % block == 0 and rank + half < world_size:
            bcast.append(Step("send", rank + half, phase="broadcast"))
    return reduce + bcast


def sparse_schedule(algorithm: str, rank: int, world_size: int) -> list[Step]:
    """The schedule of ``algorithm`` ("butterfly" | "tree") for this rank (a fresh list)."""
    return list(cached_schedule(algorithm, rank, world_size))


@functools.lru_cache(maxsize=256, typed=True)
def cached_schedule(algorithm: str, rank: int, world_size: int) -> tuple[Step, ...]:
    """:func:`sparse_schedule` as a tuple, built once per ``(algorithm, rank, world_size)``.

    A schedule is a pure function of its arguments and its steps are frozen, so every call
    may share one; a real rank's gTop-k call takes it from here (building it costs 2-7 us of
    dataclass constructions, a tenth of a warm 1M-element call's own work). ``typed``: a bool
    rank is not the cached int one, so it still gets its ``ValueError``; invalid arguments
    raise and are never cached.
    """
    if algorithm == "butterfly":
        return tuple(butterfly_schedule(rank, world_size))
    if algorithm == "tree":
        return tuple(tree_schedule(rank, world_size))
    raise ValueError(f"algorithm={algorithm!r} is invalid: expected one of {', '.join(SPARSE_ALGORITHMS)}")


def ring_allreduce_steps(nbytes: int, world_size: int) -> list[tuple[int, int]]:
    """(bytes_sent, bytes_recv) per round of a ring allreduce of ``nbytes`` on every rank.

    Reduce-scatter then allgather: 2(P-1) rounds of one chunk of ceil(nbytes/P) bytes each
    way, i.e. 2(P-1) alpha + 2 (P-1)/P * nbytes * beta. Empty for P = 1.
    """
    if world_size <= 1:
        return []
    chunk = -(-nbytes // world_size)
    return [(chunk, chunk)] * (2 * (world_size - 1))


def ring_peers(rank: int, world_size: int) -> tuple[int, int]:
    """(right, left) of a ring: the ranks ``rank`` sends to and receives from in every round."""
    return (rank + 1) % world_size, (rank - 1) % world_size


def ring_allgather_steps(nbytes_per_rank: int, world_size: int) -> list[tuple[int, int]]:
    """(bytes_sent, bytes_recv) per round of a ring allgather of ``nbytes_per_rank`` per rank.

    P-1 rounds, each forwarding one rank's block: (P-1) alpha + (P-1) * nbytes * beta.
    """
    if world_size <= 1:
        return []
    return [(nbytes_per_rank, nbytes_per_rank)] * (world_size - 1)
