"""gTop-k's per-rank program and the accounting of the library collectives.

A program is one rank's algorithm as a generator of requests (:mod:`gtopk_lab.comm.recorder`:
send / recv / exchange / sendrecv), resumed with what the peer sent. A
:class:`~gtopk_lab.comm.recorder.Recorder` counts its rounds and bytes in the program's wire
format; :mod:`gtopk_lab.comm.torch_dist` drives it over a
:class:`~gtopk_lab.comm.dist_transport.DistTransport` and :mod:`gtopk_lab.comm.inprocess`
between virtual ranks in one process (:func:`gtopk_lab.comm.transport.run_programs`), so
results and byte counts agree by construction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator

import torch

from gtopk_lab.comm.profiling import RoundProfile
from gtopk_lab.comm.schedules import cached_schedule, ring_allgather_steps, ring_allreduce_steps, ring_peers
from gtopk_lab.comm.stats import CollectiveResult, CommStats, Payload, merge_cpu_clock
from gtopk_lab.comm.wire import HEADER_BYTES, sparse_message_bytes
from gtopk_lab.compression.fast_merge import merge_applies, numba_merge
from gtopk_lab.compression.merge import canonical_wire, coalesce_sparse, merge_sparse

__all__ = ["gtopk_program", "dense_stats", "allgather_steps", "allgather_assemble", "allgather_ring_stats"]

Request = tuple[str, int, "Payload | None"]


def gtopk_program(rank: int, world_size: int, values: torch.Tensor, indices: torch.Tensor,
                  numel: int, k: int, algorithm: str, profile: RoundProfile | None = None,
                  name: str = "values/indices") -> Generator[Request, Payload | None, CollectiveResult]:
    """gTop-k on one rank as a generator of communication requests.

    Yields ``("send", peer, (v, i))`` (resumed with None), ``("recv", peer, None)`` and
    ``("exchange", peer, (v, i))`` (both resumed with the peer's ``(v, i)``), following
    :func:`gtopk_lab.comm.schedules.sparse_schedule`, one request per round; returns the
    rank's CollectiveResult, whose bytes and rounds the driver's recorder fills in (wire
    format :func:`gtopk_lab.comm.wire.sparse_wire`: with exact-k every message holds exactly
    k pairs, a merge of two k-sets keeps k). Merges put the lower rank's operand first so all
    ranks add in the same order.
    ``profile`` (the torch.distributed driver passes the active one): record the local
    sort as ``prep``, each round's merge as ``merge`` and the stats as ``finish``
    (:mod:`gtopk_lab.comm.profiling`); the clocks are only read, results are unchanged.
    The local selection is first range-checked, put in the wire format and sorted by index
    (:func:`~gtopk_lab.compression.merge.canonical_wire`; a bad index raises a ValueError
    naming ``name`` before any request is yielded).
    """
    stamp = profile.stamp() if profile is not None else None
    # one sort of the local selection by index: every message is then canonical and every
    # merge sees two ascending runs (merge_sparse's fast path); charged as merge CPU. The
    # range check and the wire dtype come in the same compiled pass where it applies: on a
    # core that has just waited for its peers every separate call costs 0.1-0.25 ms
    t0 = merge_cpu_clock()
    values, indices = canonical_wire(values, indices, numel, name=name)
    merge_cpu_s = merge_cpu_clock() - t0
    # merge_sparse's argument checks and kernel test, once per call instead of per round: a
    # received operand is in the wire format (these dtypes, this device) or the peer's own
    # canonical selection (the simulator), and the kernel declines what is not canonical
    compiled = merge_applies(values, indices, values, indices)
    if profile is not None:
        profile.stop("prep", stamp)
    merged_elements = 0
    dropped: list[Payload] = []
    merged_any = False

    for step in cached_schedule(algorithm, rank, world_size):
        mine = (values, indices)
        if profile is not None:  # the transport adds this round's pack / sendrecv / unpack
            profile.begin_round(f"{step.phase} {step.op}")
        if step.op == "send":
            yield ("send", step.peer, mine)
            continue
        theirs = yield (step.op, step.peer, mine if step.op == "exchange" else None)
        assert theirs is not None
        if not step.merge:
            values, indices = theirs
            continue
        first, second = (mine, theirs) if rank < step.peer else (theirs, mine)
        stamp = profile.stamp() if profile is not None else None
        t0 = merge_cpu_clock()
        merged = (numba_merge(first[0], first[1], second[0], second[1], k)
                  if compiled and _same_kind(theirs, mine) else None)
        values, indices, d_v, d_i = merged or merge_sparse(first[0], first[1], second[0], second[1], k)
        merge_cpu_s += merge_cpu_clock() - t0
        if profile is not None:
            profile.stop("merge", stamp)
        merged_elements += first[0].numel() + second[0].numel()
        merged_any = True
        if step.charge_drops:
            dropped.append((d_v, d_i))
    if not merged_any and world_size == 1:
        # No merge happened: canonicalise (sort) and keep k, the single rank owns the drops.
        stamp = profile.stamp() if profile is not None else None
        t0 = merge_cpu_clock()
        empty_v, empty_i = values.new_empty(0), indices.new_empty(0)
        merged_elements += values.numel()
        values, indices, d_v, d_i = merge_sparse(values, indices, empty_v, empty_i, k)
        merge_cpu_s += merge_cpu_clock() - t0
        dropped.append((d_v, d_i))
        if profile is not None:  # no round is open: recorded as a per-call merge
            profile.stop("merge", stamp)
    stamp = profile.stamp() if profile is not None else None
    # merge_sparse returns its drops canonical (ascending, unique indices): a single drop is
    # returned as is; several are left as parts, summed only if a reader asks (CommStats).
    drop_v, drop_i = dropped[0] if len(dropped) == 1 else (values.new_empty(0), indices.new_empty(0))
    stats = CommStats(
        collective="gtopk_allreduce", algorithm=algorithm, merge_cpu_s=merge_cpu_s,
        merged_elements=merged_elements, dropped_values=drop_v, dropped_indices=drop_i,
        library_estimate=False, dropped_parts=dropped if len(dropped) > 1 else None,
    )
    if profile is not None:
        profile.stop("finish", stamp)
    return CollectiveResult(values, indices, stats)


def _same_kind(theirs: Payload, mine: Payload) -> bool:
    """Whether a received operand has this rank's dtypes and devices, 1-D and of one length
    (then :func:`numba_merge` may take it as it takes this rank's own; O(1))."""
    (tv, ti), (mv, mi) = theirs, mine
    return (isinstance(tv, torch.Tensor) and isinstance(ti, torch.Tensor) and tv.dtype == mv.dtype
            and ti.dtype == mi.dtype and tv.device == mv.device and ti.device == mi.device
            and tv.dim() == 1 and ti.dim() == 1 and tv.numel() == ti.numel())


def dense_stats(nbytes: int, world_size: int) -> CommStats:
    """CommStats of a ring allreduce of ``nbytes`` (shared with the simulator)."""
    steps = ring_allreduce_steps(nbytes, world_size)
    return CommStats(collective="dense_allreduce", algorithm="ring",
                     bytes_sent=sum(s for s, _ in steps), bytes_recv=sum(r for _, r in steps),
                     messages=len(steps), rounds=len(steps), steps=steps, library_estimate=True)


def allgather_steps(counts: list[int], value_dtype: torch.dtype, idx_dtype: torch.dtype,
                    world_size: int, counted: bool = True) -> list[tuple[int, int]]:
    """Rounds of topk_allgather: a ring allgather of the 8-byte counts (unless
    ``counted=False``: every count known in advance), then one of max(counts) padded
    (value, index) pairs per rank (none when every count is 0)."""
    pair = sparse_message_bytes(1, value_dtype, idx_dtype) - HEADER_BYTES
    steps = ring_allgather_steps(HEADER_BYTES, world_size) if counted else []
    if max(counts) > 0:
        steps += ring_allgather_steps(max(counts) * pair, world_size)
    return steps


def allgather_assemble(counts: list[int], gathered: list[Payload], value_dtype: torch.dtype,
                       idx_dtype: torch.dtype, world_size: int, counted: bool = True) -> CollectiveResult:
    """Sum the gathered per-rank sparse vectors (rank order) and build the allgather stats.

    ``gathered[r]`` holds rank r's first ``counts[r]`` entries. Stats: a ring allgather of
    the 8-byte counts (if ``counted``), then a ring allgather of max(counts) padded pairs
    per rank.
    """
    t0 = merge_cpu_clock()
    if gathered:
        values, indices = coalesce_sparse(torch.cat([g[0] for g in gathered]),
                                          torch.cat([g[1] for g in gathered]))
    else:
        values = torch.empty(0, dtype=value_dtype)
        indices = torch.empty(0, dtype=idx_dtype)
    merge_cpu_s = merge_cpu_clock() - t0
    steps = allgather_steps(counts, value_dtype, idx_dtype, world_size, counted)
    stats = CommStats(collective="topk_allgather", algorithm="ring",
                      bytes_sent=sum(s for s, _ in steps), bytes_recv=sum(r for _, r in steps),
                      messages=len(steps), rounds=len(steps), steps=steps, merge_cpu_s=merge_cpu_s,
                      merged_elements=sum(g[0].numel() for g in gathered), library_estimate=True)
    return CollectiveResult(values, indices, stats)


def allgather_ring_stats(stats: CommStats, rank: int, world: int) -> CommStats:
    """``allgather_assemble``'s stats as the rounds a CPU rank's links carry them
    (``comm.allgather_links.ring_allgather``): each round's peers the ring's (right, left),
    not a library's estimate; a fresh copy (its own lists)."""
    return dataclasses.replace(stats, steps=list(stats.steps), peers=[ring_peers(rank, world)] * len(stats.steps),
                               library_estimate=False)
