"""What ends a rank besides its own code: a lost scheduler, and how a failure is named.

Worker side only (standard library; torch only if the rank already imported it).

**Scheduler watchdog.** The thread that runs a rank task cannot be interrupted: after its
worker lost the scheduler, or began to shut down (``dask worker`` stopped with SIGTERM,
its scheduler gone: distributed 2024+ workers close at once then, they do not reconnect),
it would keep training blind, holding its cores and gloo ports, its metric rows dropped,
until Dask's close gives up waiting for it (30 s) and the process exits, or forever in an
embedding whose process outlives its worker. :class:`SchedulerWatchdog` stops it:

1. It reads the worker's state (:func:`scheduler_contact`: worker status and its batched
   stream to the scheduler; attribute reads, no message) at every sink call of the rank
   and, from a daemon thread, every ``interval_s`` (default ``min(1, timeout_s / 4)``).
2. It trips when the worker is shutting down (status ``closing``, ``closed``, ``failed``:
   nothing the rank computes can be reported any more), or when the worker still runs but
   has had no stream to the scheduler for ``timeout_s`` (``RunConfig.scheduler_timeout_s``,
   default 10 s; a worker that reconnects). Once tripped, the rank's next sink call
   raises :class:`WorkerClosing` or :class:`SchedulerLost`, the rank task's ``finally``
   destroys the process group, and peers blocked in a collective with it fail at once
   ("Connection closed by peer"). Checking at the sink call too means a rank never
   writes the next epoch checkpoint past the rows its client received.
3. A rank that has not ended ``hard_stop_after_s`` after the trip (stuck where no sink
   call comes, e.g. in a collective whose peer hangs; the default is the collective
   timeout plus 10 s, after which every gloo call has returned or failed) ends the worker
   process (``os._exit(70)``), with one line on stderr. Destroying or aborting the
   process group from the watchdog thread is no substitute: with gloo (torch 2.13) it
   does not wake a thread blocked in a collective (tried: the call waits for its peer
   or its timeout either way).

Cost: one thread per rank that wakes about once a second; per sink call a few attribute
reads and an uncontended lock.

**Failure causes.** :func:`failure_cause` names why a rank's code raised, in a few fixed
words the client puts into the run summary (``"out of memory"``, ``"scheduler lost"``,
``"worker closing"``, ``"peer lost"``, ``"peer timeout"``, ``"cancelled"``, ``"error"``).
``"peer timeout"`` is gloo giving up on a peer that stopped answering without closing its
sockets (its host's link went down, it hangs): ``Timed out waiting 10000ms for recv
operation to complete`` after the collective timeout, or the kernel's ``Connection timed
out``. Gloo does not say which peer; the client names it from the workers' heartbeats
(:func:`gtopk_lab.orchestration.faults.silent_workers`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["RankStopped", "SchedulerLost", "WorkerClosing", "SchedulerWatchdog",
           "scheduler_contact", "failure_cause", "OUT_OF_MEMORY", "SCHEDULER_LOST",
           "WORKER_CLOSING", "PEER_LOST", "PEER_TIMEOUT", "CANCELLED", "ERROR", "HARD_STOP_EXIT_CODE"]

logger = logging.getLogger("gtopk_lab.worker")

OUT_OF_MEMORY = "out of memory"
SCHEDULER_LOST = "scheduler lost"
WORKER_CLOSING = "worker closing"
PEER_LOST = "peer lost"
PEER_TIMEOUT = "peer timeout"
CANCELLED = "cancelled"
ERROR = "error"

#: Exit status of a worker process the watchdog ended (EX_SOFTWARE).
HARD_STOP_EXIT_CODE = 70

#: Worker states in which the worker still talks to its scheduler
#: (``distributed.worker.WORKER_ANY_RUNNING``; compared by value, so no Dask import here).
_RUNNING_STATES = ("running", "paused", "closing_gracefully")

#: Substrings of allocator errors that are not ``MemoryError``: torch's CPU allocator
#: raises ``RuntimeError: ... DefaultCPUAllocator: can't allocate memory`` (ENOMEM, e.g.
#: under RLIMIT_AS), CUDA "out of memory".
_OOM_TEXT = ("can't allocate memory", "Cannot allocate memory", "out of memory")
#: Substrings of gloo errors a rank gets when a peer died or left.
_PEER_TEXT = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
#: Substrings of gloo errors a rank gets when a peer stopped answering (a collective past
#: its timeout: gloo/transport/tcp/unbound_buffer.cc; a socket past TCP's retransmissions).
_TIMEOUT_TEXT = ("Timed out waiting", "Connection timed out")


class RankStopped(RuntimeError):
    """Raised inside a rank that the watchdog stopped."""


class SchedulerLost(RankStopped):
    """The rank's worker still runs but had no scheduler connection for ``scheduler_timeout_s``."""


class WorkerClosing(RankStopped):
    """The rank's worker is shutting down (SIGTERM, its scheduler gone, closed by Dask)."""


def scheduler_contact(worker: Any) -> tuple[str, str]:
    """``("ok", "")``, ``("closing", why)`` when the worker is shutting down, or
    ``("no-stream", why)`` when it runs without a stream to the scheduler. Safe to call
    from any thread (attribute reads only)."""
    status = getattr(worker, "status", None)
    name = str(getattr(status, "value", status))
    if name not in _RUNNING_STATES:
        return "closing", f"worker status {name}"
    stream = getattr(worker, "batched_stream", None)
    comm = getattr(stream, "comm", None)
    if comm is None or comm.closed():
        return "no-stream", "its connection to the scheduler is closed"
    return "ok", ""


class SchedulerWatchdog:
    """Stops a rank whose worker lost the scheduler or is shutting down; see the module
    docstring.

    ``check()`` (called by the rank's sink) probes once more and raises a
    :class:`RankStopped` once tripped; ``stop()`` (the rank task's ``finally``) ends the
    thread. ``contact``, ``clock`` and ``hard_stop`` are the worker probe, the monotonic
    clock and ``os._exit``; tests replace them.
    """

    def __init__(self, worker: Any, *, timeout_s: float, label: str = "rank",
                 hard_stop_after_s: float | None = None, interval_s: float | None = None,
                 contact: Callable[[Any], tuple[str, str]] = scheduler_contact,
                 clock: Callable[[], float] = time.monotonic,
                 hard_stop: Callable[[int], Any] = os._exit) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r} is invalid: expected seconds > 0")
        self.worker = worker
        self.timeout_s = float(timeout_s)
        self.label = label
        self.hard_stop_after_s = hard_stop_after_s
        self.interval_s = float(interval_s) if interval_s is not None else min(1.0, self.timeout_s / 4)
        self._contact = contact
        self._clock = clock
        self._hard_stop = hard_stop
        self._lock = threading.Lock()
        self._lost_since: float | None = None
        self._finished = threading.Event()
        self._tripped = threading.Event()
        self._error: RankStopped | None = None
        self._thread = threading.Thread(target=self._run, name=f"gtopk-watchdog-{label}", daemon=True)

    def start(self) -> "SchedulerWatchdog":
        self._thread.start()
        return self

    @property
    def tripped(self) -> bool:
        return self._tripped.is_set()

    @property
    def reason(self) -> str:
        return str(self._error) if self._error is not None else ""

    def check(self) -> None:
        """Probe the worker and raise the :class:`RankStopped` once tripped."""
        self._observe()
        if self._error is not None:
            raise type(self._error)(str(self._error))

    def stop(self) -> None:
        """The rank ended: no trip, no hard stop after this."""
        self._finished.set()

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    def _observe(self) -> None:
        """One probe: trip when the worker is closing, or has had no stream for ``timeout_s``."""
        with self._lock:
            if self._error is not None:
                return
            state, why = self._contact(self.worker)
            now = self._clock()
            if state == "ok":
                self._lost_since = None
                return
            if state == "closing":
                self._error = WorkerClosing(f"{self.label}: its Dask worker is shutting down ({why}); "
                                            f"stopping the rank")
            else:
                if self._lost_since is None:
                    self._lost_since = now
                lost_s = now - self._lost_since
                if lost_s < self.timeout_s:
                    return
                self._error = SchedulerLost(f"{self.label} lost the Dask scheduler ({why}) for "
                                            f"{lost_s:.0f} s >= scheduler_timeout_s={self.timeout_s:g}; "
                                            f"stopping the rank")
        logger.warning("gtopk-lab: %s", self._error)
        self._tripped.set()

    def _run(self) -> None:
        while not self._finished.wait(self.interval_s):
            self._observe()
            if self._tripped.is_set():
                break
        if not self._tripped.is_set() or self.hard_stop_after_s is None:
            return
        if self._finished.wait(self.hard_stop_after_s):
            return
        # Still running: stuck where no sink call comes. The worker is going or useless;
        # end the process rather than leave a rank holding cores and gloo ports.
        line = (f"gtopk-lab: {self.label} did not stop within {self.hard_stop_after_s:.0f} s of "
                f"the watchdog's trip ({self._error}); ending worker process {os.getpid()}")
        print(line, file=sys.stderr, flush=True)
        self._hard_stop(HARD_STOP_EXIT_CODE)


def failure_cause(exc: BaseException) -> str:
    """A few fixed words for why a rank raised ``exc`` (see the module docstring)."""
    if isinstance(exc, SchedulerLost):
        return SCHEDULER_LOST
    if isinstance(exc, WorkerClosing):
        return WORKER_CLOSING
    if isinstance(exc, MemoryError):
        return OUT_OF_MEMORY
    torch = sys.modules.get("torch")  # only if the rank imported it: no import here
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(exc, oom_type):
        return OUT_OF_MEMORY
    if type(exc).__name__ == "RunCancelled":
        return CANCELLED
    text = str(exc)
    if isinstance(exc, RuntimeError) and any(s in text for s in _OOM_TEXT):
        return OUT_OF_MEMORY
    if any(s in text for s in _PEER_TEXT):
        return PEER_LOST
    if isinstance(exc, RuntimeError) and any(s in text for s in _TIMEOUT_TEXT):
        return PEER_TIMEOUT
    return ERROR
