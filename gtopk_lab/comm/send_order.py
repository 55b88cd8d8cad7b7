"""Messages to several peers leave a rank in the order it posted them, one at a time.

Why: a rank that posts big messages to several peers back to back shares one NIC between
them. Handed to the kernel together, they interleave on the wire and every one of them ends
when the last one does. A store-and-forward schedule then waits longer than its rounds: the
gTop-k tree's broadcast posts rank 0's message to P/2 (which relays it) before the one to 1,
and interleaved, P/2 has its message only when 1 has its own too. On the testbed (200 Mbit/s,
2 MB messages, 94 ms each) the tree's 25M, rho = 0.01 call took 466 ms at P = 4 and 768 ms at
P = 8 against 398 and 632 ms of alpha-beta plus CPU (benchmarks/RESULTS.md, issue 28 item 4).

Rule, kept by :class:`~gtopk_lab.comm.tcp_links.TcpLinks` with a :class:`SendOrder`:

1. queued messages are handed to the kernel in posting order, one at a time (the order
   between two messages to one peer is TCP's own);
2. a message to another peer than the last one written starts only when the last peer's
   socket holds at most :data:`GATE_BYTES` not yet acknowledged (``SIOCOUTQ``): that
   message has all but left the host. Messages smaller than the gate never wait;
3. if that count has not moved for :data:`STALL_S` (a peer that does not read until
   something else happens: its message cannot leave, or is out of the kernel but not
   acknowledged), the gate opens and later messages to other peers go past it, as they
   did before this rule: never a deadlock (tests/test_send_order.py);
4. a wait while gated sleeps for the time the last peer's queue takes to drain to the gate
   at the rate seen since the previous look (:meth:`SendOrder.wait_s`, 50 us to 1 ms), so a
   fast link does not idle for a whole poll tick (``poll`` counts whole milliseconds), and
   reads what has come in after each sleep.

Cost: one ``ioctl`` (about 1 us) per look at the gate; none for messages to one peer.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
import time

__all__ = ["GATE_BYTES", "STALL_S", "SendOrder", "unacked_bytes"]

#: a message to another peer starts when the previous peer's socket holds at most this many
#: bytes not yet acknowledged (a message this small never waits)
GATE_BYTES = 32 * 1024
#: the gate opens when the previous peer's unacknowledged bytes have not moved for this long
STALL_S = 0.02
_WAIT_MIN_S, _WAIT_MAX_S = 50e-6, 1e-3
_INT = struct.Struct("i")


def unacked_bytes(sock: socket.socket) -> int:
    """Bytes written to ``sock`` that its peer has not acknowledged yet (Linux ``SIOCOUTQ``:
    unsent plus in flight); 0 where the ioctl is not supported."""
    try:
        return _INT.unpack(fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, _INT.pack(0)))[0]
    except OSError:
        return 0


class SendOrder:
    """Steps 2-4 of the module docstring for one rank's sockets."""

    def __init__(self, socks: dict[int, socket.socket]) -> None:
        self.socks = socks
        #: the peer whose message was written last (None: none yet)
        self.last: int | None = None
        self._seen: tuple[int, float] | None = None  # (unacked bytes, when they last moved)
        self._rate: float | None = None  # bytes per second the last peer's queue drains at

    def wrote(self, dst: int) -> None:
        """Bytes of a message to ``dst`` went to the kernel."""
        if dst != self.last:
            self.last, self._seen, self._rate = dst, None, None

    def may_start(self, dst: int) -> bool:
        """Whether a message to ``dst`` may be written now (steps 2-3)."""
        last = self.last
        if last is None or last == dst:
            return True
        queued = unacked_bytes(self.socks[last])
        if queued <= GATE_BYTES:
            return True
        now = time.monotonic()
        if self._seen is None or queued != self._seen[0]:
            if self._seen is not None and queued < self._seen[0]:
                self._rate = (self._seen[0] - queued) / max(now - self._seen[1], 1e-6)
            self._seen = (queued, now)
            return False
        return now - self._seen[1] > STALL_S

    def wait_s(self) -> float:
        """Step 4: seconds to sleep before the next look at a closed gate."""
        if self._seen is None or not self._rate:
            return _WAIT_MIN_S * 4
        return min(_WAIT_MAX_S, max(_WAIT_MIN_S, (self._seen[0] - GATE_BYTES) / self._rate))
