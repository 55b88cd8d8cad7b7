"""What every real transport does around a round: pacing, profiling, packing and unpacking.

:class:`RoundHooks` is mixed into :class:`~gtopk_lab.comm.dist_transport.DistTransport` and
:class:`~gtopk_lab.comm.links_transport.LinksTransport`, so both pace and time a round the same way:

1. the round opens at its first post or receive (``begin_round`` of an active
   :class:`~gtopk_lab.network.pacing.LinkPacer`);
2. ``pack``: the payload becomes one buffer in the wire format (timed as ``pack``); the
   ``sendrecv`` stamp starts after it (or at the receive when the round only receives);
3. the round closes once its receive is in (``end_round(sent, recv)`` of the pacer, which
   may sleep to the modelled link time; ``sendrecv`` stops);
4. ``unpack``: the buffer becomes the payload (timed as ``unpack``), after the round closed.

Cost when neither a pacer nor a profile is active: a few attribute reads per round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gtopk_lab.comm.profiling import RoundProfile
from gtopk_lab.comm.wire import WireFormat
from gtopk_lab.network.pacing import active_pacer

__all__ = ["RoundHooks"]


class RoundHooks:
    """Per-round pacing and profiling state of one rank's transport for one call."""

    wire: WireFormat
    profile: RoundProfile | None

    def _init_rounds(self, wire: WireFormat, profile: RoundProfile | None) -> None:
        self.wire, self.profile = wire, profile
        self.pacer = active_pacer()
        self._open = False
        self._sent = self._recv = 0
        self._stamp: tuple[float, float] | None = None

    def _begin(self) -> None:
        if not self._open:
            self._open, self._sent, self._recv = True, 0, 0
            if self.pacer is not None:
                self.pacer.begin_round()

    def _close(self) -> None:
        if not self._open:
            return
        self._open = False
        if self.pacer is not None:
            self.pacer.end_round(self._sent, self._recv)
        if self.profile is not None and self._stamp is not None:
            self.profile.stop("sendrecv", self._stamp)
            self._stamp = None

    def _encode_timed(self, encode: Callable[[Any, torch.device], Any], payload: Any,
                      device: torch.device) -> Any:
        """Steps 1-2 for a send: the round is open, ``encode`` is timed as ``pack`` and the
        ``sendrecv`` time starts after it."""
        self._begin()
        prof = self.profile
        stamp = prof.stamp() if prof is not None else None
        out = encode(payload, device)
        if prof is not None:
            prof.stop("pack", stamp)
            self._stamp = prof.stamp()
        return out

    def _pack(self, payload: Any, device: torch.device) -> torch.Tensor:
        """Steps 1-2 for a send: the message's one buffer, counted in the round's bytes."""
        buf = self._encode_timed(self.wire.encode, payload, device)
        self._sent += buf.numel()
        return buf

    def _pack_parts(self, payload: Any, device: torch.device) -> list[torch.Tensor]:
        """:meth:`_pack` as the pieces of the buffer (``WireFormat.encode_parts``), uncopied."""
        parts = self._encode_timed(self.wire.encode_parts, payload, device)
        self._sent += sum(p.numel() for p in parts)
        return parts

    def _start_receive(self) -> None:
        """Steps 1-2 for a receive: the round is open and its ``sendrecv`` time runs."""
        self._begin()
        if self.profile is not None and self._stamp is None:
            self._stamp = self.profile.stamp()

    def _unpack(self, head: torch.Tensor, payload: torch.Tensor) -> Any:
        """Step 4: the payload of a received message (``WireFormat.decode``), timed."""
        prof = self.profile
        stamp = prof.stamp() if prof is not None else None
        out = self.wire.decode(head, payload)
        if prof is not None:
            prof.stop("unpack", stamp)
        return out

    def end_round(self) -> None:
        self._close()
