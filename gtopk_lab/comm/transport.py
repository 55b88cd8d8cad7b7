"""One transport interface, two drivers: how the rounds of per-rank programs are carried.

A :class:`Transport` is one rank's end of the links between the ranks of one collective
call. It moves payloads; how a payload becomes bytes on a wire is the transport's own
business (:mod:`gtopk_lab.comm.wire`). Implementations:

- :class:`~gtopk_lab.comm.dist_transport.DistTransport`: torch.distributed point-to-point
  (gloo on CPU, NCCL on GPU), one buffer per message, receives posted ahead where the
  schedule is known; **blocking** receives;
- :class:`InProcessTransport`: virtual ranks in one process, an in-memory mailbox per
  (sender, receiver) pair carrying the payload objects themselves (no copy); a receive
  that finds nothing returns None.

- :class:`~gtopk_lab.comm.links_transport.LinksTransport`: the project's own links,
  shared-memory rings per directed pair between ranks on one host
  (:mod:`gtopk_lab.comm.shm_ring`) or a TCP socket per peer between hosts
  (:mod:`gtopk_lab.comm.tcp_links`); **blocking** receives. Real ranks get it or
  DistTransport from :func:`gtopk_lab.comm.transport_choice.transport_for`.

Drivers run the rounds that :meth:`gtopk_lab.comm.recorder.Recorder.wrap` yields,
``(dst, src, payload)``:

- :func:`drive`: one rank over a blocking transport: per round ``post(dst, payload)``, then
  ``receive(src)``, then ``end_round()``; ``finish()`` once the program returns (sends
  complete there: a rank never waits for its own send before its receive, so a ring whose
  ranks all send right and receive left cannot deadlock);
- :func:`run_programs`: P virtual ranks in one thread, round-robin over in-process
  transports; a state where no rank can advance raises ``RuntimeError`` (a schedule bug).

Both call the same operations in the same order per rank, so a program's results and its
recorded rounds are those of the real ranks, bitwise.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Generator
from typing import Any

__all__ = ["Transport", "InProcessTransport", "Mailbox", "drive", "run_programs"]

#: what a virtual rank's program is first resumed with (``next``, not ``send``)
_START = object()


class Transport(ABC):
    """One rank's endpoint for one collective call (see the module docstring)."""

    #: ``receive`` waits for its message (True) or returns None when it has not arrived (False)
    blocking: bool = True
    #: :meth:`plan` posts receives ahead (callers skip working out the plan where it does not)
    posts_ahead: bool = False

    @abstractmethod
    def post(self, dst: int, payload: Any) -> None:
        """Start sending ``payload`` to rank ``dst``; returns without waiting for it."""

    @abstractmethod
    def receive(self, src: int) -> Any | None:
        """The next payload from rank ``src`` (messages between two ranks arrive in order)."""

    def plan(self, receive_peers: list[int]) -> None:
        """A hint: this rank's receives will come from ``receive_peers``, in this order (a
        transport that posts receives ahead uses it; by default nothing happens)."""

    def end_round(self) -> None:
        """The round's sends are posted and its receive (if any) is done (pacing hooks)."""

    def finish(self) -> None:
        """Complete every send; called once when the program has returned."""


def drive(rounds: Generator[Any, Any, Any], transport: Transport) -> Any:
    """Carry out the rounds ``(dst, src, payload)`` of one rank over a blocking ``transport``;
    returns the program's result."""
    try:
        dst, src, payload = next(rounds)
        while True:
            if dst is not None:
                transport.post(dst, payload)
            reply = transport.receive(src) if src is not None else None
            transport.end_round()
            dst, src, payload = rounds.send(reply)
    except StopIteration as stop:
        transport.finish()
        return stop.value


class Mailbox:
    """FIFO queues of payloads, one per (sender, receiver) pair, shared by the virtual ranks."""

    def __init__(self) -> None:
        self.queues: dict[tuple[int, int], deque[Any]] = {}


class InProcessTransport(Transport):
    """Virtual rank ``rank``'s endpoint on a shared :class:`Mailbox` (payloads are not copied)."""

    blocking = False

    def __init__(self, rank: int, mailbox: Mailbox) -> None:
        self.rank, self.mailbox = rank, mailbox

    def post(self, dst: int, payload: Any) -> None:
        self.mailbox.queues.setdefault((self.rank, dst), deque()).append(payload)

    def receive(self, src: int) -> Any | None:
        queue = self.mailbox.queues.get((src, self.rank))
        return queue.popleft() if queue else None


def run_programs(programs: list[Generator[Any, Any, Any]]) -> list[Any]:
    """Run the rounds of P virtual ranks (``programs[r]``: rank r's wrapped program) to the end.

    Round robin: a rank posts its round's send, then takes its receive if the message is
    there (else the next rank goes on); a rank whose round is done advances at once. Returns
    every rank's result, in rank order.
    """
    mailbox = Mailbox()
    ends = [InProcessTransport(r, mailbox) for r in range(len(programs))]
    pending: list[Any] = [None] * len(programs)
    posted = [False] * len(programs)
    done = [False] * len(programs)
    results: list[Any] = [None] * len(programs)

    def advance(r: int, value: Any) -> None:
        try:
            pending[r] = programs[r].send(value) if value is not _START else next(programs[r])
        except StopIteration as stop:
            done[r], results[r] = True, stop.value
        posted[r] = False

    for r in range(len(programs)):
        advance(r, _START)
    while not all(done):
        progressed = False
        for r, end in enumerate(ends):
            while not done[r]:
                dst, src, payload = pending[r]
                if dst is not None and not posted[r]:
                    end.post(dst, payload)
                    posted[r] = progressed = True
                if src is None:
                    advance(r, None)
                    continue
                got = end.receive(src)
                if got is None:
                    break
                advance(r, got)
                progressed = True
        if not progressed:
            raise RuntimeError("simulated collective deadlocked: no virtual rank can advance")
    return results
