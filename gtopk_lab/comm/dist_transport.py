"""The torch.distributed transport: one rank's messages over gloo (CPU) or NCCL (GPU).

:class:`DistTransport` carries the rounds of a per-rank program (:func:`gtopk_lab.comm.
transport.drive`) as point-to-point ``isend``/``irecv`` of one buffer per message, in the
program's wire format (:mod:`gtopk_lab.comm.wire`):

1. **Known size** (``wire.fixed_bytes``: gTop-k's exact-k messages): one receive of exactly
   that size.
2. **Unknown size, gloo**: gloo accepts a receive buffer larger than its message, so a
   receive is posted with ``wire.capacity_bytes`` (1 MiB, or 2k pairs for gTop-k) and the
   message's own header says how much of it arrived: one message, one latency. A message
   larger than that capacity goes as its header alone, then its payload (two messages; at
   that size the second latency is a small part of the transfer).
3. **Unknown size, NCCL** (a receive must know its size): an int64 length, then the buffer.

Sends complete only at :meth:`~DistTransport.finish`, so no rank waits for its own send
before its receive. :meth:`~DistTransport.plan` posts receives one round ahead when the
schedule is known (gTop-k with exact-k): the first before the caller's local work, each next one as soon
as the round before it is done, one outstanding at a time, in program order; the peer's
message then finds its buffer waiting (on 2 loaded cores, posting both calls at once waited
~1 ms for gloo's I/O thread). Each round is paced by an active
:class:`~gtopk_lab.network.pacing.LinkPacer` and timed by an active
:class:`~gtopk_lab.comm.profiling.RoundProfile` (pack, sendrecv, unpack).
"""

from __future__ import annotations

from collections import deque
from datetime import timedelta

import torch
import torch.distributed as dist

from gtopk_lab.comm.profiling import RoundProfile
from gtopk_lab.comm.round_hooks import RoundHooks
from gtopk_lab.comm.transport import Transport
from gtopk_lab.comm.wire import WireFormat

__all__ = ["DistTransport", "rank_world", "comm_device", "global_rank", "group_timeout_s"]


def rank_world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """This process's rank in ``group`` (None: the default group) and the group's size."""
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


def group_timeout_s(group: dist.ProcessGroup | None) -> float:
    """Seconds of ``group``'s collective timeout (None: the default group); the library's
    default where the backend does not say (a private API, read defensively)."""
    try:
        pg = group if group is not None else dist.group.WORLD
        timeout = pg._get_backend(torch.device("cpu")).options._timeout  # type: ignore[union-attr]
        if isinstance(timeout, timedelta):
            return timeout.total_seconds()
    except Exception:  # noqa: BLE001 - private API: the library's default instead
        pass
    return dist.default_pg_timeout.total_seconds()


_CPU_DEVICE = torch.device("cpu")


def comm_device(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.device:
    """Device the backend can send from: the tensor's own for NCCL, CPU for gloo."""
    if tensor.device.type == "cpu":  # every backend sends a CPU tensor from the CPU: no lookup
        return _CPU_DEVICE
    backend = dist.get_backend(group)
    if tensor.device.type == "cuda" and str(backend).lower() == "nccl":
        return tensor.device
    return torch.device("cpu")


def global_rank(group: dist.ProcessGroup | None, group_rank: int) -> int:
    if group is None or group is dist.group.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)


class DistTransport(RoundHooks, Transport):
    """torch.distributed endpoint of one rank for one call (see the module docstring).

    ``eager``: receives of unknown size go into a buffer of ``wire.capacity_bytes`` (default:
    True except on NCCL). ``profile``: the active RoundProfile, or None (nothing timed).
    """

    posts_ahead = True

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device, wire: WireFormat, *,
                 profile: RoundProfile | None = None, eager: bool | None = None) -> None:
        self.group, self.device = group, device
        self._init_rounds(wire, profile)
        self._eager = eager
        self._sends: list[tuple[dist.Work, torch.Tensor]] = []
        self._planned: deque[int] = deque()
        self._preposted: tuple[int, torch.Tensor, dist.Work] | None = None

    @property
    def eager(self) -> bool:
        """Receives of unknown size go into a capacity buffer (gloo); asked only when a size
        is unknown, so the exact-k path never looks the backend up."""
        if self._eager is None:
            self._eager = str(dist.get_backend(self.group)).lower() != "nccl"
        return self._eager

    # ------------------------------------------------------------------ receives posted ahead
    def plan(self, receive_peers: list[int]) -> None:
        """Post the receives from ``receive_peers`` (this rank's rounds, in order) one round
        ahead, the first now. Only where a receive's size is known in advance (fixed, or
        eager capacity)."""
        if self.wire.fixed_bytes is None and not self.eager:
            return
        assert self._preposted is None and not self._planned
        self._planned.extend(receive_peers)
        self._post_next()

    def _post_next(self) -> None:
        if self._planned and self._preposted is None:
            peer = self._planned.popleft()
            buf, work = self._post_receive(peer)
            self._preposted = (peer, buf, work)

    def _take_preposted(self, peer: int) -> tuple[torch.Tensor, dist.Work] | None:
        if self._preposted is None:
            return None
        posted_peer, buf, work = self._preposted
        if posted_peer != peer:  # the program's rounds are not the planned schedule
            raise RuntimeError(f"a receive from rank {posted_peer} was posted ahead, "
                               f"but this round is with rank {peer}")
        self._preposted = None
        return buf, work

    # ------------------------------------------------------------------ point-to-point
    def _isend(self, buf: torch.Tensor, peer: int) -> None:
        work = dist.isend(buf, dst=global_rank(self.group, peer), group=self.group)
        self._sends.append((work, buf))  # the buffer must live until the send completes

    def _irecv(self, nbytes: int, peer: int) -> tuple[torch.Tensor, dist.Work]:
        buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return buf, dist.irecv(buf, src=global_rank(self.group, peer), group=self.group)

    def _post_receive(self, peer: int) -> tuple[torch.Tensor, dist.Work]:
        fixed = self.wire.fixed_bytes
        return self._irecv(fixed if fixed is not None else self.wire.capacity_bytes, peer)

    def post(self, dst: int, payload: object) -> None:
        buf = self._pack(payload, self.device)
        n = buf.numel()
        wire = self.wire
        if wire.fixed_bytes is not None or (self.eager and n <= wire.capacity_bytes):
            self._isend(buf, dst)
        elif self.eager:  # larger than the buffer the peer posted: the header alone, then the rest
            head = wire.head_bytes(buf)
            assert head is not None
            self._isend(buf[:head[0]], dst)
            self._isend(buf[head[0]:], dst)
        else:  # every receive must know its size: the length first
            self._isend(torch.tensor([n], dtype=torch.int64, device=self.device).view(torch.uint8), dst)
            self._isend(buf, dst)

    def receive(self, src: int) -> object:
        self._start_receive()
        wire = self.wire
        if wire.fixed_bytes is not None or self.eager:
            buf, work = self._take_preposted(src) or self._post_receive(src)
            work.wait()
        else:
            size, work = self._irecv(8, src)
            work.wait()
            buf, work = self._irecv(int(size.view(torch.int64).item()), src)
            work.wait()
        if wire.fixed_bytes is not None:
            payload = buf
            total = buf.numel()
        else:
            head = wire.head_bytes(buf)
            if head is None:
                raise RuntimeError(f"a message from rank {src} is shorter than its header")
            head_bytes, total = head
            if total > buf.numel():  # it came as its header alone: the payload follows
                payload, work = self._irecv(total - head_bytes, src)
                work.wait()
            else:
                payload = buf[head_bytes:total]
        self._recv += total
        self._post_next()  # before this round's merge, so the peer's next message finds a buffer
        self._close()
        return self._unpack(buf, payload)

    def finish(self) -> None:
        for work, _buf in self._sends:
            work.wait()
        self._sends.clear()
        if self._preposted is not None or self._planned:  # one left over would take a later message
            raise RuntimeError("the program ended with receives planned ahead and not used")
