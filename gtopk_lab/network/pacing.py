"""Per-round link pacing: each communication round lasts at least its modelled time.

Throttling a whole collective (sleep after it until ``alpha-beta(steps)`` has passed) is
wrong for the sparse collectives: their merges *depend* on the round that delivered the
data, so on a real 1 Gbit/s link the merge CPU comes *after* the wire time, while a
per-call sleep lets it hide inside the modelled wire time. A :class:`LinkPacer` instead
paces every round on its own: a round that began at ``t0`` and moved ``(sent, recv)``
bytes ends no earlier than ``t0 + alpha + beta * max(sent, recv)`` (one full-duplex link
per rank, as on switched Ethernet). Library collectives without visible rounds (dense
ring allreduce, the allgather) are paced as a whole with :meth:`LinkPacer.pace_steps`,
before any local assembly that follows them.

The pacer is found through a context variable, so collectives need no extra argument:
:class:`gtopk_lab.network.clock.VirtualClock` installs one around each throttled call
(``with pacing(network) as pacer: ...``) and the transports call :func:`active_pacer`.
Outside such a block every hook is a no-op (one context-variable read per round).

Worker-side module: standard library plus the network model only.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from gtopk_lab.network.model import NetworkModel

__all__ = ["LinkPacer", "pacing", "active_pacer", "throttled_call", "steps_model_s", "wait_until"]

#: the last stretch of a paced wait is spun, not slept: a sleep wakes ~0.1 ms late, which
#: would add that much to every round (a busy-wait this short costs little CPU)
SPIN_S = 0.0002

_ACTIVE: contextvars.ContextVar["LinkPacer | None"] = contextvars.ContextVar("gtopk_lab_pacer", default=None)


def wait_until(deadline: float, clock: Callable[[], float] = time.perf_counter,
               spin_s: float = SPIN_S) -> float:
    """Return at ``deadline`` on ``clock``: sleep, then spin the last ``spin_s``
    (``time.sleep`` overshoots by ~0.1 ms). Returns the seconds waited (0 if past)."""
    delay = deadline - clock()
    if delay <= 0:
        return 0.0
    if delay > spin_s:
        time.sleep(delay - spin_s)
    while clock() < deadline:
        pass
    return delay


class LinkPacer:
    """Sleeps so that each round (or library collective) lasts its modelled time.

    Usage inside a transport: ``begin_round()`` when the round's first message is posted,
    ``end_round(sent, recv)`` once all of its messages completed. ``slept_s`` and
    ``rounds`` total what was paced.
    """

    def __init__(self, network: NetworkModel) -> None:
        if not isinstance(network, NetworkModel):
            raise TypeError(f"network={network!r} has type {type(network).__name__}: expected NetworkModel")
        self.network = network
        self.slept_s = 0.0
        self.rounds = 0
        self._round_start: float | None = None

    def _sleep_until(self, deadline: float) -> None:
        self.slept_s += wait_until(deadline)

    def begin_round(self) -> None:
        """Mark the start of a round (a no-op if one is already open)."""
        if self._round_start is None:
            self._round_start = time.perf_counter()

    def end_round(self, bytes_sent: int, bytes_recv: int) -> None:
        """Close the open round: sleep until ``start + alpha + beta * max(sent, recv)``.

        A no-op when no round is open (a program driven by the in-process simulator
        records rounds without any transport beginning them).
        """
        start = self._round_start
        if start is None:
            return
        self._round_start = None
        self.rounds += 1
        self._sleep_until(start + self.network.message_time_s(max(bytes_sent, bytes_recv)))

    def pace_steps(self, start_s: float, steps: Sequence[tuple[int, int]]) -> None:
        """Rounds that ran as one library call since ``start_s`` (``time.perf_counter``)."""
        self.rounds += len(steps)
        self._sleep_until(start_s + self.network.steps_time_s(steps))


def active_pacer() -> LinkPacer | None:
    """The pacer installed by the innermost :func:`pacing` block of this thread, or None."""
    return _ACTIVE.get()


@contextlib.contextmanager
def pacing(network: NetworkModel) -> Iterator[LinkPacer]:
    """Install a fresh :class:`LinkPacer` for ``network`` for the duration of the block."""
    pacer = LinkPacer(network)
    token = _ACTIVE.set(pacer)
    try:
        yield pacer
    finally:
        _ACTIVE.reset(token)


def steps_model_s(network: NetworkModel, fn: Callable[..., Any], result: Any) -> float:
    """``network.steps_time_s(result.stats.steps)``; TypeError naming ``fn`` if no stats."""
    stats = getattr(result, "stats", None)
    if stats is None or not hasattr(stats, "steps"):
        raise TypeError(f"collective {getattr(fn, '__name__', fn)!r} returned {type(result).__name__}: "
                        "expected a CollectiveResult with .stats.steps")
    return network.steps_time_s(stats.steps)


def throttled_call(network: NetworkModel, fn: Callable[..., Any], *args: Any,
                   **kwargs: Any) -> tuple[Any, float, float]:
    """Run collective ``fn`` on the emulated link: rounds paced, then a top-up sleep.

    Returns ``(result, model_s, slept_s)``: ``model_s`` is
    ``network.steps_time_s(result.stats.steps)`` (this rank's modelled rounds) and the call
    lasts at least that long (a top-up covers collectives without pacing hooks).
    :class:`~gtopk_lab.network.clock.VirtualClock` uses this with ``throttle=True``;
    benchmarks use it alone to time a collective without the clock's synchronisation.
    """
    start = time.perf_counter()
    with pacing(network) as pacer:
        result = fn(*args, **kwargs)
    model_s = steps_model_s(network, fn, result)
    top_up_s = model_s - (time.perf_counter() - start)
    if top_up_s > 0:
        time.sleep(top_up_s)
    return result, model_s, pacer.slept_s + max(0.0, top_up_s)
