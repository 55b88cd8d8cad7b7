"""Ok-Topk (Li & Hoefler, PPoPP'22) on one rank, as one generator of communication requests.

:func:`oktopk_faithful_program` is driven over torch.distributed and between virtual ranks
in one process (:mod:`gtopk_lab.comm.oktopk.drivers`) under the one recorder, so results,
bytes and steps agree bitwise. It takes the rank's compensated buffer ``acc`` (gradient +
residual) and a :class:`~gtopk_lab.comm.oktopk.schedule.CallPlan`; the thresholds and
boundaries it uses are the ones the schedule (:mod:`gtopk_lab.comm.oktopk.schedule`) keeps,
and the threshold factors are the plan's (:class:`~gtopk_lab.comm.oktopk.schedule.Bands`).
Steps on rank r of P:

0. warm-up call: ring allreduce of ``acc`` (:func:`gtopk_lab.comm.dense.allreduce_program`,
   reduce-scatter then allgather of P chunks, 2(P-1) rounds of d/P floats); the whole buffer
   counts as selected. Else:
1. local selection S_r: the entries with ``|acc| >= t_r`` (t_r exact every tau calls, else
   reused and adjusted);
2. repartition (every tau_r calls): one recursive-doubling allreduce of the P-1 quantile
   indices of S_r and a weight averages the region boundaries over the ranks;
3. sparse reduce-scatter (shifted pairwise rounds s = 1 .. P-1: send region r+s to rank r+s,
   receive region r from rank r-s), summed in rank order; entries summing to 0 leave;
4. re-evaluation call: allgather of every region's reduced entries (the union U, up to
   P k pairs), exact top-k of U on every rank, global threshold = its k-th |v|;
   other calls: rank r keeps its region's entries with ``|v| >= t_global`` and the kept
   blocks are allgathered (n pairs in all, about k);
5. the allgather is ``"plain"`` (the reference's Allgatherv: Bruck, ceil(log2 P) rounds, each
   rank receives n - n_r pairs but the owner of the largest block sends it in every round)
   or ``"balanced"`` (the paper's: one allreduce of the P block sizes, point-to-point moves
   to blocks of n/P in global index order, then Bruck over equal blocks).

Result: canonical (ascending index), identical on every rank. Mass: entries of region r not
kept are rank r's ``stats.dropped_values/indices``, so the "mass" residual rule conserves
``sum_i residual_i + G == sum_i acc_i``. The cost per call (balanced regions and blocks,
h = 8-byte header, m bytes per pair, c = 8 bytes per count, L = allreduce rounds,
l = ceil(log2 P); :func:`gtopk_lab.methods.formulas.oktopk_time_s` amortises it)::

    reduce-scatter   (P-1) (alpha + (h + m k/P) beta)
    allgather        sum_j (alpha + (h + m n/P min(2^j, P-2^j)) beta)      [plain]
                     + L (alpha + (h + c P) beta) + moves                  [balanced]
    re-evaluation    the allgather with |U| in place of n      (every tau calls)
    repartition      L (alpha + (h + c P) beta)                (every tau_r calls)
    warm-up          2 (P-1) (alpha + (h + 4 d/P) beta)        (first `warmup` calls)
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field

import torch

from gtopk_lab.comm.dense import allreduce_program
from gtopk_lab.comm.oktopk import schedule
from gtopk_lab.comm.oktopk.rounds import Block, Request, allreduce_sum, as_bytes, bruck_allgather, pairs_from_bytes
from gtopk_lab.comm.stats import CollectiveResult, CommStats, merge_cpu_clock
from gtopk_lab.compression.merge import coalesce_sparse, index_dtype

__all__ = ["ProgramOutput", "oktopk_faithful_program", "allgather_blocks"]


@dataclass
class ProgramOutput:
    """What one call returns on one rank: the result, the rank's local selection S_r (what the
    residual memory removes), the thresholds and boundaries for the next call, and the bytes
    per phase (:class:`~gtopk_lab.comm.recorder.Recorder` ``phases``, set by the driver)."""

    result: CollectiveResult
    selection: Block
    local_threshold: float | None
    global_threshold: float | None
    boundaries: list[int] | None
    phases: dict[str, dict[str, int]] = field(default_factory=dict)


def _cat(blocks: list[Block], like: Block) -> Block:
    if not blocks:
        return like[0][:0], like[1][:0]
    return torch.cat([b[0] for b in blocks]), torch.cat([b[1] for b in blocks])


def _split_sizes(sizes: list[int]) -> Callable[[Block, list[int]], list[Block]]:
    def split(incoming: Block, owners: list[int]) -> list[Block]:
        cut = [sizes[q] for q in owners]
        return list(zip(torch.split(incoming[0], cut), torch.split(incoming[1], cut)))
    return split


def _balance(rank: int, world: int, own: Block, phase: str
             ) -> Generator[Request, torch.Tensor | None, tuple[Block, list[int]]]:
    """The paper's data balancing: blocks of n/P in global (rank, then index) order.

    One allreduce of the P block sizes, then shifted pairwise rounds s = 1 .. P-1 that move
    to rank r+s the part of this block inside r+s's target range; a round both sides know to
    be empty is skipped. Returns this rank's balanced block and every rank's target size."""
    dev = own[0].device
    onehot = torch.zeros(world, dtype=torch.int64, device=dev)
    onehot[rank] = own[0].numel()
    sizes = (yield from allreduce_sum(rank, world, onehot, phase)).tolist()
    total = sum(sizes)
    target = [total // world + (q < total % world) for q in range(world)]
    start = [sum(sizes[:q]) for q in range(world)]
    tstart = [sum(target[:q]) for q in range(world)]

    def overlap(src: int, dst: int) -> tuple[int, int]:  # src's block positions bound for dst
        lo, hi = max(start[src], tstart[dst]), min(start[src] + sizes[src], tstart[dst] + target[dst])
        return (lo - start[src], hi - start[src]) if hi > lo else (0, 0)

    vdt, idt = own[0].dtype, own[1].dtype
    pieces: dict[int, Block] = {}
    a, b = overlap(rank, rank)
    pieces[rank] = (own[0][a:b], own[1][a:b])
    for s in range(1, world):
        dst, src = (rank + s) % world, (rank - s) % world
        a, b = overlap(rank, dst)
        payload = as_bytes(own[0][a:b], own[1][a:b]) if b > a else None
        lo, hi = overlap(src, rank)
        incoming = hi > lo
        if payload is not None and incoming:
            theirs = yield ("sendrecv", (dst, src), payload, phase)
        elif payload is not None:
            yield ("send", dst, payload, phase)
            continue
        elif incoming:
            theirs = yield ("recv", src, None, phase)
        else:
            continue
        pieces[src] = pairs_from_bytes(theirs, vdt, idt)
    # sources' ranges are consecutive in rank order: concatenating by rank keeps index order
    return _cat([pieces[q] for q in sorted(pieces)], own), target


def allgather_blocks(rank: int, world: int, own: Block, bounds: torch.Tensor, mode: str,
                     phase: str) -> Generator[Request, torch.Tensor | None, Block]:
    """Every rank's region block on every rank (``mode`` plain | balanced, see step 5),
    concatenated in rank order: ascending index order, identical on every rank."""
    if mode == "balanced":
        own, target = yield from _balance(rank, world, own, "balance")
        blocks = yield from bruck_allgather(rank, world, own, _split_sizes(target), phase)
        return _cat(blocks, own)

    def by_region(incoming: Block, owners: list[int]) -> list[Block]:
        region_of = torch.searchsorted(bounds[1:-1], incoming[1].to(torch.int64), right=True)
        sizes = torch.bincount(region_of, minlength=world)[owners].tolist()
        return list(zip(torch.split(incoming[0], sizes), torch.split(incoming[1], sizes)))

    blocks = yield from bruck_allgather(rank, world, own, by_region, phase)
    return _cat(blocks, own)


def oktopk_faithful_program(rank: int, world: int, acc: torch.Tensor, numel: int, k: int,
                            plan: schedule.CallPlan, allgather: str = "plain",
                            ) -> Generator[Request, torch.Tensor | None, ProgramOutput]:
    """Ok-Topk on one rank (steps 0-5 of the module docstring); ``acc`` is this rank's flat
    buffer on the communication device. Yields the requests of
    :mod:`gtopk_lab.comm.recorder`; returns a :class:`ProgramOutput` whose result's bytes and
    rounds (and ``phases``) the driver's recorder fills in."""
    P, dev, bands = world, acc.device, plan.bands
    if plan.warmup:
        total = yield from allreduce_program(rank, P, acc, "ring", "warmup")
        everything = (acc, torch.arange(numel, dtype=index_dtype(numel), device=dev))
        stats = CommStats(collective="dense_allreduce", algorithm="ring", library_estimate=False)
        return ProgramOutput(CollectiveResult(total, None, stats), everything, None, None, None)

    # 1. local selection by the local threshold (the only O(d) work of most calls)
    t0 = merge_cpu_clock()
    if plan.reevaluate or plan.local_threshold is None:
        threshold = schedule.kth_largest_magnitude(acc, k)
    else:
        threshold = schedule.raise_local_threshold(acc.abs(), plan.local_threshold, k, bands)
    sel_v, sel_i = schedule.select_by_threshold(acc, threshold, numel)
    # 0: fewer than k non-zero entries; kept, it would pass every entry until the next
    # re-evaluation, so the next call evaluates it again (None)
    next_local = schedule.next_local_threshold(threshold, sel_i.numel(), k, bands) if threshold > 0 else None
    # the rank's own selection (step 3 of a training step, made here for its thresholds): the
    # clock charges it as a selection, not as a merge (CommStats.compress_cpu_s)
    select_cpu_s = merge_cpu_clock() - t0
    cpu_s = 0.0

    # 2. repartition: average the ranks' selection quantiles
    if plan.repartition or plan.boundaries is None:
        summed = yield from allreduce_sum(rank, P, schedule.quantile_boundaries(sel_i, P).to(dev), "boundaries")
        bounds = schedule.average_boundaries(summed, numel, P)
    else:
        bounds = list(plan.boundaries)
    bounds_t = torch.tensor(bounds, dtype=torch.int64, device=dev)

    # 3. sparse reduce-scatter, shifted pairwise rounds (send to r+s, receive from r-s: one round)
    cuts = torch.searchsorted(sel_i.to(torch.int64), bounds_t).tolist()
    pieces = [(sel_v[cuts[q]:cuts[q + 1]], sel_i[cuts[q]:cuts[q + 1]]) for q in range(P)]
    received: list[Block] = [pieces[rank]] * P
    for s in range(1, P):
        dst, src = (rank + s) % P, (rank - s) % P
        theirs = yield ("sendrecv", (dst, src), as_bytes(*pieces[dst]), "reduce_scatter")
        received[src] = pairs_from_bytes(theirs, sel_v.dtype, sel_i.dtype)
    t0 = merge_cpu_clock()
    region_v, region_i = coalesce_sparse(*_cat(received, (sel_v, sel_i)))
    merged = sum(p[0].numel() for p in received)
    nonzero = region_v != 0  # a sum of exactly 0 carries no mass: nothing to send or keep
    region = (region_v[nonzero], region_i[nonzero])
    cpu_s += merge_cpu_clock() - t0

    # 4./5. global selection and allgather
    if plan.reevaluate or plan.global_threshold is None:
        u_v, u_i = yield from allgather_blocks(rank, P, region, bounds_t, allgather, "reevaluation")
        t0 = merge_cpu_clock()
        keep_u, global_threshold = schedule.global_topk(u_v, k)
        next_global = global_threshold if global_threshold > 0 else None  # as for the local one
        out = (u_v[keep_u], u_i[keep_u])
        # this rank's region is the slice of U (ascending) inside its boundaries
        lo, hi = torch.searchsorted(u_i.to(torch.int64), bounds_t[rank:rank + 2]).tolist()
        keep_mine = keep_u[lo:hi]
        cpu_s += merge_cpu_clock() - t0
    else:
        keep_mine = region[0].abs() >= plan.global_threshold
        kept = (region[0][keep_mine], region[1][keep_mine])
        out = yield from allgather_blocks(rank, P, kept, bounds_t, allgather, "allgather")
        next_global = schedule.next_global_threshold(plan.global_threshold, out[0].numel(), k, bands)
    drop = (region[0][~keep_mine], region[1][~keep_mine])
    stats = CommStats(collective="oktopk_allreduce", algorithm=allgather, merge_cpu_s=cpu_s, merged_elements=merged,
                      compress_cpu_s=select_cpu_s,
                      dropped_values=drop[0], dropped_indices=drop[1], library_estimate=False)
    return ProgramOutput(CollectiveResult(out[0], out[1], stats), (sel_v, sel_i), next_local, next_global, bounds)
