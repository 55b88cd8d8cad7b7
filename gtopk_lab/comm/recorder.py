"""The one recorder: what a per-rank program sends and receives, counted one way for every
collective and every driver.

A program is one rank's algorithm as a generator of requests, resumed with what it
received:

- ``("send", peer, payload)``: send ``payload`` to ``peer`` (resumed with None);
- ``("recv", peer, None)``: receive the next message from ``peer``;
- ``("sendrecv", (dst, src), payload)``: send to ``dst`` and receive from ``src`` in the same
  round (a ring step: send right, receive left); ``dst == src`` (also written
  ``("sendrecv", peer, payload)`` or ``("exchange", peer, payload)``) is a pairwise exchange.

A request may carry a fourth element, the name of its phase (Ok-Topk's per-phase bytes).

:meth:`Recorder.wrap` runs a program under a driver: it checks each request, counts it as
**one round** of ``(bytes sent, bytes received)`` (a message's bytes are its wire format's,
:mod:`gtopk_lab.comm.wire`, header included), and hands the driver the round as ``(dst, src,
payload)``. So a round is what the alpha-beta model prices, ``alpha + beta max(sent, recv)``:
a ring step written as one ``sendrecv`` is charged one round, the same step written as a
send then a receive two. The transports (:mod:`gtopk_lab.comm.transport`) carry the rounds;
:meth:`Recorder.stats` turns the counts into :class:`~gtopk_lab.comm.stats.CommStats` and
:meth:`Recorder.result` a program's return value into a
:class:`~gtopk_lab.comm.stats.CollectiveResult`.

Example::

    def ring_step(rank, world, x):
        got = yield ("sendrecv", ((rank + 1) % world, (rank - 1) % world), x)
        return x + got

    rec = Recorder(TENSORS, rank, world)
    result = rec.result(drive(rec.wrap(ring_step(rank, world, x)), transport), "ring")
    result.stats.rounds  # 1
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import torch

from gtopk_lab.comm.stats import CollectiveResult, CommStats
from gtopk_lab.comm.wire import WireFormat

__all__ = ["OPS", "Round", "Recorder", "route"]

#: request operations (``exchange`` = ``sendrecv`` with one peer)
OPS: tuple[str, ...] = ("send", "recv", "sendrecv", "exchange")
#: what a driver carries out for one request: (send to, receive from, payload); None = no such part
Round = tuple["int | None", "int | None", Any]


def _peer(value: Any, rank: int, world: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < world or value == rank:
        raise ValueError(f"request peer={value!r} is invalid: expected a rank in [0, {world}) other than "
                         f"this rank ({rank})")
    return value


def route(request: Any, rank: int, world: int) -> tuple[int | None, int | None, Any, str]:
    """``(dst, src, payload, phase)`` of one request (see the module docstring); ``ValueError``
    naming what is wrong with a malformed one."""
    if not isinstance(request, tuple) or len(request) not in (3, 4):
        raise ValueError(f"request={request!r} is invalid: expected (op, peer, payload) or (op, peer, payload, phase)")
    op, peer, payload = request[:3]
    phase = request[3] if len(request) == 4 else ""
    if op == "send":
        return _peer(peer, rank, world), None, payload, phase
    if op == "recv":
        return None, _peer(peer, rank, world), None, phase
    if op in ("sendrecv", "exchange"):
        if op == "sendrecv" and isinstance(peer, tuple) and len(peer) == 2:
            return _peer(peer[0], rank, world), _peer(peer[1], rank, world), payload, phase
        p = _peer(peer, rank, world)
        return p, p, payload, phase
    raise ValueError(f"request op={op!r} is invalid: expected one of {', '.join(OPS)}")


class Recorder:
    """One rank's rounds in one call: ``steps`` ((sent, received) bytes per round, in order),
    ``peers`` ((destination, source) rank per round, None where unused),
    ``messages`` (messages sent) and, per phase named in the requests, ``phases[name]`` =
    ``{"sent", "recv", "sent_msgs", "recv_msgs", "rounds"}`` (bytes with headers)."""

    def __init__(self, wire: WireFormat, rank: int, world: int) -> None:
        self.wire, self.rank, self.world = wire, rank, world
        self.steps: list[tuple[int, int]] = []
        self.peers: list[tuple[int | None, int | None]] = []
        self.messages = 0
        self.phases: dict[str, dict[str, int]] = {}

    def wrap(self, program: Generator[Any, Any, Any]) -> Generator[Round, Any, Any]:
        """Run ``program`` under a driver: yields one :data:`Round` per request, records it, and
        returns the program's own return value."""
        nbytes, rank, world = self.wire.nbytes, self.rank, self.world
        try:
            request = next(program)
            while True:
                dst, src, payload, phase = route(request, rank, world)
                sent = nbytes(payload) if dst is not None else 0  # validates before anything is posted
                reply = yield (dst, src, payload)
                recv = nbytes(reply) if src is not None else 0
                self.steps.append((sent, recv))
                self.peers.append((dst, src))
                self.messages += dst is not None
                if phase:
                    p = self.phases.setdefault(phase, {"sent": 0, "recv": 0, "sent_msgs": 0, "recv_msgs": 0,
                                                       "rounds": 0})
                    p["sent"] += sent
                    p["recv"] += recv
                    p["sent_msgs"] += dst is not None
                    p["recv_msgs"] += src is not None
                    p["rounds"] += 1
                request = program.send(reply)
        except StopIteration as stop:
            return stop.value

    def fill(self, stats: CommStats) -> CommStats:
        """Set ``stats``' bytes, messages, rounds and steps from the recorded rounds."""
        stats.steps = self.steps
        stats.peers = self.peers
        stats.bytes_sent = sum(s for s, _ in self.steps)
        stats.bytes_recv = sum(r for _, r in self.steps)
        stats.messages = self.messages
        stats.rounds = len(self.steps)
        return stats

    def stats(self, collective: str, algorithm: str, **fields: Any) -> CommStats:
        """CommStats of the recorded rounds plus ``fields`` (merge CPU, drops, ...)."""
        return self.fill(CommStats(collective=collective, algorithm=algorithm, **fields))

    def result(self, out: Any, collective: str, algorithm: str = "program") -> CollectiveResult:
        """A program's return value as a CollectiveResult with the recorded stats: a
        CollectiveResult (its stats keep what the recorder cannot see: drops, merge CPU), a
        dense tensor, or a ``(values, indices)`` pair."""
        if isinstance(out, CollectiveResult):  # a lossy program reports its drops (mass rule)
            own = out.stats
            stats = self.stats(collective, algorithm, dropped_values=own.dropped_values,
                               dropped_indices=own.dropped_indices, merge_cpu_s=own.merge_cpu_s,
                               merged_elements=own.merged_elements, compress_cpu_s=own.compress_cpu_s)
            return CollectiveResult(out.values, out.indices, stats)
        stats = self.stats(collective, algorithm, dropped_values=None, dropped_indices=None)
        if isinstance(out, torch.Tensor):
            return CollectiveResult(out, None, stats)
        values, indices = out
        return CollectiveResult(values, indices, stats)
