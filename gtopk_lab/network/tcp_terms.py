"""Terms of real TCP that the alpha-beta model misses (issue 28, item 4): composable extras.

The alpha-beta model (:mod:`gtopk_lab.network.model`) charges a round
``alpha + beta * max(sent, recv)``. On a real TCP link three more things cost time;
:class:`TcpTerms` adds each as a separate, independently switchable term (all zero by
default, so ``TcpTerms()`` reproduces the plain model exactly):

1. **Per-message CPU** ``cpu_s_per_message``: the kernel/gloo cost of posting and
   completing one message, paid once per round by each rank. Cost: O(1) per round.
2. **TCP slow start** (``rtt_s``, ``init_window_bytes``): a connection idle longer than
   an RTO restarts at the initial window and doubles it each round trip. A message of
   ``n`` bytes needs ``r = ceil(log2(n / W0 + 1))`` round trips if its window never
   reaches the bandwidth-delay product ``B = rtt * bandwidth / 8``; the extra over the
   bandwidth term is ``max(0, r * rtt - beta * n)`` counted until the window reaches
   ``B`` (:func:`slow_start_extra_s`). Matters for short-to-medium messages on links with
   a large BDP; zero when ``rtt_s`` is 0. Cost: O(1) per round.
3. **Incast**, ``s >= 2`` senders into one receiver in the same round, two ways:
   ``incast_s_per_sender``: drops and retransmits in the receiver's queue cost about
   ``incast_s_per_sender * (s - 1)`` on top of the receiver's bandwidth term;
   ``incast_beta_fraction`` (f): a port that several flows keep busy drains closer to its
   rate than one flow gets from it. The calibrated beta is one flow's (a ping-pong: on the
   testbed's 200 Mbit/s ``tbf`` ports, 171 Mbit/s), so such a round's bytes past the
   shaper's burst cost ``(1 - f)`` of it: ``- f * beta * max(0, n - B)``. 0 <= f < 1.
4. **A straggler's link** sets the pace of every synchronous round:
   :func:`bottleneck_beta` gives the per-byte cost of the slowest link of a round.
5. **Duplex** ``duplex_beta_fraction``: a round in which a rank sends and receives at once
   costs ``f * beta * min(sent, recv)`` more: each direction's ACKs ride the other
   direction's shaped link, and two TCP streams through one shaper lose some of its rate.
   Cost: O(1) per round.
6. **A shaper's burst** ``burst_bytes`` (B): a token-bucket shaper (``tbf``, a rate-limited
   port) lets the first B bytes of a message out at line rate, refilling its bucket while
   the link idles (at 200 Mbit/s the testbed's bucket of 100 us of rate refills within
   one alpha), so a round costs ``alpha + beta * max(0, n - B)``: ``beta * min(n, B)``
   *less* than the plain model, with ``n = max(sent, recv)``. B comes with the alpha it was
   fitted with (:func:`gtopk_lab.network.link_fit.fit_alpha_beta_burst`, the ping-pong's
   three-constant fit), never added to a linear fit's alpha. Cost: O(1) per round.
7. **A message's serial I/O** ``serial_io_bytes`` (F): the CPU a rank spends in the links'
   calls on a message's first F bytes (the write before they leave, the read after they
   land) runs in series with the wire; past F, writes and reads overlap the bytes in
   flight. The link's ping-pong prices that CPU inside alpha at one rank per core; when
   the ranks exchanging at once outnumber the cores it stretches, and the stretch is on the
   critical path (:func:`gtopk_lab.network.tcp_fit.predict_call`, which has the measured
   I/O CPU; :meth:`serial_io_s` splits it). Nothing here without a measured I/O CPU: the
   virtual clock's rounds do not charge it. Not fitted: :func:`~gtopk_lab.network.tcp_fit.fit_terms`
   sets F to the initial window (``init_window_bytes``), what TCP sends in one flight
   before ACKs clock the rest (a grid over each testbed run's P <= 4 calls found a flat
   optimum between 4 and 16 kB, the fit's per-message CPU trading against it). Cost: O(rounds).

Another helper's per-message CPU/contention term for in-process pacing (issue 27) is
separate; these terms compose with it by addition, as each returns seconds to add.

Constants: fitted on P <= 4 measurements and checked on P = 8 held out
(:mod:`gtopk_lab.network.tcp_fit`, ``benchmarks/tcp_model.py``; :func:`fit_per_message_cpu`
fits the per-message term alone). A :class:`~gtopk_lab.network.model.NetworkModel` carries
them (its ``tcp`` field, None by default), so the virtual clock and the formulas charge them.

Worker-side module: imports only the standard library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, Sequence


class Link(Protocol):
    """What these terms read of a link (``gtopk_lab.network.model.NetworkModel``, which imports
    this module to carry the terms: a protocol here keeps the two free of an import cycle)."""

    bandwidth_bps: float

    @property
    def beta_s_per_byte(self) -> float: ...

    def ab_steps_time_s(self, steps: Sequence[tuple[int, int]]) -> float: ...

__all__ = ["Link", "TcpTerms", "bottleneck_beta", "fit_per_message_cpu", "relative_errors", "slow_start_extra_s"]


def slow_start_extra_s(nbytes: float, bandwidth_bps: float, rtt_s: float, init_window_bytes: float) -> float:
    """Seconds slow start adds to one ``nbytes`` message over the bandwidth term (step 2).

    1. No RTT or unthrottled link or empty message: 0.
    2. ``B = rtt * bandwidth / 8`` (bytes in flight at full rate). If ``W0 >= B``: 0.
    3. Window doubling: after ``r`` round trips ``W0 * (2**r - 1)`` bytes are sent; the
       window reaches ``B`` after ``R = ceil(log2(B / W0))`` round trips, having sent
       ``S = W0 * (2**R - 1)`` bytes.
    4. If ``n <= S``: ``r = ceil(log2(n / W0 + 1))`` rounds, extra ``r * rtt - beta * n``;
       else extra ``R * rtt - beta * S`` (the rest flows at full rate). Clamped at 0.
    """
    if nbytes <= 0 or rtt_s <= 0 or math.isinf(bandwidth_bps):
        return 0.0
    if init_window_bytes <= 0:
        raise ValueError(f"init_window_bytes={init_window_bytes!r} is invalid: expected bytes > 0")
    beta = 8.0 / bandwidth_bps
    bdp = rtt_s * bandwidth_bps / 8.0
    if init_window_bytes >= bdp:
        return 0.0
    rounds_to_bdp = math.ceil(math.log2(bdp / init_window_bytes))
    sent_in_ramp = init_window_bytes * (2 ** rounds_to_bdp - 1)
    if nbytes <= sent_in_ramp:
        r = math.ceil(math.log2(nbytes / init_window_bytes + 1))
        return max(0.0, r * rtt_s - beta * nbytes)
    return max(0.0, rounds_to_bdp * rtt_s - beta * sent_in_ramp)


def bottleneck_beta(bandwidths_bps: Sequence[float]) -> float:
    """Seconds per byte of the slowest link of a synchronous round (step 4); 0 if all unthrottled."""
    if not bandwidths_bps:
        raise ValueError("bandwidths_bps is invalid: expected at least one rate")
    slowest = min(float(b) for b in bandwidths_bps)
    if not slowest > 0:
        raise ValueError(f"bandwidths_bps={list(bandwidths_bps)!r} is invalid: expected rates > 0")
    return 0.0 if math.isinf(slowest) else 8.0 / slowest


@dataclass(frozen=True)
class TcpTerms:
    """The extra TCP terms (module docstring); all zero = the plain alpha-beta model."""

    cpu_s_per_message: float = 0.0
    rtt_s: float = 0.0
    init_window_bytes: float = 10 * 1448.0  # Linux's initial window: 10 segments of 1448 B
    incast_s_per_sender: float = 0.0
    duplex_beta_fraction: float = 0.0
    burst_bytes: float = 0.0
    incast_beta_fraction: float = 0.0
    serial_io_bytes: float = 0.0

    def __post_init__(self) -> None:
        for fname in ("cpu_s_per_message", "rtt_s", "init_window_bytes", "incast_s_per_sender",
                      "duplex_beta_fraction", "burst_bytes", "incast_beta_fraction", "serial_io_bytes"):
            value = getattr(self, fname)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{fname}={value!r} has type {type(value).__name__}: expected float")
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{fname}={value!r} is invalid: expected a finite number >= 0")
        if self.init_window_bytes <= 0:
            raise ValueError(f"init_window_bytes={self.init_window_bytes!r} is invalid: expected bytes > 0")
        if self.incast_beta_fraction >= 1:
            raise ValueError(f"incast_beta_fraction={self.incast_beta_fraction!r} is invalid: expected a fraction "
                             "in [0, 1)")

    @property
    def is_zero(self) -> bool:
        """True when no term adds anything (the plain alpha-beta model)."""
        return (self.cpu_s_per_message == 0 and self.rtt_s == 0 and self.incast_s_per_sender == 0
                and self.duplex_beta_fraction == 0 and self.burst_bytes == 0 and self.incast_beta_fraction == 0
                and self.serial_io_bytes == 0)

    def serial_io_s(self, io_s: float, steps: Sequence[tuple[int, int]]) -> float:
        """The part of a rank's I/O CPU ``io_s`` (over the messages of ``steps``) spent on each
        message's first ``serial_io_bytes`` (step 7), pro rata to bytes:
        ``io_s * sum(min(n, F)) / sum(n)`` over every message sent and received."""
        total = sum(int(a) + int(b) for a, b in steps)
        if total <= 0 or self.serial_io_bytes <= 0:
            return 0.0
        first = sum(min(int(a), self.serial_io_bytes) + min(int(b), self.serial_io_bytes) for a, b in steps)
        return io_s * first / total

    def past_burst_bytes(self, sent: int, recv: int) -> float:
        """Bytes of a round beyond the shaper's burst: ``max(0, max(sent, recv) - B)`` (what
        a busy port's fraction of beta applies to, step 3)."""
        return max(0.0, max(sent, recv) - self.burst_bytes)

    def extra_round_s(self, net: Link, sent: int, recv: int, senders: int = 1) -> float:
        """Seconds these terms add to one alpha-beta round (steps 1-3, 5 and 6; the burst's
        and a busy port's are negative, together never below the round's alpha:
        ``beta * min(n, B) + f * beta * max(0, n - B) <= beta * n`` for f < 1)."""
        if senders < 1:
            raise ValueError(f"senders={senders!r} is invalid: expected >= 1")
        n = max(sent, recv)
        busy_port = self.incast_beta_fraction * net.beta_s_per_byte * self.past_burst_bytes(sent, recv)
        return (self.cpu_s_per_message
                + slow_start_extra_s(n, net.bandwidth_bps, self.rtt_s, self.init_window_bytes)
                + self.incast_s_per_sender * (senders - 1)
                - (busy_port if senders > 1 else 0.0)
                + self.duplex_beta_fraction * net.beta_s_per_byte * min(sent, recv)
                - net.beta_s_per_byte * min(n, self.burst_bytes))

    def to_dict(self) -> dict[str, float]:
        """JSON form (every field); :meth:`from_dict` reads it back."""
        return {f: float(getattr(self, f)) for f in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TcpTerms":
        """Inverse of :meth:`to_dict`; an unknown key is refused naming it."""
        if not isinstance(data, dict):
            raise TypeError(f"tcp has type {type(data).__name__}: expected a dict of TcpTerms fields")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"tcp={unknown[0]!r} is invalid: expected keys {', '.join(cls.__dataclass_fields__)}")
        return cls(**data)

    def steps_time_s(self, net: Link, steps: Sequence[tuple[int, int]],
                     senders: Sequence[int] | None = None) -> float:
        """The plain alpha-beta time of ``steps`` on ``net`` plus :meth:`extra_round_s` of every round
        (``net``'s own ``tcp`` terms are not added: these replace them).

        ``senders``: per round, how many ranks send to this rank at once (default 1).
        """
        if senders is not None and len(senders) != len(steps):
            raise ValueError(f"senders has {len(senders)} entries: expected one per round ({len(steps)})")
        total = net.ab_steps_time_s(steps)
        for i, (sent, recv) in enumerate(steps):
            total += self.extra_round_s(net, sent, recv, 1 if senders is None else senders[i])
        return total


def fit_per_message_cpu(measured_s: Sequence[float], modelled_s: Sequence[float],
                        rounds: Sequence[int]) -> float:
    """Least-squares ``c >= 0`` in ``measured ~ modelled + c * rounds`` (P <= 4 points).

    1. Residuals ``d_i = measured_i - modelled_i``.
    2. ``c = sum(d_i * m_i) / sum(m_i ** 2)`` with ``m_i`` the rounds; clamped at 0.
    """
    if not (len(measured_s) == len(modelled_s) == len(rounds)) or not rounds:
        raise ValueError("measured_s, modelled_s and rounds are invalid: expected equal, non-empty lengths")
    denom = sum(float(m) ** 2 for m in rounds)
    if denom == 0:
        raise ValueError("rounds is invalid: expected at least one round > 0")
    num = sum((float(a) - float(b)) * float(m) for a, b, m in zip(measured_s, modelled_s, rounds))
    return max(0.0, num / denom)


def relative_errors(measured_s: Sequence[float], predicted_s: Sequence[float]) -> list[float]:
    """``(predicted - measured) / measured`` per point (the held-out P = 8 check)."""
    if len(measured_s) != len(predicted_s):
        raise ValueError("measured_s and predicted_s are invalid: expected equal lengths")
    for m in measured_s:
        if not m > 0:
            raise ValueError(f"measured_s contains {m!r}: expected times > 0")
    return [(float(p) - float(m)) / float(m) for m, p in zip(measured_s, predicted_s)]
