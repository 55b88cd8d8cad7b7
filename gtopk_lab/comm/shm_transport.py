"""The shared-memory transport: one rank's messages to ranks on the same host, through rings.

:class:`ShmTransport` carries the rounds of a per-rank program (:func:`gtopk_lab.comm.
transport.drive`) over this rank's :class:`~gtopk_lab.comm.shm_links.ShmLinks`, in the same
wire format as :class:`~gtopk_lab.comm.dist_transport.DistTransport` (the same bytes, so the
same results, bitwise), with the same pacing and profiling (:mod:`gtopk_lab.comm.round_hooks`):

1. ``post(dst, payload)``: the payload's pieces (``wire.encode_parts``: the header and views
   of its tensors, whose concatenation is ``wire.encode``'s buffer) are copied straight into
   ``dst``'s ring when it has room for the whole message; else they are queued and as much
   as fits is copied in at once; the rest moves whenever this rank
   waits (it never waits for its own send before its receive: a ring whose ranks all send
   right, then receive left, cannot deadlock, whatever the message size);
2. ``receive(src)``: the next message from ``src``'s ring (its length first, then its
   bytes), streamed when it is larger than the ring; the wire header must agree with the
   length, then ``wire.decode`` gives the payload;
3. ``finish()``: every queued send is in its ring.

No receive is posted ahead (a message waits in its ring until taken), so :meth:`plan` is the
base class's no-op. Cost per message of n bytes: two copies of n bytes and, when the peer
sleeps, one futex wake; at 1M elements and k = 1000 (8 kB messages) that is microseconds
where gloo's TCP loopback takes 0.4-0.5 ms (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import torch

from gtopk_lab.comm.profiling import RoundProfile
from gtopk_lab.comm.round_hooks import RoundHooks
from gtopk_lab.comm.shm_links import ShmLinks
from gtopk_lab.comm.transport import Transport
from gtopk_lab.comm.wire import WireFormat

__all__ = ["ShmTransport"]

_CPU = torch.device("cpu")


class ShmTransport(RoundHooks, Transport):
    """Shared-memory endpoint of one rank for one call (see the module docstring)."""

    def __init__(self, links: ShmLinks, wire: WireFormat, *, profile: RoundProfile | None = None) -> None:
        self.links = links
        self._init_rounds(wire, profile)

    def post(self, dst: int, payload: object) -> None:
        self.links.send(dst, self._pack_parts(payload, _CPU))

    def receive(self, src: int) -> object:
        self._start_receive()
        buf = self.links.receive(src)
        wire, n = self.wire, buf.numel()
        if wire.fixed_bytes is not None:
            if n != wire.fixed_bytes:
                raise RuntimeError(f"a message from rank {src} has {n} bytes: expected {wire.fixed_bytes}")
            payload = buf
        else:
            head = wire.head_bytes(buf)
            if head is None or head[1] != n:
                raise RuntimeError(f"a message from rank {src} has {n} bytes, which its header does not say")
            payload = buf[head[0]:]
        self._recv += n
        self._close()
        return self._unpack(buf, payload)

    def finish(self) -> None:
        self.links.flush()
