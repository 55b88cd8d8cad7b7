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
from :mod:`gtopk_lab.comm.schedules` and does all merging with
:func:`gtopk_lab.compression.merge.merge_sparse`. Here a driver carries the requests out with
torch.distributed point-to-point calls; :mod:`gtopk_lab.comm.inprocess` carries the same
requests out between virtual ranks in one process. Byte counts come from the generator, so
real and simulated CommStats agree by construction.

Wire format of one sparse message: an 8-byte int64 header holding the entry count n, then
(if n > 0) one uint8 payload of n values followed by n indices (fp32 + int32 = 8 bytes per
entry below 2**31 elements). ``bytes_sent`` counts header and payload; ``messages`` counts
both messages.
"""


from __future__ import annotations

import time

import torch
import torch.distributed as dist

from gtopk_lab.comm.profiling import RoundProfile, active_profile
from gtopk_lab.comm.programs import allgather_assemble, allgather_steps, dense_stats, drive, gtopk_program
from gtopk_lab.comm.stats import (
    HEADER_BYTES, CollectiveResult, Payload, check_algorithm, check_exact_k, check_k, check_numel,
    sparse_message_bytes, wire,
)
from gtopk_lab.comm.schedules import Step, sparse_schedule
from gtopk_lab.compression.merge import check_sparse, index_dtype
from gtopk_lab.network.pacing import active_pacer

__all__ = ["dense_allreduce", "topk_allgather", "gtopk_allreduce", "rank_world", "comm_device", "global_rank"]


def rank_world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group={group!r} has type {type(group).__name__}: expected a "
                        "torch.distributed ProcessGroup or None (the default group)")
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("no initialised torch.distributed process group: call "
                         "torch.distributed.init_process_group(...) first (or use the simulator)")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"group={group!r} is invalid: this process is not a member of it")
    return rank, dist.get_world_size(group)


def comm_device(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.device:
    """Device the backend can send from: the tensor's own for NCCL, CPU for gloo."""
    backend = dist.get_backend(group)
    if tensor.device.type == "cuda" and str(backend).lower() == "nccl":
        return tensor.device
    return torch.device("cpu")


def global_rank(group: dist.ProcessGroup | None, group_rank: int) -> int:
    if group is None or group is dist.group.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)


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
                 value_dtype: torch.dtype, idx_dtype: torch.dtype, fixed_count: int | None = None,
                 profile: RoundProfile | None = None) -> None:
        self.group, self.device = group, device
        self.value_dtype, self.idx_dtype = value_dtype, idx_dtype
        #: every message holds exactly this many pairs: no count header (one message a way)
        self.fixed_count = fixed_count
        self.pair_bytes = value_dtype.itemsize + idx_dtype.itemsize
        #: records pack / sendrecv / unpack per round when set (gtopk_lab.comm.profiling);
        #: None (the default) times nothing
        self.profile = profile
        #: (peer, buffer, work) of the next receive, posted ahead of its round (:meth:`plan`)
        self._preposted: tuple[int, torch.Tensor, dist.Work] | None = None
        self._receives: list[int] = []

    def plan(self, steps: list[Step]) -> None:
        """Post each fixed-size receive of ``steps`` (a sparse schedule) one round ahead:
        the first now, before the local sort, and each next one as soon as the round before
        it is done, before that round's merge. The peer's message then finds a buffer
        waiting instead of the two ranks' sends and receives meeting at once (on 2 loaded
        cores posting either call then waited ~1 ms for gloo's I/O thread). Only one
        receive is outstanding and they are posted in program order, so each gets the
        message its round expects (messages between two ranks are matched in order)."""
        assert self.fixed_count is not None and self._preposted is None
        self._receives = [step.peer for step in steps if step.op in ("recv", "exchange")]
        self._post_next()

    def _post_next(self) -> None:
        if self._receives and self._preposted is None:
            peer = self._receives.pop(0)
            buf = torch.empty(self.fixed_count * self.pair_bytes, dtype=torch.uint8, device=self.device)
            self._preposted = (peer, buf, self._irecv(buf, peer))

    def check_drained(self) -> None:
        """After the program: every planned receive was used (one left over would take the
        next call's message)."""
        if self._preposted is not None or self._receives:
            raise RuntimeError("gtopk_allreduce: the program ended with planned receives unused")

    def _take_preposted(self, peer: int) -> tuple[torch.Tensor, dist.Work] | None:
        if self._preposted is None:
            return None
        posted_peer, buf, work = self._preposted
        if posted_peer != peer:  # the program's rounds are not the planned schedule
            raise RuntimeError(f"a receive from rank {posted_peer} was posted ahead, "
                               f"but this round is with rank {peer}")
        self._preposted = None
        return buf, work

    def _isend(self, t: torch.Tensor, peer: int) -> dist.Work:
        return dist.isend(t, dst=global_rank(self.group, peer), group=self.group)

    def _irecv(self, t: torch.Tensor, peer: int) -> dist.Work:
        return dist.irecv(t, src=global_rank(self.group, peer), group=self.group)

    def _run_fixed(self, op: str, peer: int, payload: Payload | None) -> Payload | None:
        """One round of fixed-size messages: payload only, posted both ways at once."""
        n = self.fixed_count
        assert n is not None
        prof = self.profile
        pacer = active_pacer()
        if pacer is not None:
            pacer.begin_round()
        works = []
        sent_bytes = 0
        send_buf = None
        if payload is not None:
            if payload[0].numel() != n:  # a broken promise would hang the peer: fail here
                raise ValueError(f"exact_k: this rank would send {payload[0].numel()} pairs, "
                                 f"expected exactly {n}")
            stamp = prof.stamp() if prof is not None else None
            send_buf = _pack((payload[0].to(self.device), payload[1].to(self.device)))
            sent_bytes = send_buf.numel()
            if prof is not None:
                prof.stop("pack", stamp)
        stamp = prof.stamp() if prof is not None else None
        recv_buf = None
        preposted = self._take_preposted(peer) if op in ("recv", "exchange") else None
        if preposted is not None:
            recv_buf, work = preposted
            works.append(work)
        if send_buf is not None:
            works.append(self._isend(send_buf, peer))
        if op in ("recv", "exchange") and preposted is None:
            recv_buf = torch.empty(n * self.pair_bytes, dtype=torch.uint8, device=self.device)
            works.append(self._irecv(recv_buf, peer))
        for w in works:
            w.wait()
        if preposted is not None:
            self._post_next()
        if pacer is not None:
            pacer.end_round(sent_bytes, recv_buf.numel() if recv_buf is not None else 0)
        if prof is not None:
            prof.stop("sendrecv", stamp)
        if recv_buf is None:
            return None
        stamp = prof.stamp() if prof is not None else None
        received = _unpack(recv_buf, n, self.value_dtype, self.idx_dtype)
        if prof is not None:
            prof.stop("unpack", stamp)
        return received

    def run(self, op: str, peer: int, payload: Payload | None) -> Payload | None:
        """One round: post the header(s), then the payload(s); paced when a pacer is active."""
        if self.fixed_count is not None:
            return self._run_fixed(op, peer, payload)
        prof = self.profile
        pacer = active_pacer()
        if pacer is not None:
            pacer.begin_round()
        works = []
        send_buf = None
        sent_bytes = 0
        if payload is not None:
            stamp = prof.stamp() if prof is not None else None
            sent_bytes = HEADER_BYTES + payload[0].numel() * self.pair_bytes
            payload = (payload[0].to(self.device), payload[1].to(self.device))
            header = torch.tensor([payload[0].numel()], dtype=torch.int64, device=self.device)
            works.append(self._isend(header, peer))  # in flight while the payload is packed
            send_buf = _pack(payload) if payload[0].numel() > 0 else None
            if prof is not None:  # "pack" includes posting the header (microseconds)
                prof.stop("pack", stamp)
        stamp = prof.stamp() if prof is not None else None
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
        if prof is not None:
            prof.stop("sendrecv", stamp)
        if recv_header is None:
            return None
        if recv_buf is None:
            return (torch.empty(0, dtype=self.value_dtype, device=self.device),
                    torch.empty(0, dtype=self.idx_dtype, device=self.device))
        stamp = prof.stamp() if prof is not None else None
        received = _unpack(recv_buf, n, self.value_dtype, self.idx_dtype)
        if prof is not None:
            prof.stop("unpack", stamp)
        return received


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
    transport = _P2P(group, device, values.dtype, index_dtype(numel), fixed_count=k if exact_k else None,
                     profile=prof)
    check_exact_k(exact_k, {"this rank": values.numel()}, k)  # before anything is posted
    if exact_k and world > 1:
        transport.plan(sparse_schedule(algorithm, rank, world))
    if prof is not None:  # the program adds its own range check and sort to prep
        prof.stop("prep", stamp)
    gen = gtopk_program(rank, world, values.to(device), indices.to(device), numel, k, algorithm,
                        header=not exact_k, profile=prof, name=name)
    result: CollectiveResult = drive(gen, transport.run)
    transport.check_drained()
    stamp = prof.stamp() if prof is not None else None
    st = result.stats
    st.drops_to(out_device)
    out = CollectiveResult(result.values.to(out_device), result.indices.to(out_device), st)
    if prof is not None:
        prof.stop("finish", stamp)
    return out
