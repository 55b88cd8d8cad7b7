"""The pairing oracle for recorded rounds: every byte count a rank records as sent to a peer
is, in the same order, a count that peer records as received from it (shared by the
in-process recorder's tests and the gloo ranks' timed calls)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def sends_and_receives(ranks: Iterable[tuple[Sequence[tuple[int, int]], Sequence[tuple[int | None, int | None]]]]
                       ) -> tuple[dict[tuple[int, int], list[int]], dict[tuple[int, int], list[int]]]:
    """``ranks``: per rank, its rounds' ``(sent, recv)`` bytes and ``(dst, src)`` peers (None:
    no message that way). Returns ``(sends, recvs)`` keyed by ``(from, to)``; equal when every
    send pairs up with its receive."""
    sends: dict[tuple[int, int], list[int]] = {}
    recvs: dict[tuple[int, int], list[int]] = {}
    for rank, (steps, peers) in enumerate(ranks):
        assert len(steps) == len(peers), (rank, steps, peers)
        for (sent, recv), (dst, src) in zip(steps, peers):
            if dst is not None:
                sends.setdefault((rank, dst), []).append(sent)
            if src is not None:
                recvs.setdefault((src, rank), []).append(recv)
    return sends, recvs
