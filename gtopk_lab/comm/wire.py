"""The wire format: every message is one buffer, a header then the payload.

A message carries what its receiver does not know in a header in front of the payload, in
the same contiguous uint8 buffer (one send, one receive: a header sent on its own before
its payload costs a second dependent message, a latency on a latency-bound link). Two
formats:

- :class:`PartsWire` (``dtypes``, ``count``): one or more tensors of known dtypes and one
  shared length n, laid out one after the other. The header is the int64 count n
  (:data:`HEADER_BYTES` = 8 bytes) unless every message has the same known ``count``, then
  there is no header. gTop-k's sparse messages are ``PartsWire((float32, int32))``: n values
  then n indices, ``8 + 8 n`` bytes, or ``8 k`` when every message holds exactly k pairs
  (exact-k); Ok-Topk's are ``PartsWire((uint8,))`` (:data:`BYTES`): the length, then the bytes.
- :class:`TensorWire`: a tensor or a tuple of tensors of any dtypes, flattened (users' tensor
  programs). Per tensor a 16-byte header (:data:`TENSOR_HEADER_BYTES`: int64 element count,
  int64 code = dtype index + 256 when another tensor follows); all headers first, then the
  tensors' bytes in order: ``sum_j (16 + bytes_j)``.

``nbytes(payload)`` is what the recorder counts (``CommStats.steps``) and what a real
transport sends, so recorded and real bytes agree by construction. ``encode`` builds the
one buffer; ``head_bytes`` reads from a buffer's start how long its header and the whole
message are (``None`` when that needs more bytes); ``decode`` gives the payload back (views
into the buffer where alignment allows). ``capacity_bytes`` is how large a receive buffer
posted before the size is known should be (:mod:`gtopk_lab.comm.dist_transport`).
"""

from __future__ import annotations

import functools

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["HEADER_BYTES", "TENSOR_HEADER_BYTES", "EAGER_BYTES", "WireFormat", "PartsWire", "TensorWire",
           "BYTES", "TENSORS", "sparse_message_bytes", "sparse_wire"]

#: Bytes of the int64 count header before a message of :class:`PartsWire` (sparse pairs, bytes).
HEADER_BYTES = 8
#: Bytes of the (count, dtype code) header before each tensor of a :class:`TensorWire` message.
TENSOR_HEADER_BYTES = 16
#: Default size of a receive buffer posted before its message's size is known: messages up to
#: this size arrive in one piece (see :mod:`gtopk_lab.comm.dist_transport`).
EAGER_BYTES = 1 << 20
#: dtypes a TensorWire message may carry (their index is the header's dtype code)
_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                    torch.int32, torch.int64, torch.uint8, torch.int8, torch.bool,
                                    torch.int16)
_MORE = 256
#: at most this many tensors in one TensorWire message (their headers must fit any receive buffer)
MAX_PARTS = 256


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _view(buf: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``buf`` (uint8) as ``dtype``: a view where its offset is aligned, else a copy."""
    if dtype == torch.uint8:
        return buf
    if buf.storage_offset() % dtype.itemsize:
        buf = buf.clone()
    return buf.view(dtype)


class WireFormat:
    """How one message of a program's payloads is laid out in one buffer (see the module doc)."""

    #: bytes of every message when the receiver knows them in advance (no header), else None
    fixed_bytes: int | None = None
    #: bytes of a receive buffer posted before the message's size is known
    capacity_bytes: int = EAGER_BYTES

    def nbytes(self, payload: Any) -> int:
        """Bytes of the message of ``payload`` on the wire (header included); validates it."""
        raise NotImplementedError

    def encode(self, payload: Any, device: torch.device) -> torch.Tensor:
        """The message of ``payload`` as one uint8 buffer on ``device``."""
        raise NotImplementedError

    def encode_parts(self, payload: Any, device: torch.device) -> list[torch.Tensor]:
        """The message of ``payload`` as uint8 pieces whose concatenation is ``encode``'s
        buffer (a transport that copies them into place, the shared-memory rings, skips the
        concatenation's allocation and copy). By default the one buffer."""
        return [self.encode(payload, device)]

    def head_bytes(self, buf: torch.Tensor) -> tuple[int, int] | None:
        """``(header bytes, message bytes)`` read from the start of ``buf``; None when ``buf``
        is too short to tell."""
        raise NotImplementedError

    def decode(self, head: torch.Tensor, payload: torch.Tensor) -> Any:
        """The payload of a message: ``head`` starts with its header, ``payload`` holds
        exactly its payload bytes (a slice of the same buffer, or a second one)."""
        raise NotImplementedError


class PartsWire(WireFormat):
    """Tensors of known ``dtypes`` and one shared length, behind an int64 count header unless
    every message holds exactly ``count`` elements per part (then no header at all).

    A payload is a tuple of ``len(dtypes)`` 1-D tensors of equal length (a single tensor when
    there is one part). ``capacity`` (elements per part) sizes receive buffers posted before
    the size is known (gTop-k: 2k pairs; a merge never sends more than k)."""

    def __init__(self, dtypes: Sequence[torch.dtype], count: int | None = None,
                 capacity: int | None = None) -> None:
        self.dtypes = tuple(dtypes)
        self.count = count
        self.element_bytes = sum(d.itemsize for d in self.dtypes)
        self.header = 0 if count is not None else HEADER_BYTES
        self.fixed_bytes = None if count is None else count * self.element_bytes
        if capacity is not None:
            self.capacity_bytes = max(EAGER_BYTES, HEADER_BYTES + capacity * self.element_bytes)

    def _parts(self, payload: Any) -> tuple[torch.Tensor, ...]:
        return (payload,) if len(self.dtypes) == 1 and isinstance(payload, torch.Tensor) else tuple(payload)

    def nbytes(self, payload: Any) -> int:
        first = payload if isinstance(payload, torch.Tensor) else payload[0]
        n = first.numel()
        if first.dtype != self.dtypes[0]:  # a part of another dtype travels as its bytes
            n = n * first.element_size() // self.dtypes[0].itemsize
        if self.count is not None and n != self.count:  # a broken promise would hang the peer
            raise ValueError(f"exact_k: this rank would send {n} pairs, expected exactly {self.count}")
        return self.header + n * self.element_bytes

    def encode(self, payload: Any, device: torch.device) -> torch.Tensor:
        parts = self.encode_parts(payload, device)
        return torch.cat(parts) if len(parts) > 1 else parts[0].clone()

    def encode_parts(self, payload: Any, device: torch.device) -> list[torch.Tensor]:
        """The header (if any), then each part's bytes: views of the payload, not copies."""
        parts = [p.to(device).contiguous().view(torch.uint8) for p in self._parts(payload)]
        if self.header:
            n = parts[0].numel() // self.dtypes[0].itemsize
            parts.insert(0, torch.tensor([n], dtype=torch.int64, device=device).view(torch.uint8))
        return parts

    def head_bytes(self, buf: torch.Tensor) -> tuple[int, int] | None:
        if not self.header:
            return 0, self.fixed_bytes or 0
        if buf.numel() < HEADER_BYTES:
            return None
        n = int(buf[:HEADER_BYTES].view(torch.int64).item())
        return HEADER_BYTES, HEADER_BYTES + n * self.element_bytes

    def decode(self, head: torch.Tensor, payload: torch.Tensor) -> Any:
        n = payload.numel() // self.element_bytes if self.element_bytes else 0
        out, at = [], 0
        for dtype in self.dtypes:
            size = n * dtype.itemsize
            out.append(_view(payload[at:at + size], dtype))
            at += size
        return out[0] if len(out) == 1 else tuple(out)


class TensorWire(WireFormat):
    """A tensor or a tuple of tensors of any dtypes (flattened), each behind a 16-byte header."""

    def _parts(self, payload: Any) -> tuple[torch.Tensor, ...]:
        if isinstance(payload, torch.Tensor):
            return (payload,)
        if isinstance(payload, (tuple, list)) and payload and all(isinstance(t, torch.Tensor) for t in payload):
            if len(payload) > MAX_PARTS:
                raise ValueError(f"a message of {len(payload)} tensors is invalid: expected at most {MAX_PARTS}")
            return tuple(payload)
        raise TypeError(f"a message carries {type(payload).__name__}: expected a torch.Tensor or a tuple of them")

    def nbytes(self, payload: Any) -> int:
        parts = self._parts(payload)
        for t in parts:
            if t.dtype not in _DTYPES:
                raise TypeError(f"a message tensor has dtype {t.dtype}: expected one of "
                                f"{', '.join(str(d) for d in _DTYPES)}")
        return sum(TENSOR_HEADER_BYTES + t.numel() * t.element_size() for t in parts)

    def encode(self, payload: Any, device: torch.device) -> torch.Tensor:
        parts = self._parts(payload)
        header = torch.tensor([[t.numel(), _DTYPES.index(t.dtype) + _MORE * (j + 1 < len(parts))]
                               for j, t in enumerate(parts)], dtype=torch.int64, device=device)
        return torch.cat([header.reshape(-1).view(torch.uint8)] + [_as_bytes(t.detach().to(device)) for t in parts])

    def _headers(self, buf: torch.Tensor) -> list[tuple[int, int]] | None:
        out, at = [], 0
        while True:
            if buf.numel() < at + TENSOR_HEADER_BYTES:
                return None
            n, code = (int(x) for x in _view(buf[at:at + TENSOR_HEADER_BYTES], torch.int64).tolist())
            out.append((n, code % _MORE))
            at += TENSOR_HEADER_BYTES
            if code < _MORE:
                return out

    def head_bytes(self, buf: torch.Tensor) -> tuple[int, int] | None:
        headers = self._headers(buf)
        if headers is None:
            return None
        head = TENSOR_HEADER_BYTES * len(headers)
        return head, head + sum(n * _DTYPES[code].itemsize for n, code in headers)

    def decode(self, head: torch.Tensor, payload: torch.Tensor) -> Any:
        headers = self._headers(head)
        assert headers is not None
        out, at = [], 0
        for n, code in headers:
            dtype = _DTYPES[code]
            out.append(_view(payload[at:at + n * dtype.itemsize], dtype))
            at += n * dtype.itemsize
        return out[0] if len(out) == 1 else tuple(out)


#: Ok-Topk's messages: uint8 buffers behind their int64 length
BYTES = PartsWire((torch.uint8,))
#: users' tensor programs: tensors or tuples of tensors of any dtype
TENSORS = TensorWire()


@functools.lru_cache(maxsize=64, typed=True)
def sparse_wire(value_dtype: torch.dtype, index_dtype: torch.dtype, k: int, exact_k: bool = False) -> PartsWire:
    """gTop-k's messages: (values, indices) pairs; exactly k of them without a header with
    ``exact_k``, else behind the count (receive buffers sized for 2k pairs). One shared
    format per argument tuple (a format is never changed after it is made)."""
    return PartsWire((value_dtype, index_dtype), count=k if exact_k else None, capacity=2 * k)


def sparse_message_bytes(n: int, value_dtype: torch.dtype, idx_dtype: torch.dtype) -> int:
    """Bytes of one sparse message of n entries: header + n * (value + index size)."""
    return HEADER_BYTES + n * (value_dtype.itemsize + idx_dtype.itemsize)
