"""Aggregation collectives over torch.distributed (gloo on CPU, NCCL on GPU).

Public API (docs/architecture.md):

- :func:`dense_allreduce` — S-SGD baseline, ring allreduce of d floats (library call);
- :func:`topk_allgather` — Top-k S-SGD, allgather of every rank's (value, index) pairs;
- :func:`gtopk_allreduce` — gTop-k S-SGD, global top-k by merging k-sparse vectors along a
  butterfly (recursive doubling with fold/unfold, any P) or a binomial tree (the paper's
  reduce + broadcast).

Each returns ``CollectiveResult(values, indices, stats: CommStats)``. Sparse results are
canonical (ascending index) and bitwise identical on every rank.

How the sparse collectives are built: the algorithm of one rank is a generator
(:func:`gtopk_program`) that yields communication requests ``(op, peer, payload)`` taken
from :mod:`gtopk_lab.schedules` and does all merging with
:func:`gtopk_lab.compression.merge.merge_sparse`. Here a driver carries the requests out with
torch.distributed point-to-point calls; :mod:`gtopk_lab.collectives_sim` carries the same
requests out between virtual ranks in one process. Byte counts come from the generator, so
real and simulated CommStats agree by construction.

Wire format of one sparse message: an 8-byte int64 header holding the entry count n, then
(if n > 0) one uint8 payload of n values followed by n indices (fp32 + int32 = 8 bytes per
entry below 2**31 elements). ``bytes_sent`` counts header and payload; ``messages`` counts
both messages.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist

from gtopk_lab.compression.merge import (
    check_sparse, coalesce_sparse, index_dtype, merge_sparse, sort_by_index,
)
from gtopk_lab.network.pacing import active_pacer
from gtopk_lab.schedules import (
    SPARSE_ALGORITHMS, ring_allgather_steps, ring_allreduce_steps, sparse_schedule,
)

__all__ = [
    "CommStats", "CollectiveResult", "dense_allreduce", "topk_allgather", "gtopk_allreduce",
    "oktopk_allreduce", "OkTopkState",
    "gtopk_program", "HEADER_BYTES", "sparse_message_bytes", "allgather_assemble", "allgather_steps",
]

#: Bytes of the count header that precedes every sparse point-to-point message.
HEADER_BYTES = 8


@dataclass
class CommStats:
    """What one rank sent and received in one collective call (see docs/architecture.md)."""

    collective: str
    algorithm: str
    bytes_sent: int = 0
    bytes_recv: int = 0
    messages: int = 0
    rounds: int = 0
    #: per round on this rank: (bytes_sent, bytes_recv), in order
    steps: list[tuple[int, int]] = field(default_factory=list)
    #: CPU seconds this rank spent merging inside the collective
    merge_cpu_s: float = 0.0
    #: input entries of those merges (both operands; the gathered P*k of an allgather):
    #: ``merge_cpu_s / merged_elements`` is gamma as the collective itself ran it
    merged_elements: int = 0
    #: entries dropped by merges and charged to THIS rank (mass-conserving rule), canonical;
    #: None for exact collectives, empty tensors on gTop-k ranks that own no drops
    dropped_values: torch.Tensor | None = None
    dropped_indices: torch.Tensor | None = None
    #: True when the bytes come from the ring formula of a library collective
    library_estimate: bool = False
    #: drops of several merges charged to this rank, each canonical, not yet summed: the
    #: first read of ``dropped_values`` or ``dropped_indices`` coalesces them (so the
    #: collective does not pay for bookkeeping only the "mass" residual rule reads)
    dropped_parts: list[tuple[torch.Tensor, torch.Tensor]] | None = field(default=None, repr=False,
                                                                         compare=False)

    def _coalesce_drop_parts(self) -> None:
        parts = self.__dict__.get("dropped_parts")
        if parts:
            self.__dict__["dropped_parts"] = None
            v, i = coalesce_sparse(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
            self.__dict__["_dropped_values"], self.__dict__["_dropped_indices"] = v, i

    def drops_to(self, device: torch.device) -> None:
        """Move the drops (pending parts or coalesced tensors) to ``device`` without summing."""
        parts = self.__dict__.get("dropped_parts")
        if parts:
            self.dropped_parts = [(v.to(device), i.to(device)) for v, i in parts]
        elif self.dropped_values is not None and self.dropped_indices is not None:
            self.dropped_values = self.dropped_values.to(device)
            self.dropped_indices = self.dropped_indices.to(device)


def _lazy_drop_field(name: str) -> property:
    key = "_" + name

    def get(self: CommStats) -> torch.Tensor | None:
        self._coalesce_drop_parts()
        return self.__dict__.get(key)

    def put(self: CommStats, value: torch.Tensor | None) -> None:
        self.__dict__[key] = value

    return property(get, put, doc=f"{name}: the drops charged to this rank (pending parts summed on read)")


# installed after @dataclass so that the generated __init__/repr/eq go through them
CommStats.dropped_values = _lazy_drop_field("dropped_values")  # type: ignore[assignment]
CommStats.dropped_indices = _lazy_drop_field("dropped_indices")  # type: ignore[assignment]


class CollectiveResult(NamedTuple):
    """Result of a collective: global values/indices (indices None for dense) and stats."""

    values: torch.Tensor
    indices: torch.Tensor | None
    stats: CommStats


# ---------------------------------------------------------------------------------------
# validation helpers
def _check_k(k: int, numel: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k={k!r} has type {type(k).__name__}: expected int")
    if not 1 <= k <= numel:
        raise ValueError(f"k={k!r} is invalid: expected 1 <= k <= numel={numel}")


def _check_numel(numel: int) -> None:
    if isinstance(numel, bool) or not isinstance(numel, int):
        raise TypeError(f"numel={numel!r} has type {type(numel).__name__}: expected int")
    if numel < 1:
        raise ValueError(f"numel={numel!r} is invalid: expected an integer >= 1")


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in SPARSE_ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is invalid: expected one of {', '.join(SPARSE_ALGORITHMS)}")


def check_exact_k(exact_k: bool, counts: dict[str, int], k: int, field: str = "exact_k=True") -> None:
    """``exact_k`` is a bool and, when True, every rank's count (by rank name) is k.

    ``field`` names the caller's argument in the message (``exact_count=K`` for the allgather).
    """
    if not isinstance(exact_k, bool):
        raise TypeError(f"exact_k={exact_k!r} has type {type(exact_k).__name__}: expected bool")
    if exact_k:
        for name, n in counts.items():
            if n != k:
                raise ValueError(f"{field} is invalid here: {name} selected {n} entries, "
                                 f"expected exactly k={k}")


def _rank_world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("no initialised torch.distributed process group: call "
                         "torch.distributed.init_process_group(...) first (or use the simulator)")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"group={group!r} is invalid: this process is not a member of it")
    return rank, dist.get_world_size(group)


def _comm_device(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.device:
    """Device the backend can send from: the tensor's own for NCCL, CPU for gloo."""
    backend = dist.get_backend(group)
    if tensor.device.type == "cuda" and str(backend).lower() == "nccl":
        return tensor.device
    return torch.device("cpu")


def _global_rank(group: dist.ProcessGroup | None, group_rank: int) -> int:
    if group is None or group is dist.group.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)


def _wire(values: torch.Tensor, indices: torch.Tensor, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    return values.contiguous(), indices.to(index_dtype(numel)).contiguous()


def sparse_message_bytes(n: int, value_dtype: torch.dtype, idx_dtype: torch.dtype) -> int:
    """Bytes of one sparse message of n entries: header + n * (value + index size)."""
    return HEADER_BYTES + n * (value_dtype.itemsize + idx_dtype.itemsize)


# ---------------------------------------------------------------------------------------
# the gTop-k algorithm of one rank, transport-agnostic
Payload = tuple[torch.Tensor, torch.Tensor]
Request = tuple[str, int, "Payload | None"]


def gtopk_program(rank: int, world_size: int, values: torch.Tensor, indices: torch.Tensor,
                  numel: int, k: int, algorithm: str, header: bool = True
                  ) -> Generator[Request, Payload | None, CollectiveResult]:
    """gTop-k on one rank as a generator of communication requests.

    Yields ``("send", peer, (v, i))`` (resumed with None), ``("recv", peer, None)`` and
    ``("exchange", peer, (v, i))`` (both resumed with the peer's ``(v, i)``), following
    :func:`gtopk_lab.schedules.sparse_schedule`; returns the rank's CollectiveResult.
    Merges put the lower rank's operand first so all ranks add in the same order.
    ``header=False`` accounts messages without the 8-byte count header (every message
    holds exactly k pairs: ``gtopk_allreduce(..., exact_k=True)``).
    """
    values, indices = _wire(values, indices, numel)
    # one sort of the local selection by index: every message is then canonical and every
    # merge sees two ascending runs (merge_sparse's fast path); charged as merge CPU
    t0 = time.process_time()
    values, indices = sort_by_index(values, indices)
    merge_cpu_s = time.process_time() - t0
    steps: list[tuple[int, int]] = []
    messages = 0
    merged_elements = 0
    dropped: list[Payload] = []
    merged_any = False

    def msg_bytes(p: Payload) -> int:
        n_bytes = sparse_message_bytes(p[0].numel(), p[0].dtype, p[1].dtype)
        return n_bytes if header else n_bytes - HEADER_BYTES

    def n_msgs(p: Payload) -> int:
        return 2 if header and p[0].numel() > 0 else 1

    for step in sparse_schedule(algorithm, rank, world_size):
        mine = (values, indices)
        if step.op == "send":
            yield ("send", step.peer, mine)
            steps.append((msg_bytes(mine), 0))
            messages += n_msgs(mine)
            continue
        theirs = yield (step.op, step.peer, mine if step.op == "exchange" else None)
        assert theirs is not None
        if step.op == "exchange":
            steps.append((msg_bytes(mine), msg_bytes(theirs)))
            messages += n_msgs(mine)
        else:
            steps.append((0, msg_bytes(theirs)))
        if not step.merge:
            values, indices = theirs
            continue
        first, second = (mine, theirs) if rank < step.peer else (theirs, mine)
        t0 = time.process_time()
        values, indices, d_v, d_i = merge_sparse(first[0], first[1], second[0], second[1], k)
        merge_cpu_s += time.process_time() - t0
        merged_elements += first[0].numel() + second[0].numel()
        merged_any = True
        if step.charge_drops:
            dropped.append((d_v, d_i))
    if not merged_any and world_size == 1:
        # No merge happened: canonicalise (sort) and keep k, the single rank owns the drops.
        t0 = time.process_time()
        empty_v, empty_i = values.new_empty(0), indices.new_empty(0)
        merged_elements += values.numel()
        values, indices, d_v, d_i = merge_sparse(values, indices, empty_v, empty_i, k)
        merge_cpu_s += time.process_time() - t0
        dropped.append((d_v, d_i))
    # merge_sparse returns its drops canonical (ascending, unique indices): a single drop is
    # returned as is; several are left as parts, summed only if a reader asks (CommStats).
    drop_v, drop_i = dropped[0] if len(dropped) == 1 else (values.new_empty(0), indices.new_empty(0))
    stats = CommStats(
        collective="gtopk_allreduce", algorithm=algorithm,
        bytes_sent=sum(s for s, _ in steps), bytes_recv=sum(r for _, r in steps),
        messages=messages, rounds=len(steps), steps=steps, merge_cpu_s=merge_cpu_s,
        merged_elements=merged_elements, dropped_values=drop_v, dropped_indices=drop_i,
        library_estimate=False, dropped_parts=dropped if len(dropped) > 1 else None,
    )
    return CollectiveResult(values, indices, stats)


# ---------------------------------------------------------------------------------------
# torch.distributed transport for the sparse programs
def _pack(p: Payload) -> torch.Tensor:
    return torch.cat([p[0].contiguous().view(torch.uint8), p[1].contiguous().view(torch.uint8)])


def _unpack(buf: torch.Tensor, n: int, value_dtype: torch.dtype, idx_dtype: torch.dtype) -> Payload:
    """Split a received buffer into (values, indices) views: no copy, the buffer is this
    round's own. Indices that would start misaligned (int64 after an odd count of fp32
    values) are copied out instead."""
    vbytes = n * value_dtype.itemsize
    values = buf[:vbytes].view(value_dtype)
    idx_bytes = buf[vbytes:]
    if vbytes % idx_dtype.itemsize:
        idx_bytes = idx_bytes.clone()
    return values, idx_bytes.view(idx_dtype)


class _P2P:
    """Runs gtopk_program requests with torch.distributed isend/irecv on ``group``."""

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device,
                 value_dtype: torch.dtype, idx_dtype: torch.dtype, fixed_count: int | None = None) -> None:
        self.group, self.device = group, device
        self.value_dtype, self.idx_dtype = value_dtype, idx_dtype
        #: every message holds exactly this many pairs: no count header (one message a way)
        self.fixed_count = fixed_count
        self.pair_bytes = value_dtype.itemsize + idx_dtype.itemsize

    def _isend(self, t: torch.Tensor, peer: int) -> dist.Work:
        return dist.isend(t, dst=_global_rank(self.group, peer), group=self.group)

    def _irecv(self, t: torch.Tensor, peer: int) -> dist.Work:
        return dist.irecv(t, src=_global_rank(self.group, peer), group=self.group)

    def _run_fixed(self, op: str, peer: int, payload: Payload | None) -> Payload | None:
        """One round of fixed-size messages: payload only, posted both ways at once."""
        n = self.fixed_count
        assert n is not None
        pacer = active_pacer()
        if pacer is not None:
            pacer.begin_round()
        works = []
        sent_bytes = 0
        if payload is not None:
            if payload[0].numel() != n:  # a broken promise would hang the peer: fail here
                raise ValueError(f"exact_k: this rank would send {payload[0].numel()} pairs, "
                                 f"expected exactly {n}")
            send_buf = _pack((payload[0].to(self.device), payload[1].to(self.device)))
            sent_bytes = send_buf.numel()
            works.append(self._isend(send_buf, peer))
        recv_buf = None
        if op in ("recv", "exchange"):
            recv_buf = torch.empty(n * self.pair_bytes, dtype=torch.uint8, device=self.device)
            works.append(self._irecv(recv_buf, peer))
        for w in works:
            w.wait()
        if pacer is not None:
            pacer.end_round(sent_bytes, recv_buf.numel() if recv_buf is not None else 0)
        if recv_buf is None:
            return None
        return _unpack(recv_buf, n, self.value_dtype, self.idx_dtype)

    def run(self, op: str, peer: int, payload: Payload | None) -> Payload | None:
        """One round: post the header(s), then the payload(s); paced when a pacer is active."""
        if self.fixed_count is not None:
            return self._run_fixed(op, peer, payload)
        pacer = active_pacer()
        if pacer is not None:
            pacer.begin_round()
        works = []
        send_buf = None
        sent_bytes = 0
        if payload is not None:
            sent_bytes = HEADER_BYTES + payload[0].numel() * self.pair_bytes
            payload = (payload[0].to(self.device), payload[1].to(self.device))
            header = torch.tensor([payload[0].numel()], dtype=torch.int64, device=self.device)
            works.append(self._isend(header, peer))
            send_buf = _pack(payload) if payload[0].numel() > 0 else None
        recv_header = None
        if op in ("recv", "exchange"):
            recv_header = torch.empty(1, dtype=torch.int64, device=self.device)
            works.append(self._irecv(recv_header, peer))
        for w in works:
            w.wait()
        works = []
        if send_buf is not None:
            works.append(self._isend(send_buf, peer))
        recv_buf, n = None, 0
        if recv_header is not None:
            n = int(recv_header.item())
            if n > 0:
                recv_buf = torch.empty(n * self.pair_bytes, dtype=torch.uint8, device=self.device)
                works.append(self._irecv(recv_buf, peer))
        for w in works:
            w.wait()
        if pacer is not None:
            pacer.end_round(sent_bytes, HEADER_BYTES + n * self.pair_bytes if recv_header is not None else 0)
        if recv_header is None:
            return None
        if recv_buf is None:
            return (torch.empty(0, dtype=self.value_dtype, device=self.device),
                    torch.empty(0, dtype=self.idx_dtype, device=self.device))
        return _unpack(recv_buf, n, self.value_dtype, self.idx_dtype)


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
    _rank, world = _rank_world(group)
    device = _comm_device(tensor, group)
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
    t0 = time.process_time()
    if gathered:
        values, indices = coalesce_sparse(torch.cat([g[0] for g in gathered]),
                                          torch.cat([g[1] for g in gathered]))
    else:
        values = torch.empty(0, dtype=value_dtype)
        indices = torch.empty(0, dtype=idx_dtype)
    merge_cpu_s = time.process_time() - t0
    steps = allgather_steps(counts, value_dtype, idx_dtype, world_size, counted)
    stats = CommStats(collective="topk_allgather", algorithm="ring",
                      bytes_sent=sum(s for s, _ in steps), bytes_recv=sum(r for _, r in steps),
                      messages=len(steps), rounds=len(steps), steps=steps, merge_cpu_s=merge_cpu_s,
                      merged_elements=sum(g[0].numel() for g in gathered), library_estimate=True)
    return CollectiveResult(values, indices, stats)


def topk_allgather(values: torch.Tensor, indices: torch.Tensor, numel: int,
                   group: dist.ProcessGroup | None = None,
                   exact_count: int | None = None) -> CollectiveResult:
    """Top-k S-SGD aggregation: every rank gathers every rank's sparse vector and sums them.

    Pattern: allgather of the entry counts (ranks may select different numbers, e.g.
    GaussianK), then allgather of the (value, index) pairs padded to the largest count.
    Exact (nothing dropped): the result is the sparse sum of all selections, canonical.
    Cost (ring): 2(P-1) alpha + (P-1) * n_max * 8 beta per rank, growing linearly with P.

    ``exact_count=k`` (every rank selected exactly k entries, e.g. the ``topk`` selector;
    all ranks pass the same value): the count allgather is skipped, one allgather of the
    pairs remains: (P-1) alpha + (P-1) k 8 beta. A rank whose selection is not k entries
    raises ``ValueError`` before sending anything.
    """
    _check_numel(numel)
    check_sparse(values, indices, numel, name="topk_allgather(values, indices)")
    if exact_count is not None:
        _check_k(exact_count, numel)
        check_exact_k(True, {"this rank": values.numel()}, exact_count, f"exact_count={exact_count}")
    rank, world = _rank_world(group)
    out_device = values.device
    values, indices = _wire(values, indices, numel)
    vdt, idt = values.dtype, indices.dtype
    counted = exact_count is None
    if world == 1:
        result = allgather_assemble([values.numel()], [(values, indices)], vdt, idt, 1, counted)
        return result
    device = _comm_device(values, group)
    t0 = time.perf_counter()
    if counted:
        count = torch.tensor([values.numel()], dtype=torch.int64, device=device)
        counts_t = [torch.empty(1, dtype=torch.int64, device=device) for _ in range(world)]
        dist.all_gather(counts_t, count, group=group)
        counts = [int(c.item()) for c in counts_t]
    else:
        counts = [values.numel()] * world
    n_max = max(counts)
    gathered: list[Payload] = []
    if n_max > 0:
        pair = sparse_message_bytes(1, vdt, idt) - HEADER_BYTES
        buf = torch.zeros(n_max * pair, dtype=torch.uint8, device=device)
        mine = _pack((values.to(device), indices.to(device)))
        buf[: mine.numel()] = mine
        bufs = [torch.empty_like(buf) for _ in range(world)]
        dist.all_gather(bufs, buf, group=group)
        gathered = [_unpack(b[: c * pair], c, vdt, idt) for b, c in zip(bufs, counts)]
    pacer = active_pacer()
    if pacer is not None:  # the wire time comes before the local assembly that needs it
        pacer.pace_steps(t0, allgather_steps(counts, vdt, idt, world, counted))
    result = allgather_assemble(counts, gathered, vdt, idt, world, counted)
    return CollectiveResult(result.values.to(out_device), result.indices.to(out_device), result.stats)


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
    """
    _check_numel(numel)
    _check_k(k, numel)
    _check_algorithm(algorithm)
    check_sparse(values, indices, numel, name="gtopk_allreduce(values, indices)")
    rank, world = _rank_world(group)
    out_device = values.device
    device = _comm_device(values, group) if world > 1 else values.device
    values, indices = _wire(values.to(device), indices.to(device), numel)
    check_exact_k(exact_k, {"this rank": values.numel()}, k)
    transport = _P2P(group, device, values.dtype, indices.dtype, fixed_count=k if exact_k else None)
    gen = gtopk_program(rank, world, values, indices, numel, k, algorithm, header=not exact_k)
    try:
        request = next(gen)
        while True:
            request = gen.send(transport.run(*request))
    except StopIteration as stop:
        result: CollectiveResult = stop.value
    st = result.stats
    st.drops_to(out_device)
    return CollectiveResult(result.values.to(out_device), result.indices.to(out_device), st)


def __getattr__(name: str):  # lazy re-export: gtopk_lab.oktopk imports this module
    if name in ("oktopk_allreduce", "OkTopkState"):
        from gtopk_lab import oktopk

        return getattr(oktopk, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
