"""The watched half of a run's life: reading its rank tasks, wording failures, restarts.

Client side; mixed into :class:`~gtopk_lab.orchestration.handle.RunHandle` (whose
``__init__`` owns every attribute used here) and called by the Lab's monitor only:

1. :meth:`RunLife.poll` reads the rank tasks' states each monitor tick and names the next
   step: ``fail`` (an error settled for :data:`FAILURE_SETTLE_S` so the earliest is
   reported, or a lost worker), ``complete``, ``cancel-timeout``, ``release`` (an ended
   run whose tasks drained) or ``restart`` (a restart whose survivors drained)
2. :meth:`RunLife.failure_report` words a failure: a lost worker first, else the hosts
   that stopped answering when the earliest error is a collective's timeout (``peer
   timeout``, :meth:`RunLife.explain_silent`), else the earliest error with its traceback,
   then the others
3. restarts (``RunConfig.max_restarts``): :meth:`RunLife.can_restart`,
   :meth:`RunLife.begin_restart`, :meth:`RunLife.prepare_restart`

Cost: O(P) per poll.
"""

from __future__ import annotations

import time
import traceback as _tb
from dataclasses import dataclass
from typing import Any, Literal

from gtopk_lab.orchestration.faults import STOPPED_ANSWERING, stopped_answering_line, worker_host
from gtopk_lab.worker.faults import PEER_TIMEOUT
from gtopk_lab.worker.rank_task import RankFailed

__all__ = ["FAILURE_SETTLE_S", "SETTLED", "Step", "RankError", "rank_error", "RunLife"]

#: After the first failure is seen, how long to wait for the other ranks' errors so
#: that the earliest (root-cause) error is the one reported.
#: past a rank's CANCEL_GRACE_S (2 s, worker/rank_task.py): a rank whose peer failed waits that
#: long for a cancellation before it reports its own error, so a 2 s settle raced it and the
#: report sometimes lacked its 'then failed' line (a fresh clone's suite, 2026-12-08)
FAILURE_SETTLE_S = 3.0
#: Task states after which a rank task holds no worker any more.
SETTLED = ("finished", "error", "cancelled")

#: What :meth:`RunLife.poll` asks the monitor to do next.
Step = Literal["fail", "complete", "cancel-timeout", "release", "restart"]


@dataclass
class RankError:
    """One rank's failure as the client saw it."""

    rank: int
    worker: str
    message: str
    traceback: str
    failed_at: float
    #: gtopk_lab.worker.faults.failure_cause: "out of memory", "peer lost", "error", ...
    cause: str = "error"


def rank_error(rank: int, addr: str, future: Any) -> RankError:
    """The error of a rank task in state ``error`` (a :class:`RankFailed` carries the
    rank's own worker, message, traceback and time)."""
    try:
        exc = future.exception(timeout=5)
    except Exception as err:  # pragma: no cover - scheduler gone
        exc = err
    if isinstance(exc, RankFailed):
        return RankError(rank, exc.worker, exc.message, exc.traceback_text,
                         getattr(exc, "failed_at", time.time()), getattr(exc, "cause", "error"))
    text = "".join(_tb.format_exception(exc)) if isinstance(exc, BaseException) else repr(exc)
    return RankError(rank, addr, f"{type(exc).__name__}: {exc}", text, time.time())



class RunLife:
    """Poll, failure report and restarts of a :class:`RunHandle` (see the module docstring)."""

    def poll(self, alive: set[str], now: float) -> Step | None:
        """Read the rank tasks' states; what the monitor must do next (None: nothing yet).

        ``alive`` is the set of workers in the cluster, ``now`` ``time.monotonic()``.
        """
        if self.done() or self._restarting:  # ended or restarting: drain, then release
            remaining = [f for r, f in enumerate(self._futures)
                         if r not in self._lost and f.status not in SETTLED]
            if not remaining or (self._drain_deadline is not None and now >= self._drain_deadline):
                return "restart" if self._restarting and not self.done() else "release"
            return None
        for rank, (addr, future) in enumerate(zip(self.workers, self._futures)):
            if future.status == "error" and rank not in self._errors:
                self._errors[rank] = rank_error(rank, addr, future)
            elif addr not in alive and rank not in self._lost and future.status != "finished":
                self._lost[rank] = addr
            elif (future.status == "cancelled" and not self._cancel_requested
                  and rank not in self._lost):
                # Not cancelled by this Lab: the client lost the scheduler and reconnected
                # (Dask cancels every future then), or someone cancelled it on the dashboard.
                self._lost[rank] = addr
                self._lost_causes[rank] = ("task cancelled", "had its rank task cancelled outside "
                                           "the Lab (the client lost its scheduler connection, or "
                                           "a Dask client cancelled it)")
        if self._errors or self._lost:
            if self._first_error_at is None:
                self._first_error_at = now
            unsettled = [f for r, f in enumerate(self._futures)
                         if r not in self._lost and r not in self._errors and f.status != "finished"]
            if self._lost or not unsettled or now - self._first_error_at >= FAILURE_SETTLE_S:
                return "fail"
            return None
        if all(f.status == "finished" for f in self._futures):
            return "complete"
        if self._cancel_requested and self._cancel_deadline is not None and now >= self._cancel_deadline:
            return "cancel-timeout"
        return None

    def failure_report(self) -> tuple[str, str]:
        """``(status, error)`` of a run :meth:`poll` found failed.

        A lost worker is named first (the other ranks' errors follow from it); otherwise
        the earliest error with its traceback, then the later ones. The status is
        ``cancelled`` when the run was cancelled and no worker was lost.
        """
        cancelled = self._cancel_requested or any(
            "RunCancelled" in e.message for e in self._errors.values())
        lines: list[str] = []
        if self._lost:
            for rank, addr in sorted(self._lost.items()):
                cause, detail = self._lost_causes.get(
                    rank, ("killed", "left the cluster during the run (killed or crashed)"))
                if cause == STOPPED_ANSWERING:
                    lines.append(f"host {worker_host(addr)} stopped answering (rank {rank} lost): "
                                 f"Dask worker {addr} {detail}")
                else:
                    lines.append(f"rank {rank} lost: Dask worker {addr} {detail}")
            first_rank = min(self._lost)
            first_worker, first_cause = self._lost[first_rank], self._lost_causes.get(
                first_rank, ("killed", ""))[0]
            for err in sorted(self._errors.values(), key=lambda e: e.failed_at):
                lines.append(f"rank {err.rank} on {err.worker} then failed: {err.message}")
        else:
            ordered = sorted(self._errors.values(), key=lambda e: e.failed_at)
            first = ordered[0]
            silent = {r: s for r, s in self._silent.items() if r != first.rank}
            if first.cause == PEER_TIMEOUT and silent:
                lines.append(stopped_answering_line(silent, first.rank, first.worker, self.timeout_s,
                                                    first.message))
            else:
                why = f" ({first.cause})" if first.cause not in ("error", "cancelled") else ""
                lines.append(f"rank {first.rank} on {first.worker} failed{why}: {first.message}")
            lines.append(first.traceback.rstrip())
            for err in ordered[1:]:
                lines.append(f"rank {err.rank} on {err.worker} then failed: {err.message}")
            first_rank, first_worker, first_cause = first.rank, first.worker, first.cause
            if first.cause == PEER_TIMEOUT and silent:
                first_rank = min(silent)
                first_worker, first_cause = silent[first_rank][0], STOPPED_ANSWERING
        status = "cancelled" if cancelled and not self._lost else "failed"
        if status == "failed":
            self.note_failure(first_rank, first_worker, first_cause)
        return status, "\n".join(lines)

    # --- run life: faults (gtopk_lab.orchestration.faults) -----------------------------
    def lost_ranks(self) -> dict[int, str]:
        """``{rank: worker address}`` of ranks whose worker left during this start."""
        return dict(self._lost)

    def explain_lost(self, causes: dict[int, tuple[str, str]]) -> None:
        """``{rank: (cause, detail)}`` of lost ranks (``faults.lost_worker_cause``), used
        by :meth:`failure_report`."""
        for rank, cause in causes.items():
            self._lost_causes.setdefault(rank, cause)

    def timed_out(self) -> bool:
        """Whether a rank of this start failed waiting for a peer (cause ``peer timeout``)."""
        return any(e.cause == PEER_TIMEOUT for e in self._errors.values())

    def explain_silent(self, silent: dict[int, tuple[str, float]]) -> None:
        """``{rank: (worker, seconds without a heartbeat)}`` of this run's workers that
        stopped answering (``faults.silent_workers``), used by :meth:`failure_report`."""
        self._silent = dict(silent)

    def note_failure(self, rank: int | None, worker: str | None, cause: str) -> None:
        """Record which rank failed first and why, as ``summary["failure"]``."""
        self.summary_extra["failure"] = {"rank": rank, "worker": worker, "cause": cause}

    def can_restart(self) -> bool:
        """Whether a failure :meth:`poll` found may restart the run: a worker was lost
        (not only a rank's own exception), the run was not cancelled and
        ``config.max_restarts`` is not used up."""
        return (bool(self._lost) and not self._cancel_requested
                and self.restarts < self.config.max_restarts)

    def begin_restart(self, reason: str, drain_deadline: float) -> None:
        """Start restart number ``restarts + 1``: record ``reason``; :meth:`poll` says
        ``"restart"`` once the surviving rank tasks ended or ``drain_deadline`` passed."""
        self.restarts += 1
        self.restart_reasons.append(reason)
        self.summary_extra.update(restarts=self.restarts, restart_reasons=list(self.restart_reasons))
        self._restarting = True
        self._drain_deadline = drain_deadline

    def prepare_restart(self, resume_iteration: int | None) -> None:
        """Forget the last start (tasks, errors, lost workers); the rows from
        ``resume_iteration`` on (the checkpoint it continues from; None: from iteration 0)
        become provisional, as a resumed run's stored rows do (``RunHandle.preload_rows``):
        replaced as the next start recomputes them, so none is lost if it fails first.
        The handle is then queued again; its next start draws a new rendezvous key."""
        with self._lock:
            self.resume = resume_iteration is not None
            it = resume_iteration or 0
            self.summary_extra.setdefault("restart_iterations", []).append(it)
            rows, self._rows = self._rows, []
            self._reindex()
            self.preload_rows(rows, redo_from=it)
        self._futures, self._errors, self._lost, self._lost_causes = [], {}, {}, {}
        self._silent = {}
        self._first_error_at = None
        self._drain_deadline = None
        self._released = False
        self._restarting = False

    # --- run life: end -----------------------------------------------------------------
