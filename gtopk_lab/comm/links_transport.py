"""The transport over this project's own links: shared-memory rings on one host, TCP sockets between hosts.

:class:`LinksTransport` carries the rounds of a per-rank program (:func:`gtopk_lab.comm.
transport.drive`) over this rank's links of the group, either
:class:`~gtopk_lab.comm.shm_links.ShmLinks` (all ranks on one host: a ring per directed pair)
or :class:`~gtopk_lab.comm.tcp_links.TcpLinks` (a socket per peer), in the same wire format as
:class:`~gtopk_lab.comm.dist_transport.DistTransport` (the same bytes, so the same results,
bitwise), with the same pacing and profiling (:mod:`gtopk_lab.comm.round_hooks`). Both links
send a message as its length then its bytes, never wait for a send before a receive, and
raise a one-line ``RuntimeError`` for a lost peer or the group's timeout:

1. ``post(dst, payload)``: the payload's pieces (``wire.encode_parts``: the header and views
   of its tensors, whose concatenation is ``wire.encode``'s buffer; for gTop-k's CPU
   payloads the same bytes as numpy views, without a tensor dispatch) go to ``dst`` at once
   where the ring or the socket takes the whole message, else the rest is queued (copied)
   and moves whenever this rank waits (a ring of ranks that all send right, then receive
   left, cannot deadlock, whatever the message size);
2. ``receive(src)``: the next message from ``src`` (its length first, then its bytes); the
   wire header must agree with the length, then ``wire.decode`` gives the payload (an
   exact-k gTop-k message is cut into its values and indices in numpy: the same bytes,
   aligned views of the received array);
3. ``finish()``: every queued send has left (ring or kernel).

No receive is posted ahead (a message waits in its ring or socket until taken), so
:meth:`plan` is the base class's no-op. Cost per message of n bytes: two copies of n bytes
and, when the peer sleeps, one wake-up (a futex, or the socket's poll); at 1M elements and
k = 1000 (8 kB messages) that is microseconds where gloo's TCP loopback takes 0.4-0.5 ms
(benchmarks/RESULTS.md).
"""

from __future__ import annotations

import numpy as np
import torch

from gtopk_lab.comm.profiling import RoundProfile
from gtopk_lab.comm.round_hooks import RoundHooks
from gtopk_lab.comm.shm_links import ShmLinks
from gtopk_lab.comm.tcp_links import TcpLinks
from gtopk_lab.comm.transport import Transport
from gtopk_lab.comm.wire import PartsWire, WireFormat

__all__ = ["LinksTransport"]

_CPU = torch.device("cpu")
_NP_DTYPES: dict[torch.dtype, np.dtype] = {}


def _np_dtype(dtype: torch.dtype) -> np.dtype:
    if dtype not in _NP_DTYPES:
        _NP_DTYPES[dtype] = torch.empty(0, dtype=dtype).numpy().dtype
    return _NP_DTYPES[dtype]


def _split(arr: np.ndarray, wire: PartsWire) -> object:
    """A received uint8 array (this rank's own) as ``wire``'s payload: each part a tensor
    viewing its bytes where they are aligned for its dtype, else a copy of them (as
    ``PartsWire.decode``)."""
    n = arr.size // wire.element_bytes if wire.element_bytes else 0
    out, at = [], 0
    for dtype in wire.dtypes:
        size = n * dtype.itemsize
        piece = arr[at:at + size]
        if at % dtype.itemsize:
            piece = piece.copy()
        out.append(torch.from_numpy(piece.view(_np_dtype(dtype))))
        at += size
    return out[0] if len(out) == 1 else tuple(out)


class LinksTransport(RoundHooks, Transport):
    """One rank's endpoint on its shared-memory or TCP links for one call (module docstring)."""

    def __init__(self, links: ShmLinks | TcpLinks, wire: WireFormat, *, profile: RoundProfile | None = None) -> None:
        self.links = links
        self._init_rounds(wire, profile)

    def post(self, dst: int, payload: object) -> None:
        arrays = self._fast_parts(payload) if self.profile is None else None
        if arrays is None:
            self.links.send(dst, self._pack_parts(payload, _CPU))
            return
        self._begin()
        self._sent += sum(a.size for a in arrays)
        self.links.send_arrays(dst, arrays)

    def _fast_parts(self, payload: object) -> list[np.ndarray] | None:
        """Step 1's pieces straight from numpy, for a :class:`PartsWire` payload of CPU,
        contiguous tensors of the wire's dtypes: the bytes ``encode_parts`` gives, without
        its three tensor dispatches a part. None: anything else (the general path)."""
        wire = self.wire
        if not isinstance(wire, PartsWire):
            return None
        parts = wire._parts(payload)
        if len(parts) != len(wire.dtypes):
            return None
        arrays = []
        for t, dtype in zip(parts, wire.dtypes):
            if (not isinstance(t, torch.Tensor) or t.dtype != dtype or t.device.type != "cpu"
                    or t.requires_grad or t.dim() != 1 or not t.is_contiguous()):
                return None
            arrays.append(t.numpy().view(np.uint8))
        if wire.header:
            arrays.insert(0, np.array([arrays[0].size // wire.dtypes[0].itemsize], dtype=np.int64).view(np.uint8))
        return arrays

    def receive(self, src: int) -> object:
        self._start_receive()
        wire = self.wire
        if self.profile is None and isinstance(wire, PartsWire) and wire.fixed_bytes is not None:
            # exact-k gTop-k: the message is the payload, cut into its parts in numpy (the
            # same bytes as ``decode``'s views, without a torch slice and view a part)
            arr = self.links.receive_array(src)
            if arr.size != wire.fixed_bytes:
                raise RuntimeError(f"a message from rank {src} has {arr.size} bytes: expected {wire.fixed_bytes}")
            self._recv += arr.size
            self._close()
            return _split(arr, wire)
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
