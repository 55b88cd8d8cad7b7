"""Aggregation collectives over torch.distributed (gloo on CPU, NCCL on GPU).

Public API (docs/architecture.md):

- :func:`dense_allreduce` — S-SGD baseline, ring allreduce of d floats (library call);
- :func:`topk_allgather` — Top-k S-SGD, allgather of every rank's (value, index) pairs;
- :func:`gtopk_allreduce` — gTop-k S-SGD, global top-k by merging k-sparse vectors along a
  butterfly (recursive doubling with fold/unfold, any P) or a binomial tree (the paper's
  reduce + broadcast).

Each returns ``CollectiveResult(values, indices, stats: CommStats)``. Sparse results are
canonical (ascending index) and bitwise identical on every rank.

How gTop-k is built: the algorithm of one rank is a generator (:func:`gtopk_program`) of
requests taken from :mod:`gtopk_lab.comm.schedules`, doing all merging with
:func:`gtopk_lab.compression.merge.merge_sparse`; a
:class:`~gtopk_lab.comm.recorder.Recorder` counts its rounds and a
:class:`~gtopk_lab.comm.links_transport.LinksTransport` (shared-memory rings between ranks on one
host, the project's TCP links between hosts) or a :class:`~gtopk_lab.comm.dist_transport.DistTransport`
(gloo, NCCL) carries them here, while
:mod:`gtopk_lab.comm.inprocess` carries the same rounds between virtual ranks in one
process. So real and simulated CommStats agree by construction.

Wire format of one sparse message (:func:`gtopk_lab.comm.wire.sparse_wire`): one buffer, an
8-byte int64 count n then n values and n indices (fp32 + int32 = 8 bytes per entry below
2**31 elements); with ``exact_k`` exactly k pairs and no count. ``bytes_sent`` counts the
header; ``messages`` counts one per message sent.
"""


from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from gtopk_lab.comm.allgather_links import ring_allgather
from gtopk_lab.comm.dist_transport import comm_device, global_rank, rank_world
from gtopk_lab.comm.gtopk_links import applies as over_links_applies
from gtopk_lab.comm.gtopk_links import gtopk_over_links
from gtopk_lab.comm.profiling import active_profile
from gtopk_lab.comm.programs import (
    allgather_assemble, allgather_ring_stats, allgather_steps, dense_stats, gtopk_program,
)
from gtopk_lab.comm.recorder import Recorder
from gtopk_lab.comm.schedules import cached_schedule
from gtopk_lab.comm.stats import CollectiveResult, Payload, check_algorithm, check_exact_k, check_k, check_numel, wire
from gtopk_lab.comm.transport import drive
from gtopk_lab.comm.transport_choice import cpu_links, transport_for
from gtopk_lab.comm.wire import PartsWire, sparse_wire
from gtopk_lab.compression.merge import check_sparse, index_dtype
from gtopk_lab.network.pacing import active_pacer

__all__ = ["dense_allreduce", "topk_allgather", "gtopk_allreduce", "rank_world", "comm_device", "global_rank"]


# ---------------------------------------------------------------------------------------
# public collectives
def dense_allreduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> CollectiveResult:
    """Sum ``tensor`` over all ranks, in place (dense S-SGD).

    Pattern: the backend's allreduce (ring for large tensors). Bytes are the ring's:
    2(P-1) rounds of ceil(bytes/P); cost 2(P-1) alpha + 2 (P-1)/P * d * 4 beta for fp32.
    Returns ``CollectiveResult(tensor, None, stats)`` with ``stats.library_estimate=True``.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor has type {type(tensor).__name__}: expected torch.Tensor")
    _rank, world = rank_world(group)
    device = comm_device(tensor, group)
    stats = dense_stats(tensor.numel() * tensor.element_size(), world)
    if world > 1:
        t0 = time.perf_counter()
        if tensor.device == device and tensor.is_contiguous():
            dist.all_reduce(tensor, group=group)
        else:
            buf = tensor.detach().to(device).contiguous()
            dist.all_reduce(buf, group=group)
            tensor.copy_(buf)
        pacer = active_pacer()
        if pacer is not None:
            pacer.pace_steps(t0, stats.steps)
    return CollectiveResult(tensor, None, stats)


def topk_allgather(values: torch.Tensor, indices: torch.Tensor, numel: int,
                   group: dist.ProcessGroup | None = None,
                   exact_count: int | None = None) -> CollectiveResult:
    """Top-k S-SGD aggregation: every rank gathers every rank's sparse vector and sums them.

    Pattern: allgather of the entry counts (ranks may select different numbers, e.g.
    GaussianK), then allgather of the (value, index) pairs padded to the largest count.
    Exact (nothing dropped): the result is the sparse sum of all selections, canonical.
    Cost (ring): 2(P-1) alpha + (P-1) * n_max * 8 beta per rank, growing linearly with P.
    A CPU rank whose group has links (shared memory, own TCP) gathers over them
    (:func:`~gtopk_lab.comm.allgather_links.ring_allgather`: the same bytes and rounds, their
    peers recorded); otherwise the backend's ``all_gather`` (``stats.library_estimate``).

    ``exact_count=k`` (every rank selected exactly k entries, e.g. the ``topk`` selector;
    all ranks pass the same value): the count allgather is skipped, one allgather of the
    pairs remains: (P-1) alpha + (P-1) k 8 beta. A rank whose selection is not k entries
    raises ``ValueError`` before sending anything.
    """
    check_numel(numel)
    check_sparse(values, indices, numel, name="topk_allgather(values, indices)")
    if exact_count is not None:
        check_k(exact_count, numel, name="exact_count")
        check_exact_k(True, {"this rank": values.numel()}, exact_count, f"exact_count={exact_count}")
    rank, world = rank_world(group)
    out_device = values.device
    values, indices = wire(values, indices, numel)
    vdt, idt = values.dtype, indices.dtype
    counted = exact_count is None
    if world == 1:
        result = allgather_assemble([values.numel()], [(values, indices)], vdt, idt, 1, counted)
        return result
    device = comm_device(values, group)
    # on a CPU rank the pairs take the group's links (shared memory or own TCP), as gTop-k's
    links = cpu_links(group) if device.type == "cpu" else None
    t0 = time.perf_counter()
    if counted and links is not None:
        mine_count = np.array([values.numel()], dtype=np.int64).view(np.uint8)
        counts = [int(b.view(np.int64)[0]) for b in ring_allgather(links, rank, world, mine_count)]
    elif counted:
        count = torch.tensor([values.numel()], dtype=torch.int64, device=device)
        counts_t = [torch.empty(1, dtype=torch.int64, device=device) for _ in range(world)]
        dist.all_gather(counts_t, count, group=group)
        counts = [int(c.item()) for c in counts_t]
    else:
        counts = [values.numel()] * world
    n_max = max(counts)
    gathered: list[Payload] = []
    if n_max > 0:  # every rank's pairs padded to the largest count, without a header
        pairs = PartsWire((vdt, idt), count=values.numel())
        pair = pairs.element_bytes
        buf = torch.zeros(n_max * pair, dtype=torch.uint8, device=device)
        mine = pairs.encode((values, indices), device)
        buf[: mine.numel()] = mine
        if links is not None:
            bufs = [torch.from_numpy(b) for b in ring_allgather(links, rank, world, buf.numpy())]
        else:
            bufs = [torch.empty_like(buf) for _ in range(world)]
            dist.all_gather(bufs, buf, group=group)
        gathered = [PartsWire((vdt, idt), count=c).decode(b, b[: c * pair]) for b, c in zip(bufs, counts)]
    pacer = active_pacer()
    if pacer is not None:  # the wire time comes before the local assembly that needs it
        pacer.pace_steps(t0, allgather_steps(counts, vdt, idt, world, counted))
    result = allgather_assemble(counts, gathered, vdt, idt, world, counted)
    stats = allgather_ring_stats(result.stats, rank, world) if links is not None else result.stats
    return CollectiveResult(result.values.to(out_device), result.indices.to(out_device), stats)


def gtopk_allreduce(values: torch.Tensor, indices: torch.Tensor, numel: int, k: int,
                    group: dist.ProcessGroup | None = None,
                    algorithm: str = "butterfly", exact_k: bool = False) -> CollectiveResult:
    """Global top-k of the sum of all ranks' sparse vectors (gTop-k S-SGD).

    ``algorithm="butterfly"``: recursive doubling, every rank merges in each of log2(P)
    rounds (fold/unfold for non-powers of two): log2(P) alpha + 2 k log2(P) * 8 beta.
    ``algorithm="tree"``: binomial reduce to rank 0 then broadcast (the paper):
    2 log2(P) alpha + 4 k log2(P) * 8 beta in the paper's model.
    Every rank returns the identical canonical (values, indices) with at most k entries.
    Entries dropped by merges are returned in ``stats.dropped_values/indices`` of the one
    rank they are charged to (empty tensors elsewhere), for the mass-conserving residual rule.

    ``exact_k=True`` (every rank's selection has exactly k distinct indices, e.g. the
    ``topk`` selector; see ``compression.selection.selects_exactly_k``): every message then
    holds exactly k pairs (a merge of two k-sets keeps k), so a round sends one message
    each way without the count header: one latency per round instead of two on a real
    link. All ranks must pass the same value; a rank whose selection is not k entries
    raises ``ValueError`` before sending anything.

    Inside ``gtopk_lab.comm.profiling.profiling()`` the call records where its time goes
    (prep, per-round pack / sendrecv / unpack / merge, finish); results are the same.
    """
    prof = active_profile()  # the one read the hooks cost when no profile is active
    stamp = prof.stamp() if prof is not None else None
    check_numel(numel)
    check_k(k, numel)
    check_algorithm(algorithm)
    name = "gtopk_allreduce(values, indices)"
    check_sparse(values, indices, None, name=name)
    rank, world = rank_world(group)
    out_device = values.device
    device = comm_device(values, group) if world > 1 else values.device
    check_exact_k(exact_k, {"this rank": values.numel()}, k)  # before anything is posted
    messages = sparse_wire(values.dtype, index_dtype(numel), k, exact_k)
    transport = transport_for(group, device, messages, profile=prof)
    if over_links_applies(transport, values, indices, numel, exact_k, world):
        # the same rounds and kernels without the program's layers: half a 1M call's time
        return gtopk_over_links(transport, rank, world, values, indices, numel, k, algorithm, name)
    if exact_k and world > 1 and transport.posts_ahead:
        # every receive's buffer waits for its message (DistTransport.plan), the first posted
        # before the local sort. A receive posted ahead cannot be taken back, so a bad index
        # (which the sort's compiled pass finds) leaves one that takes a later message; with
        # counts, receives are posted as each round comes, and a bad index leaves nothing
        transport.plan([s.peer for s in cached_schedule(algorithm, rank, world) if s.op != "send"])
    if prof is not None:  # the program adds its own range check and sort to prep
        prof.stop("prep", stamp)
    rec = Recorder(messages, rank, world)
    if values.device != device or indices.device != device:  # a no-op .to() still costs a dispatch
        values, indices = values.to(device), indices.to(device)
    gen = gtopk_program(rank, world, values, indices, numel, k, algorithm, profile=prof, name=name)
    result: CollectiveResult = drive(rec.wrap(gen), transport)
    stamp = prof.stamp() if prof is not None else None
    st = rec.fill(result.stats)
    st.drops_to(out_device)
    out = (result if result.values.device == out_device else
           CollectiveResult(result.values.to(out_device), result.indices.to(out_device), st))
    if prof is not None:
        prof.stop("finish", stamp)
    return out
