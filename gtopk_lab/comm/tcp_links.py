"""A process group's own TCP links between hosts: the handshake, a socket per peer, waits in poll.

Why not gloo's point-to-point: on the 2-core VM a gloo ``isend``/``irecv`` exchange of
18.5 kB between two processes on loopback took 0.57-1.9 ms and a 64-byte ping-pong 0.22-0.42
ms, where two Python processes exchanging the same bytes over a plain TCP socket took 51 us
and 21 us (``benchmarks/tcp_transport.py``): each gloo message is three frames (send-ready,
payload, recv-ready notices) handed between the caller, ProcessGroupGloo's work queue and the
device thread's epoll loop, a wake-up at every hand-off. gTop-k's rounds are small dependent
messages, so on a real network those hand-offs, not the wire, set its pace (issue 28: 11.5 ms
a P = 4 call where its 18.6 kB take 1.9 ms at 200 Mbit/s).

:func:`tcp_links` gives this rank's :class:`TcpLinks` for a gloo group whose ranks are not all
on one host (:func:`~gtopk_lab.comm.shm_links.shm_links` said no), or None (gloo carries the
messages). Decided once per group, on its first point-to-point call (every rank makes it):

1. each rank reads ``GTOPK_LAB_TCP`` (unless "0": willing) and listens on the address gloo
   binds to: the interface named by ``GLOO_SOCKET_IFNAME`` (which
   :func:`~gtopk_lab.comm.launch.bind_to_interface` sets to the one carrying the worker's
   address), else the address the hostname resolves to; port 0 (the OS picks)
   (:mod:`~gtopk_lab.comm.tcp_connect`, as step 3);
2. ``all_gather_object`` of (willing, address, port, token, settings error): an invalid
   setting is the same one-line ``ValueError`` on every rank; TCP only if every rank is willing;
3. each rank connects to every higher rank (the listeners' backlogs take the connections
   before anyone accepts) and sends a hello (magic, its rank, the listener's token), then
   accepts one connection from every lower rank, checking the hello; ``TCP_NODELAY`` on each;
4. a second ``all_gather_object`` of "connected"; any failure on any rank: every rank closes
   its sockets and gloo carries the messages. The listener is closed either way.

Cost: two ``all_gather_object`` and P - 1 connections per rank, once per group.

Messages: an 8-byte little-endian length, then the bytes. Sockets are non-blocking: a send
goes out in one ``sendmsg`` (the length and the parts, no copy) when the kernel takes it
whole, else the rest is queued (copied) and moves whenever this rank waits, so a rank never
waits for its own send before its receive (a ring of ranks that all send right, then receive
left, cannot deadlock). Queued messages leave in posting order, one peer at a time
(:mod:`~gtopk_lab.comm.send_order`: a tree's relay gets its whole message first). A wait
sleeps in ``poll`` on the peer it receives from and the peer it sends to, so a message wakes
it at once. A peer whose connection closes is a
``RuntimeError`` ("Connection closed by peer", as gloo's own, which
:func:`~gtopk_lab.worker.faults.failure_cause` reads as "peer lost"); a wait past the group's
timeout is one saying "Timed out waiting" (a peer timeout).
"""

from __future__ import annotations

import errno
import secrets
import select
import socket
import functools
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch.distributed as dist

from gtopk_lab.comm.dist_transport import group_timeout_s
from gtopk_lab.comm.group_links import GroupLinks, Links, links_wanted
from gtopk_lab.comm.send_order import SendOrder
from gtopk_lab.comm.tcp_connect import connect_mesh, listen, listen_address

__all__ = ["TCP_ENV", "TcpLinks", "tcp_links", "tcp_decided", "tcp_wanted", "listen_address", "forget_tcp_links",
           "io_cpu_s"]

#: "0" turns the TCP transport off (gloo's point-to-point between hosts); "1" (default): used
TCP_ENV = "GTOPK_LAB_TCP"
_LENGTH = struct.Struct("<q")
_POLL_MS = 50  # a wait wakes this often to check the group's timeout
#: thread CPU seconds this process spent inside the links' sends, receives and flushes (all groups)
_IO_CPU_S = [0.0]


def io_cpu_s() -> float:
    """Thread CPU seconds this process has spent so far inside :class:`TcpLinks`' ``send_arrays``,
    ``receive_array`` and ``flush`` (the socket calls, the kernel's network stack they run, and
    the waits that move queued bytes; a sleep in ``poll`` costs none). A model that prices the
    wire with a link calibrated over these same calls (``gtopk-lab calibrate``'s ping-pong)
    already holds this work: :mod:`gtopk_lab.network.cpu_contention`'s off-wire CPU is a call's
    thread CPU less the difference of two readings of this. Cost of keeping it: two
    ``time.thread_time()`` reads (about 1 us) per send, receive and flush."""
    return _IO_CPU_S[0]


_F = TypeVar("_F", bound=Callable[..., Any])


def _counts_io_cpu(method: _F) -> _F:
    """``method`` with the thread CPU of each call added to :func:`io_cpu_s`."""
    @functools.wraps(method)
    def timed(*args: Any) -> Any:
        cpu0 = time.thread_time()
        try:
            return method(*args)
        finally:
            _IO_CPU_S[0] += time.thread_time() - cpu0
    return timed  # type: ignore[return-value]


def tcp_wanted() -> bool:
    """``GTOPK_LAB_TCP``: "0"/"off"/"false" -> False; unset, "1"/"on"/"auto" -> True."""
    return links_wanted(TCP_ENV, "own TCP links where possible")


def _peer_lost(rank: int, peer: int, world: int, why: str) -> RuntimeError:
    return RuntimeError(f"tcp transport: Connection closed by peer: rank {peer} of {world} ({why}), "
                        f"seen by rank {rank}")


class TcpLinks(Links):
    """This rank's sockets of one group, one per peer (see the module docstring)."""

    def __init__(self, rank: int, world: int, socks: dict[int, socket.socket], timeout_s: float) -> None:
        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        self.socks = socks
        #: per destination: queued memoryviews of bytes still to send, one per message
        self.pending: dict[int, deque[memoryview]] = {d: deque() for d in socks}
        self._fifo: deque[int] = deque()  # the destination of every queued message, oldest first
        self._order = SendOrder(socks)
        self._poll = select.poll()
        self._masks: dict[int, int] = {}
        self._length = bytearray(_LENGTH.size)

    # ------------------------------------------------------------------ sending
    @_counts_io_cpu
    def send_arrays(self, dst: int, arrays: list[np.ndarray]) -> None:
        """:meth:`send` of uint8 numpy arrays: one ``sendmsg`` when the kernel takes it whole,
        nothing is queued before it and :mod:`~gtopk_lab.comm.send_order` lets it start, else
        the unsent rest is queued (a copy: the arrays may be views of tensors the caller reuses
        once this returns) and pumped in posting order."""
        total = sum(a.size for a in arrays)
        pieces = [_LENGTH.pack(total), *arrays]
        sent = 0
        if not self._fifo and self._order.may_start(dst):
            try:
                sent = self.socks[dst].sendmsg(pieces)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                raise self._broken(dst, exc) from exc
            if sent:
                self._order.wrote(dst)
            if sent == total + _LENGTH.size:
                return
        # one copy of the message (ascontiguousarray copies only a strided view), queued from
        # where the kernel stopped taking it
        self.pending[dst].append(memoryview(b"".join(p if isinstance(p, bytes) else np.ascontiguousarray(p)
                                                     for p in pieces))[sent:])
        self._fifo.append(dst)
        self.pump()

    def pump(self) -> bool:
        """Send queued messages, oldest first, as far as the sockets and the send order take
        them now (a peer's later message never before its earlier one); True if any bytes
        moved. A message that cannot move lets a later one to another peer past only when the
        send order's stall rule opens its gate."""
        moved = False
        held: set[int] = set()  # peers whose oldest message cannot move now
        i = 0
        while i < len(self._fifo):
            dst = self._fifo[i]
            if dst in held:
                i += 1
                continue
            if not self._order.may_start(dst):
                break
            queue = self.pending[dst]
            try:
                n = self.socks[dst].send(queue[0])
            except BlockingIOError:
                n = 0
            except OSError as exc:
                raise self._broken(dst, exc) from exc
            if n:
                moved = True
                self._order.wrote(dst)
            if n < len(queue[0]):
                queue[0] = queue[0][n:]
                held.add(dst)
                i += 1
                continue
            queue.popleft()
            del self._fifo[i]
        return moved

    # ------------------------------------------------------------------ receiving
    @_counts_io_cpu
    def receive_array(self, src: int) -> np.ndarray:
        """:meth:`receive` as a fresh uint8 numpy array (this rank owns it)."""
        sock, head = self.socks[src], self._length
        state: dict[str, object] = {"got": 0, "out": None}

        def ready() -> bool:
            out = state["out"]
            if out is None:
                got = self._read(sock, src, memoryview(head), int(state["got"]))  # type: ignore[arg-type]
                if got < len(head):
                    state["got"] = got
                    return False
                out = np.empty(_LENGTH.unpack(head)[0], dtype=np.uint8)
                state["out"], state["got"] = out, 0
            got = self._read(sock, src, memoryview(out).cast("B"), int(state["got"]))  # type: ignore[arg-type]
            state["got"] = got
            return got == out.size  # type: ignore[union-attr]

        if not ready():
            self._wait_until(ready, src, "send its message")
        return state["out"]  # type: ignore[return-value]

    def _read(self, sock: socket.socket, src: int, view: memoryview, got: int) -> int:
        """Read into ``view[got:]`` what the socket has now; the new count."""
        while got < len(view):
            try:
                n = sock.recv_into(view[got:])
            except BlockingIOError:
                return got
            except OSError as exc:
                raise self._broken(src, exc) from exc
            if n == 0:
                raise _peer_lost(self.rank, src, self.world, "its connection closed")
            got += n
        return got

    # ------------------------------------------------------------------ waiting
    flush = _counts_io_cpu(Links.flush)

    def _wait_until(self, ready: Callable[[], bool], peer: int | None, what: str) -> None:
        """Sleep in poll until ``ready()``; queued sends keep moving; the group's timeout."""
        start = time.monotonic()
        while True:
            self.pump()
            if ready():
                return
            waited = time.monotonic() - start
            if waited > self.timeout_s:
                raise RuntimeError(f"tcp transport: Timed out waiting {waited:.0f}s (the group's timeout) for "
                                   f"rank {peer if peer is not None else 'a peer'} to {what}, rank {self.rank} "
                                   f"of {self.world}")
            gated = bool(self._fifo) and not self._order.may_start(self._fifo[0])
            self._arm(peer, gated)
            try:
                if gated:  # no socket event says when the last peer's queue drains: a sleep of
                    # under 1 ms (poll's resolution), after which the loop reads what has come in
                    time.sleep(self._order.wait_s())
                else:
                    self._poll.poll(_POLL_MS)  # a closed or failed socket wakes it too: the I/O says how
            except InterruptedError:
                continue

    def _arm(self, peer: int | None, gated: bool) -> None:
        """Poll the socket received from for input and, unless the send order holds it, the
        oldest queued message's for output; no other (a peer that finished and closed its end
        is no concern of this wait)."""
        head = self._fifo[0] if self._fifo and not gated else None
        for dst, sock in self.socks.items():
            mask = (select.POLLIN if dst == peer else 0) | (select.POLLOUT if dst == head else 0)
            fd = sock.fileno()
            if self._masks.get(fd, 0) == mask:
                continue
            if mask == 0:
                self._poll.unregister(fd)
                del self._masks[fd]
            elif fd in self._masks:
                self._poll.modify(fd, mask)
                self._masks[fd] = mask
            else:
                self._poll.register(fd, mask)
                self._masks[fd] = mask

    def _broken(self, peer: int, exc: OSError) -> RuntimeError:
        if exc.errno in (errno.ECONNRESET, errno.EPIPE):
            why = "Connection reset by peer" if exc.errno == errno.ECONNRESET else "Broken pipe"
            return RuntimeError(f"tcp transport: {why}: rank {peer} of {self.world}, seen by rank {self.rank}")
        if exc.errno == errno.ETIMEDOUT:
            return RuntimeError(f"tcp transport: Connection timed out: rank {peer} of {self.world}, "
                                f"seen by rank {self.rank}")
        return RuntimeError(f"tcp transport: rank {peer} of {self.world}, seen by rank {self.rank}: {exc}")

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close()


# ---------------------------------------------------------------------- the handshake
def _handshake(group: dist.ProcessGroup | None, rank: int, world: int) -> TcpLinks | None:
    """Steps 1-4 of the module docstring; the same answer on every rank."""
    error = ""
    try:
        willing = tcp_wanted()
    except ValueError as exc:  # raised below on every rank, not here on this one alone
        error, willing = str(exc), False
    listener: socket.socket | None = None
    if willing:
        try:
            listener = listen()
        except (OSError, ValueError):  # no address to listen on: gloo
            willing = False
    try:
        address, port = listener.getsockname()[:2] if listener is not None else ("", 0)
        infos: list = [None] * world
        dist.all_gather_object(infos, (willing, address, port, secrets.token_bytes(8), error), group=group)
        bad = [(r, info[4]) for r, info in enumerate(infos) if info[4]]
        if bad:
            raise ValueError(f"{bad[0][1]} (in the environment of rank {bad[0][0]} of {world})")
        if not all(info[0] for info in infos):
            return None
        socks: dict[int, socket.socket] | None
        try:
            assert listener is not None
            socks = connect_mesh(rank, world, infos, listener)
        except OSError:
            socks = None
        answers: list = [None] * world
        dist.all_gather_object(answers, socks is not None, group=group)
        if socks is None or not all(answers):
            for sock in (socks or {}).values():
                sock.close()
            return None
        return TcpLinks(rank, world, socks, group_timeout_s(group))
    finally:
        if listener is not None:
            listener.close()


_GROUPS: GroupLinks[TcpLinks] = GroupLinks(_handshake)


def forget_tcp_links(key: int) -> None:
    """Drop (and close) the links kept under ``key`` = id(group) (the group was freed)."""
    _GROUPS.forget(key)


def tcp_decided(group: dist.ProcessGroup | None) -> bool | None:
    """Without any communication: True when ``group``'s handshake chose these links, False
    when it chose gloo, None when it has not run."""
    return _GROUPS.decided(group)


def tcp_links(group: dist.ProcessGroup | None) -> TcpLinks | None:
    """This rank's TCP links of ``group`` (None: the default group), or None when gloo
    carries its messages (another backend, one rank, turned off, a handshake that failed)."""
    return _GROUPS.get(group)
