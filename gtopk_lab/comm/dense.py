"""The dense allreduce, written once as a per-rank program (for collectives built on it).

:func:`allreduce_program` is a sub-generator for per-rank programs (``result = yield from
allreduce_program(rank, world, x)``; PowerSGD's P and Q, CLT-k's k values, Ok-Topk's dense
warm-up): the sum of ``x`` over the ranks, with **the same bits on every rank** and the
same bits whichever driver runs it (torch.distributed ranks or virtual ranks in one
process), because every element of the sum is added up by exactly one rank, in a fixed
order, and then copied to the others. Two algorithms, rank r of P, L elements:

``"halving-doubling"`` (Rabenseifner's; the default), ``p' = 2^floor(log2 P)``:

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

``"ring"``: ``x`` cut in P chunks (``torch.tensor_split``); reduce-scatter, P-1 rounds in
which every rank sends one chunk right and receives one from the left (one ``sendrecv``,
one round each) and adds it to its own (own operand first), then allgather, P-1 more such
rounds: ``2 (P-1) (alpha + beta 4 ceil(L/P))``
(:func:`gtopk_lab.network.formulas.dense_ring_allreduce_time_s`, headers left out).

Received payloads are read in ``x``'s dtype, so the program runs over a byte wire too
(Ok-Topk's, :data:`gtopk_lab.comm.wire.BYTES`).
"""

from __future__ import annotations

from collections.abc import Generator

import torch

from gtopk_lab.comm.wire import TENSOR_HEADER_BYTES
from gtopk_lab.network.formulas import DENSE_ELEMENT_BYTES, log2_floor
from gtopk_lab.network.model import NetworkModel

__all__ = ["DENSE_ALGORITHMS", "allreduce_program", "allreduce_time_s", "allreduce_bytes_per_rank"]

#: the algorithms of :func:`allreduce_program`, the default first
DENSE_ALGORITHMS: tuple[str, ...] = ("halving-doubling", "ring")

Request = tuple


def _as(got: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A received payload in ``like``'s dtype (a byte wire hands back uint8)."""
    return got if got.dtype == like.dtype else got.view(like.dtype)


def allreduce_program(rank: int, world: int, x: torch.Tensor, algorithm: str = "halving-doubling",
                      phase: str = "") -> Generator[Request, "torch.Tensor | None", torch.Tensor]:
    """The sum of the 1-D tensor ``x`` over ``world`` ranks by ``algorithm`` (see the module
    docstring); requests carry ``phase`` (for per-phase byte counts) when given.

    Returns a new tensor; ``x`` is not modified. ``world == 1``: a copy of ``x``, no message.
    """
    if algorithm == "ring":
        return (yield from _ring(rank, world, x, phase))
    if algorithm != "halving-doubling":
        raise ValueError(f"algorithm={algorithm!r} is invalid: expected one of {', '.join(DENSE_ALGORITHMS)}")
    return (yield from _halving_doubling(rank, world, x, phase))


def _ring(rank: int, world: int, x: torch.Tensor, phase: str) -> Generator[Request, "torch.Tensor | None", torch.Tensor]:
    chunks = list(x.detach().reshape(-1).contiguous().tensor_split(world))
    if world == 1:
        return chunks[0].clone()
    right, left = (rank + 1) % world, (rank - 1) % world
    for s in range(world - 1):  # afterwards chunk (rank + 1) % P holds the full sum here
        got = yield ("sendrecv", (right, left), chunks[(rank - s) % world], phase)
        c = (rank - s - 1) % world
        chunks[c] = chunks[c] + _as(got, x)  # a new tensor: what was sent is never written to
    for s in range(world - 1):
        got = yield ("sendrecv", (right, left), chunks[(rank + 1 - s) % world], phase)
        chunks[(rank - s) % world] = _as(got, x)
    return torch.cat(chunks)


def _halving_doubling(rank: int, world: int, x: torch.Tensor, phase: str
                      ) -> Generator[Request, "torch.Tensor | None", torch.Tensor]:
    total = x.detach().reshape(-1).clone()
    if world == 1:
        return total
    group = 1 << log2_floor(world)
    if rank >= group:  # step 1 and 4 for an extra rank: hand the vector in, get the sum back
        yield ("send", rank - group, total, phase)
        got = yield ("recv", rank - group, None, phase)
        assert got is not None
        return _as(got, x).clone()
    if rank + group < world:  # step 1: this rank folds in its partner's vector
        other = yield ("recv", rank + group, None, phase)
        assert other is not None
        total = total + _as(other, x)
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
        theirs = yield ("exchange", partner, total[give].clone(), phase)
        assert theirs is not None
        mine, theirs = total[keep], _as(theirs, x)
        # a single add commutes exactly, but the lower rank's operand goes first anyway, so
        # the order is the same rule on every rank and in every driver
        total[keep] = mine + theirs if keep_low else theirs + mine
        splits.append((partner, keep_low))
        lo, hi = (lo, mid) if keep_low else (mid, hi)
        d >>= 1
    # step 3: recursive doubling, the splits undone in reverse
    segment = total[lo:hi].clone()
    for partner, keep_low in reversed(splits):
        theirs = yield ("exchange", partner, segment, phase)
        assert theirs is not None
        theirs = _as(theirs, x)
        segment = torch.cat([segment, theirs]) if keep_low else torch.cat([theirs, segment])
    if rank + group < world:  # step 4
        yield ("send", rank + group, segment, phase)
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
