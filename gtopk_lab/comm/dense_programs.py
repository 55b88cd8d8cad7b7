"""Dense allreduce written once as a per-rank tensor program (for collectives built on it).

:func:`allreduce_program` is a sub-generator for :mod:`gtopk_lab.comm.tensor_programs`
programs (``result = yield from allreduce_program(rank, world, x)``): the sum of ``x`` over
the ranks, with **the same bits on every rank** and the same bits whichever driver runs it
(torch.distributed ranks or virtual ranks in one process), because every element of the
sum is added up by exactly one rank, in a fixed order, and then copied to the others.

Algorithm (recursive halving, then recursive doubling: Rabenseifner's allreduce), rank r
of P, ``p' = 2^floor(log2 P)``, L elements:

1. fold (P not a power of two): rank ``r >= p'`` sends its vector to ``r - p'``, which adds
   it (its own operand first); ranks ``>= p'`` then wait for step 4;
2. reduce-scatter inside the p' group, ``log2 p'`` rounds: with partner ``r ^ d``
   (d = p'/2, ..., 1) exchange the half of the current segment the partner keeps and add
   the half this rank keeps (the lower rank's operand first); afterwards rank r holds the
   finished sum of one segment of about L / p' elements;
3. allgather, ``log2 p'`` rounds in reverse order: exchange finished segments with the
   same partners and concatenate, so every group rank holds the whole sum;
4. unfold: rank ``r < P - p'`` sends the sum to ``r + p'``.

Cost per rank: ``2 log2(p')`` exchanges (+2 messages when P is not a power of two) and
``2 (p'-1)/p' * 4L`` bytes sent (+ ``4L`` for each fold/unfold message), the bandwidth of a
ring allreduce with ``log2`` instead of linear latency. :func:`allreduce_time_s` is its
alpha-beta time, built from :mod:`gtopk_lab.network.formulas`' primitives.
"""

from __future__ import annotations

from collections.abc import Generator

import torch

from gtopk_lab.comm.tensor_programs import TENSOR_HEADER_BYTES
from gtopk_lab.network.formulas import DENSE_ELEMENT_BYTES, log2_floor
from gtopk_lab.network.model import NetworkModel

__all__ = ["allreduce_program", "allreduce_time_s", "allreduce_bytes_per_rank"]

Request = tuple[str, int, "torch.Tensor | None"]


def allreduce_program(rank: int, world: int, x: torch.Tensor
                      ) -> Generator[Request, "torch.Tensor | None", torch.Tensor]:
    """The sum of the 1-D tensor ``x`` over ``world`` ranks (see the module docstring).

    Returns a new tensor; ``x`` is not modified. ``world == 1``: a copy of ``x``, no message.
    """
    total = x.detach().reshape(-1).clone()
    if world == 1:
        return total
    group = 1 << log2_floor(world)
    if rank >= group:  # step 1 and 4 for an extra rank: hand the vector in, get the sum back
        yield ("send", rank - group, total)
        got = yield ("recv", rank - group, None)
        assert got is not None
        return got.clone()
    if rank + group < world:  # step 1: this rank folds in its partner's vector
        other = yield ("recv", rank + group, None)
        assert other is not None
        total = total + other
    # step 2: recursive halving; remember each split to undo it in step 3
    lo, hi = 0, total.numel()
    splits: list[tuple[int, bool]] = []
    d = group >> 1
    while d >= 1:
        partner = rank ^ d
        mid = lo + (hi - lo) // 2
        keep_low = rank < partner
        keep = slice(lo, mid) if keep_low else slice(mid, hi)
        give = slice(mid, hi) if keep_low else slice(lo, mid)
        theirs = yield ("exchange", partner, total[give].clone())
        assert theirs is not None
        mine = total[keep]
        # a single add commutes exactly, but the lower rank's operand goes first anyway, so
        # the order is the same rule on every rank and in every driver
        total[keep] = mine + theirs if keep_low else theirs + mine
        splits.append((partner, keep_low))
        lo, hi = (lo, mid) if keep_low else (mid, hi)
        d >>= 1
    # step 3: recursive doubling, the splits undone in reverse
    segment = total[lo:hi].clone()
    for partner, keep_low in reversed(splits):
        theirs = yield ("exchange", partner, segment)
        assert theirs is not None
        segment = torch.cat([segment, theirs]) if keep_low else torch.cat([theirs, segment])
    if rank + group < world:  # step 4
        yield ("send", rank + group, segment)
    return segment


def _rounds(numel: int, workers: int) -> list[int]:
    """Elements this rank's largest message carries in each exchange round (reduce-scatter
    then allgather): ``ceil(L / 2^j)``, j = 1..log2 p' and back."""
    group = 1 << log2_floor(workers)
    down = []
    size = numel
    d = group >> 1
    while d >= 1:
        size = -(-size // 2)
        down.append(size)
        d >>= 1
    return down + down[::-1]


def allreduce_time_s(net: NetworkModel, numel: int, workers: int) -> float:
    """Alpha-beta time of :func:`allreduce_program` on ``net`` (max over ranks).

    ``T = sum_j (a + b (h + 4 ceil(L / 2^j)))`` over the ``2 log2(p')`` exchange rounds, plus
    ``2 (a + b (h + 4 L))`` for the fold and unfold when P is not a power of two
    (``h`` = the 16-byte tensor-message header, ``a`` = alpha, ``b`` = beta).
    """
    if workers <= 1:
        return 0.0
    h, b, a = TENSOR_HEADER_BYTES, net.beta_s_per_byte, net.latency_s
    t = sum(a + b * (h + DENSE_ELEMENT_BYTES * n) for n in _rounds(numel, workers))
    if workers & (workers - 1):
        t += 2 * (a + b * (h + DENSE_ELEMENT_BYTES * numel))
    return t


def allreduce_bytes_per_rank(numel: int, workers: int) -> float:
    """Payload bytes one rank sends in :func:`allreduce_program`, mean over ranks (headers
    left out): ``2 (p'-1)/p' * 4L`` per group rank, plus one ``4L`` message for each of the
    ``2 (P - p')`` fold and unfold messages."""
    if workers <= 1:
        return 0.0
    group = 1 << log2_floor(workers)
    extra = workers - group
    total = group * 2.0 * (group - 1) / group * DENSE_ELEMENT_BYTES * numel
    total += 2 * extra * DENSE_ELEMENT_BYTES * numel
    return total / workers
