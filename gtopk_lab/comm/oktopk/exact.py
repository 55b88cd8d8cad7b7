"""``oktopk-exact``: an O(k) sparse allreduce in the style of Ok-Topk that keeps the **exact**
global top-k every call (the project's variant before issue 16; the method ``oktopk`` is now
the reference's algorithm, :mod:`gtopk_lab.comm.oktopk.drivers`).

Public API (re-exported by :mod:`gtopk_lab.comm.oktopk` and :mod:`gtopk_lab.collectives`;
same shapes as :func:`~gtopk_lab.collectives.gtopk_allreduce`):

- :func:`oktopk_allreduce` ``(values, indices, numel, k, group=None, state=None) -> CollectiveResult``
- :func:`sim_oktopk_allreduce` ``(values_list, indices_list, numel, k, state=None) -> list[CollectiveResult]``
- :class:`OkTopkState` — the small state object carried between iterations (region
  boundaries, re-balancing period); identical on every rank because it is only ever
  updated from globally agreed data.

Algorithm on rank r of P (one generator, :func:`oktopk_program`, shared by the real and the
simulated transport, so CommStats agree by construction):

0. **Re-balance** (on the first call with a state and then every ``rebalance_every`` calls;
   on every call when ``state`` is None): each rank bins its selected indices into
   ``B = min(numel, bins_per_region * P)`` equal-width bins; a recursive-doubling allreduce
   (fold/unfold for any P) of the B counts (int32; int64 if P*numel >= 2**31) gives the global histogram of selections,
   and region boundaries are cut at its P-quantiles. Region q = ``[b_q, b_{q+1})`` is
   reduced by rank q; with balanced regions every rank reduces about k entries.
1. **Sparse reduce-scatter** (shifted pairwise schedule): in round s = 1 .. P-1 rank r
   sends its entries of region (r+s) mod P to that rank and receives the entries of region
   r from rank (r-s) mod P. Rank r then sums its region's pieces in rank order
   (:func:`~gtopk_lab.compression.merge.coalesce_sparse`: deterministic, exact sum of all
   selections there).
2. **Exact global top-k threshold**: the key of an entry is the bit pattern of |v| read as
   a signed integer (monotone in |v|). A distributed multi-way bisection over the key range
   finds the k-th largest key t: each round every rank counts its entries with key >= each
   of ``threshold_probes + 1`` probe keys and the counts are summed by one recursive-doubling
   allreduce; the interval shrinks by ``threshold_probes`` per round (4 rounds for fp32 with
   the default 255 probes, whatever the data). If more entries tie at t than are needed,
   one more allreduce of P tie counts lets every rank take its share of ties in ascending
   index order. Result: exactly ``min(k, |union|)`` entries, the **exact** top-k of
   ``sum_i s_i`` with ties broken by lower index, i.e. what ``merge_sparse`` of the full sum
   keeps. (gTop-k's tree/butterfly merges are approximate; this is not.)
3. **Sparse allgather** (Bruck, any P; :func:`~gtopk_lab.comm.oktopk.rounds.bruck_allgather`):
   ceil(log2 P) rounds; in round j rank r sends the kept blocks it holds (regions r ..
   r+2^j-1) to rank r-2^j and receives the next ones from r+2^j. Each rank receives
   exactly k - kept_r pairs. Result sorted by index: canonical, identical on every rank.

Limitation (why ``oktopk`` no longer uses this): B equal-width bins cannot split a cluster
narrower than one bin, so layer-clustered selections (all large entries in one block) land in
one region, whose owner then receives about (P-1) k pairs: O(kP), not O(k).

Mass conservation: entries of region r that are not kept are returned in
``stats.dropped_values/indices`` of rank r (and nowhere else), so with the "mass" residual
rule ``sum_i residual_i + G == sum_i acc_i`` to rounding.

Wire format: :data:`gtopk_lab.comm.wire.BYTES` (one buffer: 8-byte length + uint8 payload).

Cost as implemented (alpha = latency, beta = s/byte, m = bytes per pair, h = 8, balanced
regions; L = rounds of one recursive-doubling allreduce = log2 P for powers of two,
floor(log2 P) + 2 otherwise; R = bisection rounds, 4 for fp32 with 255 probes; X = 1 when
ties straddle the threshold, else 0)::

    T = (P - 1) alpha + k (P-1)/P m beta + (P-1) h beta                   reduce-scatter
      + (R + X) L alpha + R L (c (probes + 1) + h) beta + X L (c P + h) beta  threshold
      + ceil(log2 P) alpha + k (P-1)/P m beta + ceil(log2 P) h beta          allgather
      + [every rebalance_every calls] L (alpha + (c B + h) beta)            re-balancing

with c = 4 bytes per count (8 when P * numel >= 2**31) and B the histogram bins

i.e. about ``(P + (R+1) log2 P) alpha + 2 k (P-1)/P m beta``: the bandwidth term is the
lower bound ``2k(P-1)/P m beta`` (background.md quotes <= 6k(P-1)/P for the paper's
data-balancing variant), the latency term is O(P) like the paper's ``(2P + 2 log2 P) alpha``.
Imbalanced regions (until the next re-balance) raise the reduce-scatter term up to
``(P-1) k m beta`` on the busiest rank. CPU: O(n log n) per rank for n local entries.

Example::

    state = OkTopkState(rebalance_every=16)
    result = oktopk_allreduce(values, indices, numel, k, state=state)
    G = result.values, result.indices           # identical on every rank
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from gtopk_lab.comm.dist_transport import comm_device, rank_world
from gtopk_lab.comm.inprocess import check_lists
from gtopk_lab.comm.oktopk.rounds import (
    Block, Request, allreduce_sum, as_bytes, bruck_allgather, magnitude_keys, pairs_from_bytes,
)
from gtopk_lab.comm.recorder import Recorder
from gtopk_lab.comm.stats import CollectiveResult, CommStats, check_k, check_numel, merge_cpu_clock, wire
from gtopk_lab.comm.transport import drive, run_programs
from gtopk_lab.comm.transport_choice import transport_for
from gtopk_lab.comm.wire import BYTES
from gtopk_lab.compression.merge import check_sparse, coalesce_sparse

__all__ = ["OkTopkState", "oktopk_allreduce", "sim_oktopk_allreduce", "oktopk_program",
           "equal_boundaries", "boundaries_from_histogram", "bisection_rounds"]


# =========================================================================== state
@dataclass
class OkTopkState:
    """What Ok-Topk carries between iterations on one rank (identical on every rank).

    Hyper-parameters (tuned by the user), validated at construction:

    - ``rebalance_every``: re-balance regions on the first call and then every this many calls;
    - ``bins_per_region``: histogram resolution, ``B = min(numel, bins_per_region * P)`` bins
      (the re-balancing allreduce carries B counts of 4 bytes, 8 when ``P * numel >= 2**31``);
    - ``threshold_probes``: probe keys per bisection round (message of 4 (probes+1) bytes).

    Internal state: ``boundaries`` (P+1 ints, None until the first call), ``numel`` and
    ``world_size`` they belong to, ``calls`` since the last re-balance, and ``phase_bytes``
    (bytes this rank sent per phase in the last call: rebalance, reduce_scatter, threshold,
    allgather).
    Holds no process group, so it pickles.
    """

    # tuned by the user
    rebalance_every: int = 16
    bins_per_region: int = 8
    threshold_probes: int = 255
    # internal state
    boundaries: list[int] | None = None
    numel: int | None = None
    world_size: int | None = None
    calls: int = 0
    phase_bytes: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, low in (("rebalance_every", 1), ("bins_per_region", 1), ("threshold_probes", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name}={value!r} has type {type(value).__name__}: expected int")
            if value < low:
                raise ValueError(f"{name}={value!r} is invalid: expected an integer >= {low}")

    def due(self, numel: int, world_size: int) -> bool:
        """Whether this call re-balances (first call, size change, or period reached)."""
        if self.boundaries is None or self.numel != numel or self.world_size != world_size:
            return True
        return self.calls % self.rebalance_every == 0

    def current(self, numel: int, world_size: int) -> list[int]:
        """Boundaries to use if this call does not re-balance."""
        if self.boundaries is None or self.numel != numel or self.world_size != world_size:
            return equal_boundaries(numel, world_size)
        return list(self.boundaries)

    def advance(self, boundaries: list[int], numel: int, world_size: int, rebalanced: bool) -> None:
        if rebalanced or self.numel != numel or self.world_size != world_size:
            self.calls = 0
        self.boundaries, self.numel, self.world_size = list(boundaries), numel, world_size
        self.calls += 1


def equal_boundaries(numel: int, world_size: int) -> list[int]:
    """P+1 boundaries of P equal-width regions of ``[0, numel)``."""
    return [q * numel // world_size for q in range(world_size + 1)]


def boundaries_from_histogram(hist: torch.Tensor, numel: int, world_size: int) -> list[int]:
    """Cut ``[0, numel)`` at the P-quantiles of a histogram of selected indices.

    ``hist[b]`` counts selections in bin b = ``[b*numel//B, (b+1)*numel//B)``. Boundary q
    (1 <= q < P) is the right edge of the first bin where the cumulative count reaches
    ``ceil(q * total / P)``; an empty histogram gives equal regions. O(B + P log B).
    """
    nbins = hist.numel()
    total = int(hist.sum())
    if total == 0:
        return equal_boundaries(numel, world_size)
    cum = torch.cumsum(hist.to(torch.int64).cpu(), 0)
    targets = torch.tensor([-(-q * total // world_size) for q in range(1, world_size)], dtype=torch.int64)
    bins = torch.searchsorted(cum, targets).tolist()
    inner = [min(numel, (b + 1) * numel // nbins) for b in bins]
    return [0] + inner + [numel]


def bisection_rounds(threshold_probes: int = 255, key_bits: int = 31) -> int:
    """Upper bound R on threshold rounds: the key interval (2**key_bits wide) shrinks by
    ``threshold_probes`` per round and is resolved by the round in which it fits the probes."""
    width, rounds = (1 << key_bits) - 1, 1
    while width > threshold_probes:
        width = -(-width // threshold_probes)
        rounds += 1
    return rounds


# =========================================================================== the program
def oktopk_program(rank: int, world_size: int, values: torch.Tensor, indices: torch.Tensor,
                   numel: int, k: int, boundaries: Sequence[int], rebalance: bool = True,
                   bins_per_region: int = 8, threshold_probes: int = 255,
                   ) -> Generator[Request, torch.Tensor | None, tuple[CollectiveResult, list[int]]]:
    """Ok-Topk on one rank as a generator of requests (see the module docstring).

    Yields the requests of :mod:`gtopk_lab.comm.recorder` on uint8 buffers, each named by its
    phase (rebalance, reduce_scatter, threshold, allgather). Returns ``(result, boundaries
    used)``; the driver's recorder fills in the result's bytes and rounds.
    ``values``/``indices`` must already be in wire dtypes.
    """
    P = world_size
    vdt, idt = values.dtype, indices.dtype
    dev = values.device
    t0 = merge_cpu_clock()
    order = torch.argsort(indices.to(torch.int64))
    loc_v, loc_i = values[order], indices[order]
    loc_i64 = loc_i.to(torch.int64)
    cpu_s = merge_cpu_clock() - t0

    # 0. re-balance the regions from the global histogram of selected indices
    # Counts never exceed P * numel (unique indices per rank): int32 on the wire when that fits.
    count_dtype = torch.int32 if P * numel < 2**31 else torch.int64
    bounds = list(boundaries)
    if rebalance and P > 1:
        nbins = min(numel, bins_per_region * P)
        hist = torch.bincount((loc_i64 * nbins) // numel, minlength=nbins).to(count_dtype)
        ghist = yield from allreduce_sum(rank, P, hist, "rebalance")
        bounds = boundaries_from_histogram(ghist, numel, P)
    bounds_t = torch.tensor(bounds, dtype=torch.int64, device=dev)

    # 1. sparse reduce-scatter, shifted pairwise schedule
    cuts = torch.searchsorted(loc_i64, bounds_t).tolist()
    pieces = [(loc_v[cuts[q]:cuts[q + 1]], loc_i[cuts[q]:cuts[q + 1]]) for q in range(P)]
    received: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * P
    received[rank] = pieces[rank]
    for s in range(1, P):
        dst, src = (rank + s) % P, (rank - s) % P
        theirs = yield ("sendrecv", (dst, src), as_bytes(*pieces[dst]), "reduce_scatter")
        received[src] = pairs_from_bytes(theirs, vdt, idt)
    t0 = merge_cpu_clock()
    region_v, region_i = coalesce_sparse(torch.cat([p[0] for p in received if p is not None]),
                                         torch.cat([p[1] for p in received if p is not None]))
    keys = magnitude_keys(region_v)
    sorted_keys = torch.sort(keys).values
    cpu_s += merge_cpu_clock() - t0

    def count_ge(probes: list[int]) -> torch.Tensor:
        pt = torch.tensor(probes, dtype=torch.int64, device=dev)
        ge = sorted_keys.numel() - torch.searchsorted(sorted_keys, pt)  # entries with key >= probe
        return ge.to(count_dtype)

    # 2. exact k-th largest key by multi-way bisection; invariant c(lo) >= k > c(hi + 1)
    key_max = torch.iinfo({8: torch.int64, 4: torch.int32, 2: torch.int16}[region_v.element_size()]).max
    lo, hi = 0, int(key_max)
    c_lo: int | None = None
    c_hi1 = 0
    keep = torch.zeros(region_v.numel(), dtype=torch.bool, device=dev)
    keep_all = False
    while True:
        width = hi - lo
        if width <= threshold_probes:
            probes = list(range(lo, hi + 1))
        else:
            probes = [lo] + [lo + width * j // threshold_probes for j in range(1, threshold_probes + 1)]
        if c_lo is not None and width == 0:
            break
        counts = yield from allreduce_sum(rank, P, count_ge(probes), "threshold")
        c = counts.tolist()
        if c_lo is None and c[0] <= k:  # probe 0 counts every reduced entry: all fit
            keep_all = True
            break
        new_lo, new_c_lo = lo, c[0]
        for p, cp in zip(probes, c):
            if cp >= k:
                new_lo, new_c_lo = p, cp
            else:
                hi, c_hi1 = p - 1, cp
                break
        lo, c_lo = new_lo, new_c_lo
        if lo == hi:
            break
    if keep_all:
        keep[:] = True
    else:
        t = lo
        keep = keys > t
        ties = keys == t
        need = k - c_hi1
        assert c_lo is not None
        if c_lo == k:
            keep |= ties
        else:  # ties straddle the threshold: lower indices (lower ranks, then ascending) win
            slot = torch.zeros(P, dtype=count_dtype, device=dev)
            slot[rank] = int(ties.sum())
            tie_counts = yield from allreduce_sum(rank, P, slot, "threshold")
            before = int(tie_counts[:rank].sum())
            take = max(0, min(int(tie_counts[rank]), need - before))
            tie_pos = torch.nonzero(ties).flatten()[:take]  # region_i ascending: lowest indices
            keep[tie_pos] = True
    kept_v, kept_i = region_v[keep], region_i[keep]
    drop_v, drop_i = region_v[~keep], region_i[~keep]

    # 3. Bruck allgather of the kept blocks (block q = region q's kept entries)
    def by_region(incoming: Block, owners: list[int]) -> list[Block]:
        region_of = torch.searchsorted(bounds_t[1:-1], incoming[1].to(torch.int64), right=True)
        sizes = torch.bincount(region_of, minlength=P)[owners].tolist()
        return list(zip(torch.split(incoming[0], sizes), torch.split(incoming[1], sizes)))

    ordered = yield from bruck_allgather(rank, P, (kept_v, kept_i), by_region, "allgather")
    t0 = merge_cpu_clock()
    # region order is ascending index order: canonical
    out_v = torch.cat([b[0] for b in ordered])
    out_i = torch.cat([b[1] for b in ordered])
    cpu_s += merge_cpu_clock() - t0

    stats = CommStats(collective="oktopk_allreduce", algorithm="oktopk", merge_cpu_s=cpu_s,
                      dropped_values=drop_v, dropped_indices=drop_i, library_estimate=False)
    return CollectiveResult(out_v, out_i, stats), bounds


# =========================================================================== drivers
def _phase_bytes(rec: Recorder) -> dict[str, int]:
    return {name: phase["sent"] for name, phase in rec.phases.items()}


def _check_state(state: OkTopkState | None) -> OkTopkState:
    if state is None:
        return OkTopkState(rebalance_every=1)
    if not isinstance(state, OkTopkState):
        raise TypeError(f"state={state!r} has type {type(state).__name__}: expected OkTopkState or None")
    return state


def oktopk_allreduce(values: torch.Tensor, indices: torch.Tensor, numel: int, k: int,
                     group: dist.ProcessGroup | None = None,
                     state: OkTopkState | None = None) -> CollectiveResult:
    """Exact global top-k of the sum of all ranks' sparse vectors in O(k) bytes per rank.

    Region-balanced sparse reduce-scatter (P-1 shifted rounds), exact threshold by
    multi-way bisection over recursive-doubling allreduces of counts, Bruck sparse
    allgather; see the module docstring for the steps and the cost
    ``~ (P + (R+1) log2 P) alpha + 2k(P-1)/P * m beta``. Every rank returns the identical
    canonical (values, indices) with ``min(k, |union of selections|)`` entries; the region
    owner's ``stats.dropped_values/indices`` hold the reduced entries it did not keep
    (mass-conserving rule). ``state`` carries the region boundaries between calls
    (re-balanced every ``state.rebalance_every`` calls); None re-balances on every call.
    Works with gloo (CPU buffers) and NCCL (buffers on the tensor's GPU).
    """
    check_numel(numel)
    check_k(k, numel)
    check_sparse(values, indices, numel, name="oktopk_allreduce(values, indices)")
    st = _check_state(state)
    rank, world = rank_world(group)
    out_device = values.device
    device = comm_device(values, group) if world > 1 else values.device
    values, indices = wire(values.to(device), indices.to(device), numel)
    rebalance = st.due(numel, world)
    gen = oktopk_program(rank, world, values, indices, numel, k, st.current(numel, world), rebalance,
                         st.bins_per_region, st.threshold_probes)
    rec = Recorder(BYTES, rank, world)
    result, bounds = drive(rec.wrap(gen), transport_for(group, device, BYTES))
    st.advance(bounds, numel, world, rebalance)
    st.phase_bytes = _phase_bytes(rec)
    s = rec.fill(result.stats)
    s.dropped_values = s.dropped_values.to(out_device)  # type: ignore[union-attr]
    s.dropped_indices = s.dropped_indices.to(out_device)  # type: ignore[union-attr]
    return CollectiveResult(result.values.to(out_device), result.indices.to(out_device), s)


def sim_oktopk_allreduce(values_list: list[torch.Tensor], indices_list: list[torch.Tensor], numel: int,
                         k: int, state: OkTopkState | None = None) -> list[CollectiveResult]:
    """Ok-Topk between virtual ranks in one process: the real per-rank programs, in-memory mail.

    Same values, bytes, steps and drops as :func:`oktopk_allreduce` on P real ranks (one
    ``state`` stands for the P identical per-rank states).
    """
    check_numel(numel)
    check_k(k, numel)
    check_lists(values_list, indices_list, numel)
    st = _check_state(state)
    world = len(values_list)
    rebalance = st.due(numel, world)
    bounds = st.current(numel, world)
    recs = [Recorder(BYTES, r, world) for r in range(world)]
    outs = run_programs([rec.wrap(oktopk_program(r, world, *wire(v, i, numel), numel, k, bounds, rebalance,
                                                 st.bins_per_region, st.threshold_probes))
                         for r, (rec, v, i) in enumerate(zip(recs, values_list, indices_list))])
    st.advance(outs[0][1], numel, world, rebalance)
    st.phase_bytes = _phase_bytes(recs[0])
    return [CollectiveResult(o[0].values, o[0].indices, rec.fill(o[0].stats)) for o, rec in zip(outs, recs)]
