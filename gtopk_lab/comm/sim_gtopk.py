"""gTop-k between P virtual ranks with every merge computed once (the simulator's fast path).

The per-rank programs (:func:`~gtopk_lab.comm.programs.gtopk_program` under
:func:`~gtopk_lab.comm.transport.run_programs`) make every rank of a butterfly round merge the
same two operands as its partner, lower rank first: P log2 P merges, each behind a generator
and a recorder. Both partners then hold bitwise the same tensors (``merge_sparse`` is
deterministic), and after round r every aligned block of 2^(r+1) ranks does. So the merges are
a reduction over blocks, P - 1 of them for any P, as the binomial tree's reduce already is:

1. every rank's selection in the wire format, sorted by index: rank 0's by ``canonical_wire``
   as its own call makes it, the others' in one stable sort of the stacked rows where they
   are alike (the same result), each rank charged rank 0's CPU time;
2. butterfly, m = 2^floor(log2 P), e = P - m: the fold merges rank j's vector with rank
   m + j's (j < e); then for r = 0 .. log2 m - 1 the vector of each block [s, s + 2^(r+1))
   is ``merge_sparse(vec[s], vec[s + 2^r])``, charged to s (its lowest rank) for the drops;
   the unfold hands the result back to the e extra ranks. Tree: the reduce level by level,
   ``vec[s] = merge_sparse(vec[s], vec[s + 2^r])`` where s + 2^r < P, charged to s; the
   broadcast hands out the result. P = 1: one merge with an empty operand keeps k. The
   butterfly's levels over m and the tree's reduce are one pairwise reduction: every level's
   merges in one compiled call
   (:func:`~gtopk_lab.compression.fast_merge_many.numba_reduce_levels`, the same kernel;
   the fold's merges and a reduction it declines go level by level, through
   :func:`~gtopk_lab.compression.fast_merge_many.numba_merge_many`), and every merge of a
   level is charged the CPU time of its first merge made again as its ranks' own call makes
   it, as each real rank pays one call's overhead (at k = 52 a call is ~100 us of overhead
   for ~1 us of merging);
3. every rank's rounds as its schedule (:func:`~gtopk_lab.comm.schedules.sparse_schedule`)
   would record them: ``(bytes sent, bytes received)`` of the vectors each round carries in
   the wire format, a message per round that sends; merged elements and measured merge CPU
   of every merge the rank's own program would make; the drops it is charged, as the
   program returns them (one part as is, several as ``dropped_parts``).

Results and ``CommStats`` equal the per-rank programs' (tests/test_sim_gtopk.py checks every
field but the measured ``merge_cpu_s`` for P = 1 .. 17, 32, 64 and both patterns); every
rank's result is the same tensor (as a tree broadcast's already is): do not modify it in
place. Cost: P - 1 merges of at most 2k pairs in one compiled call plus log2 P timed ones, one ``canonical_wire``
and one batched sort, and O(P log P) Python steps for the accounting, against P log2 P
merges and generator rounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from gtopk_lab.comm.schedules import largest_power_of_two
from gtopk_lab.comm.stats import CollectiveResult, CommStats, merge_cpu_clock
from gtopk_lab.comm.wire import PartsWire
from gtopk_lab.compression.fast_merge_many import numba_merge_many, numba_reduce_levels, reduction_levels
from gtopk_lab.compression.merge import canonical_wire, index_dtype, merge_sparse

__all__ = ["sim_gtopk_shared_merges"]


class _Vec(NamedTuple):
    """A sparse vector some ranks hold, with its wire size."""

    values: torch.Tensor
    indices: torch.Tensor
    nbytes: int


class _Ledger:
    """Every rank's rounds, messages, merges and drops (step 3), filled as the merges run."""

    def __init__(self, world: int, wire: PartsWire, k: int) -> None:
        self.wire, self.k = wire, k
        self.steps: list[list[tuple[int, int]]] = [[] for _ in range(world)]
        self.peers: list[list[tuple[int | None, int | None]]] = [[] for _ in range(world)]
        self.messages = [0] * world
        self.merged = [0] * world
        self.cpu_s = [0.0] * world
        self.drops: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(world)]
        self._nbytes: dict[int, int] = {}

    def vec(self, values: torch.Tensor, indices: torch.Tensor) -> _Vec:
        # a message's size depends only on its pair count here (one dtype pair per call)
        n = values.numel()
        nbytes = self._nbytes.get(n)
        if nbytes is None:
            nbytes = self._nbytes[n] = self.wire.nbytes((values, indices))
        return _Vec(values, indices, nbytes)

    def move(self, src: int, dst: int, vec: _Vec) -> None:
        """One round: ``src`` sends ``vec`` to ``dst``."""
        self.steps[src].append((vec.nbytes, 0))
        self.peers[src].append((dst, None))
        self.messages[src] += 1
        self.steps[dst].append((0, vec.nbytes))
        self.peers[dst].append((None, src))

    def exchange_blocks(self, lo: int, half: int, lo_vec: _Vec, hi_vec: _Vec) -> None:
        """One butterfly round between the blocks ``[lo, lo + half)`` (holding ``lo_vec``) and
        ``[lo + half, lo + 2 half)`` (``hi_vec``): rank i and i + half each send their vector."""
        steps, peers, messages = self.steps, self.peers, self.messages
        down, up = (lo_vec.nbytes, hi_vec.nbytes), (hi_vec.nbytes, lo_vec.nbytes)
        for i in range(lo, lo + half):
            j = i + half
            steps[i].append(down)
            steps[j].append(up)
            peers[i].append((j, j))
            peers[j].append((i, i))
            messages[i] += 1
            messages[j] += 1

    def merge(self, first: _Vec, second: _Vec, charged: int, by: Sequence[int]) -> _Vec:
        """``merge_sparse(first, second)`` once, for the ranks ``by`` that would each make it."""
        return self.merge_level([(first, second, charged, by)])[0]

    def merge_level(self, merges: Sequence[tuple[_Vec, _Vec, int, Sequence[int]]]) -> list[_Vec]:
        """The independent merges of one level, ``(first, second, charged, by)`` each: the
        first as its ranks' own call would make it (timed: every merge of the level is charged
        its CPU, as each real rank makes one such call), the others in one compiled call where
        it applies (:func:`~gtopk_lab.compression.fast_merge_many.numba_merge_many`: the same
        kernel, so bitwise ``merge_sparse``'s results), else one by one, each timed."""
        out, cpu = self.timed_merge(merges[0][0], merges[0][1])
        outs, cpu_s = [out], [cpu] * len(merges)
        rest = numba_merge_many([(a.values, a.indices, b.values, b.indices) for a, b, _, _ in merges[1:]],
                                self.k) if len(merges) > 2 else None
        if rest is not None:
            outs += rest
        else:
            for j, (a, b, _, _) in enumerate(merges[1:], start=1):
                out, cpu_s[j] = self.timed_merge(a, b)
                outs.append(out)
        return self.account(merges, outs, cpu_s)

    def timed_merge(self, first: _Vec, second: _Vec) -> tuple[tuple, float]:
        """``merge_sparse(first, second)`` made as a rank's own call would make it, and its CPU
        seconds."""
        t0 = merge_cpu_clock()
        out = merge_sparse(first.values, first.indices, second.values, second.indices, self.k)
        return out, merge_cpu_clock() - t0

    def account(self, merges: Sequence[tuple[_Vec, _Vec, int, Sequence[int]]], outs: Sequence[tuple],
                cpu_s: Sequence[float]) -> list[_Vec]:
        """Step 3 for one level's merges and their results ``outs``: merged elements and CPU
        to every rank in ``by``, the drops to ``charged``; the kept vectors."""
        results = []
        for (a, b, charged, by), (values, indices, d_v, d_i), cpu in zip(merges, outs, cpu_s):
            n = a.values.numel() + b.values.numel()
            for r in by:
                self.merged[r] += n
                self.cpu_s[r] += cpu
            self.drops[charged].append((d_v, d_i))
            results.append(self.vec(values, indices))
        return results

    def result(self, rank: int, final: _Vec, algorithm: str,
               empty: tuple[torch.Tensor, torch.Tensor] | None = None) -> CollectiveResult:
        """Rank ``rank``'s result and stats; ``empty``: the (values, indices) pair of a rank
        charged no single drop (one pair shared by every such rank of the call)."""
        drops = self.drops[rank]
        if len(drops) == 1:
            drop_v, drop_i = drops[0]
        else:
            drop_v, drop_i = empty or (final.values.new_empty(0), final.indices.new_empty(0))
        steps = self.steps[rank]
        stats = CommStats(collective="gtopk_allreduce", algorithm=algorithm, merge_cpu_s=self.cpu_s[rank],
                          merged_elements=self.merged[rank], dropped_values=drop_v, dropped_indices=drop_i,
                          library_estimate=False, dropped_parts=drops if len(drops) > 1 else None,
                          bytes_sent=sum(s for s, _ in steps), bytes_recv=sum(r for _, r in steps),
                          messages=self.messages[rank], rounds=len(steps), steps=steps,
                          peers=self.peers[rank])
        return CollectiveResult(final.values, final.indices, stats)


def _merge_into(vec: list[_Vec], ledger: _Ledger, merges: list[tuple[int, int, Sequence[int]]]) -> None:
    """``vec[lo] = merge(vec[lo], vec[hi])`` for every ``(lo, hi, by)`` of one level (the
    merges are independent: no ``lo`` is another's ``hi``), charged to ``lo``."""
    if merges:
        merged = ledger.merge_level([(vec[lo], vec[hi], lo, by) for lo, hi, by in merges])
        for (lo, _, _), result in zip(merges, merged):
            vec[lo] = result


def _reduce(vec: list[_Vec], ledger: _Ledger, n: int, butterfly: bool,
            packed: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """``vec[0]`` = the pairwise reduction of ``vec[:n]``, level by level (half = 1, 2, ...:
    ``vec[s] = merge(vec[s], vec[s + half])``, charged to s), every level's rounds recorded:
    a butterfly (n a power of two) exchanges within each block, all its ranks making the
    merge; a tree's upper rank sends, the lower merges. Every level's merges come from one
    compiled call where it applies (``numba_reduce_levels``), each level charged its first
    merge's CPU as its ranks' own call makes it; else level by level (``merge_level``).
    ``packed``: ``vec[:n]``'s values and indices concatenated (step 1 made them so), or None."""
    levels = reduction_levels(n)
    compiled = (numba_reduce_levels([(v.values, v.indices) for v in vec[:n]], ledger.k, packed=packed)
                if n > 2 else None)
    done = 0
    for level in levels:
        half = level[0][1] - level[0][0]
        merges = []
        for lo, hi in level:
            if butterfly:
                ledger.exchange_blocks(lo, half, vec[lo], vec[hi])
                merges.append((vec[lo], vec[hi], lo, range(lo, hi + half)))
            else:
                ledger.move(hi, lo, vec[hi])
                merges.append((vec[lo], vec[hi], lo, (lo,)))
        if compiled is None:
            merged = ledger.merge_level(merges)
        else:
            outs = compiled[done:done + len(level)]
            done += len(level)
            # the level's charge: its first merge made again as a rank's own call (result discarded)
            cpu = ledger.timed_merge(merges[0][0], merges[0][1])[1]
            merged = ledger.account(merges, outs, [cpu] * len(level))
        for (lo, _), result in zip(level, merged):
            vec[lo] = result


def _butterfly(vec: list[_Vec], ledger: _Ledger, packed: tuple[torch.Tensor, torch.Tensor] | None) -> _Vec:
    world = len(vec)
    m = largest_power_of_two(world)
    extra = world - m
    for j in range(extra):  # fold
        ledger.move(m + j, j, vec[m + j])
    _merge_into(vec, ledger, [(j, m + j, (j,)) for j in range(extra)])
    _reduce(vec, ledger, m, butterfly=True, packed=None if extra else packed)  # a fold changed vec
    for j in range(extra):  # unfold
        ledger.move(j, m + j, vec[0])
    return vec[0]


def _tree(vec: list[_Vec], ledger: _Ledger, packed: tuple[torch.Tensor, torch.Tensor] | None) -> _Vec:
    world = len(vec)
    _reduce(vec, ledger, world, butterfly=False, packed=packed)
    for level in reversed(reduction_levels(world)):  # broadcast: the reduce's pairs, top level first
        for lo, hi in level:
            ledger.move(lo, hi, vec[0])
    return vec[0]


def _canonical_all(values_list: Sequence[torch.Tensor], indices_list: Sequence[torch.Tensor], numel: int,
                   ledger: _Ledger) -> tuple[list[tuple[torch.Tensor, torch.Tensor]],
                                             tuple[torch.Tensor, torch.Tensor] | None]:
    """Step 1 for every rank: rank 0's ``canonical_wire`` as its own call makes it (timed,
    charged to every rank, as each real rank makes one such call), the others' rows in one
    stable sort by index where they are alike (one dtype and length, indices in range), which
    is ``canonical_wire``'s result (a stable sort by index, int32 indices); else each rank's
    own call, timed. Returns the P pairs and, from the batched sort, their values and indices
    concatenated in rank order (what the compiled reduction reads; else None)."""
    t0 = merge_cpu_clock()
    out = [canonical_wire(values_list[0], indices_list[0], numel)]
    cpu_s = merge_cpu_clock() - t0
    rest = _sorted_rows(values_list[1:], indices_list[1:], numel)
    if rest is not None:
        (sorted_v, sorted_i) = rest
        out += list(zip(sorted_v.unbind(0), sorted_i.unbind(0)))
        ledger.cpu_s = [cpu_s] * len(values_list)
        packed = None
        if out[0][0].dtype == sorted_v.dtype and out[0][1].dtype == sorted_i.dtype:
            packed = (torch.cat([out[0][0], sorted_v.reshape(-1)]), torch.cat([out[0][1], sorted_i.reshape(-1)]))
        return out, packed
    ledger.cpu_s[0] += cpu_s
    for r in range(1, len(values_list)):
        t0 = merge_cpu_clock()
        out.append(canonical_wire(values_list[r], indices_list[r], numel))
        ledger.cpu_s[r] += merge_cpu_clock() - t0
    return out, None


def _sorted_rows(values_list: Sequence[torch.Tensor], indices_list: Sequence[torch.Tensor], numel: int
                 ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`_canonical_all`'s batched sort (the sorted ``[n, k]`` values and int32 indices,
    row r rank r's), or None where the ranks' selections differ in
    dtype, device or length, are not CPU float32 with int32/int64 indices, hold indices out of
    [0, numel) (their own calls then raise the error naming them) or numel needs int64."""
    if len(values_list) < 2 or index_dtype(numel) != torch.int32:
        return None
    v0, i0 = values_list[0], indices_list[0]
    if (v0.dtype != torch.float32 or i0.dtype not in (torch.int32, torch.int64) or v0.device.type != "cpu"
            or i0.device.type != "cpu" or v0.dim() != 1 or v0.numel() == 0 or i0.shape != v0.shape):
        return None
    if any(v.dtype != v0.dtype or i.dtype != i0.dtype or v.shape != v0.shape or i.shape != v0.shape
           or v.device != v0.device or i.device != i0.device for v, i in zip(values_list, indices_list)):
        return None
    indices = torch.stack(list(indices_list))
    lo, hi = torch.aminmax(indices)
    if int(lo) < 0 or int(hi) >= numel:
        return None
    order = torch.argsort(indices, dim=1, stable=True)
    sorted_i = torch.gather(indices, 1, order).to(torch.int32)
    sorted_v = torch.gather(torch.stack(list(values_list)), 1, order)
    return sorted_v, sorted_i


def sim_gtopk_shared_merges(values_list: Sequence[torch.Tensor], indices_list: Sequence[torch.Tensor],
                            numel: int, k: int, algorithm: str, wire: PartsWire) -> list[CollectiveResult]:
    """Steps 1-3 of the module docstring for checked inputs (``inprocess.sim_gtopk_allreduce``
    checks them) in the wire format ``wire`` (``sparse_wire``): one result per rank."""
    world = len(values_list)
    ledger = _Ledger(world, wire, k)
    canonical, packed = _canonical_all(values_list, indices_list, numel, ledger)
    vec = [ledger.vec(values, indices) for values, indices in canonical]
    if world == 1:  # no partner: canonicalise and keep k, the one rank owns the drops
        only = vec[0]
        empty = _Vec(only.values.new_empty(0), only.indices.new_empty(0), 0)  # never sent
        final = ledger.merge(only, empty, charged=0, by=(0,))
    else:
        final = (_butterfly if algorithm == "butterfly" else _tree)(vec, ledger, packed)
    empty = (final.values.new_empty(0), final.indices.new_empty(0))
    return [ledger.result(r, final, algorithm, empty) for r in range(world)]
