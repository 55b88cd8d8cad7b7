"""``RunHandle``: one submitted run as the client sees it, from queued to ended.

Client side. The user reads a handle (``status``, ``metrics``, ``result()``), subscribes
to its new rows and cancels it; the Lab's monitor (:mod:`gtopk_lab.orchestration.monitor`)
drives it through its life with the methods under "run life" (step 3 is
:class:`~gtopk_lab.orchestration.run_rows.RunRows`, steps 4 and 6 are
:class:`~gtopk_lab.orchestration.run_life.RunLife`, both mixed in), and is the only caller
of those:

1. **Queued.** Created by ``Lab.submit``; on a resume it is preloaded with the stored rows
   (:meth:`RunHandle.preload_rows`: those from its checkpoint's iteration on are
   *provisional*, replaced one by one as the resumed run recomputes them), and a progress
   bar may be attached.
2. **Started.** :meth:`RunHandle.mark_started` records its workers and draws the key of
   its rendezvous and cancel flag; :meth:`RunHandle.attach_futures` the P rank tasks.
3. **Live rows.** :meth:`RunHandle.on_event` (a ``subscribe_topic`` handler) stores each
   batch of rows once, keyed by (kind, rank, iteration); :meth:`RunHandle.deliver`, on the
   monitor thread, hands the new ones to the subscribers, and the Lab's journal
   (:mod:`~gtopk_lab.orchestration.journal`) takes them for the run folder
   (:meth:`RunHandle.take_unjournaled`, under :attr:`RunHandle.files_lock`).
4. **Watched.** Every monitor tick :meth:`RunHandle.poll` reads the rank tasks' states
   and says what the monitor must do next: fail the run (an error, settled for
   ``FAILURE_SETTLE_S`` so the earliest error is the one reported, or a lost worker;
   :meth:`RunHandle.failure_report` words it), complete it, end a cancel whose ranks did
   not stop in time, or release the workers of an ended run once its tasks drained.
5. **Ended.** :meth:`RunHandle.record_end` writes the run folder and the summary (once;
   a completed run drops the provisional rows it did not recompute);
   :meth:`RunHandle.mark_done` closes the progress bar and wakes ``wait``/``result``. A
   study's point that another client completed meanwhile ends as that run instead
   (:meth:`RunHandle.adopt`: its run id, rows and summary, ``skipped``).
6. **Restarted** (``RunConfig.max_restarts``, a lost worker only):
   :meth:`RunHandle.begin_restart` lets the surviving rank tasks drain (poll says
   ``"restart"`` once they did), :meth:`RunHandle.prepare_restart` drops the rows past the
   checkpoint the run continues from (summary: ``restarts``, ``restart_reasons``,
   ``restart_iterations``), and the handle goes back to the front of the queue;
   rows of an earlier start that arrive late are dropped by their rendezvous key.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import pandas as pd

from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration.results import config_hash, point_key, run_summary, utc_now, write_run
from gtopk_lab.orchestration.run_identity import RunLabels, labels_of, with_labels
# the failure/restart half of a run's life; names re-exported for importers of this module
from gtopk_lab.orchestration.run_life import (  # noqa: F401
    FAILURE_SETTLE_S, SETTLED as _SETTLED, RankError, RunLife, Step, rank_error,
)
# the rows half (stored once, delivered, journaled); names re-exported likewise
from gtopk_lab.orchestration.run_rows import RunRows, Subscriber, row_key, safe_call  # noqa: F401


class RunFailed(RuntimeError):
    """Raised by ``RunHandle.result(raise_on_failure=True)`` for a failed/cancelled run."""


class HandleOwner(Protocol):
    """What a handle needs from the Lab that made it (the Lab's monitor does the work)."""

    def _post(self, fn: Callable[[], None]) -> None: ...

    def _cancel(self, handle: RunHandle) -> None: ...


# ------------------------------------------------------------------------------------------
class RunHandle(RunRows, RunLife):
    """A submitted run: status, live metrics, subscribers, cancel and result.

    ``status`` goes ``queued -> running -> completed | failed | cancelled``.
    ``metrics`` is the DataFrame of rows received so far (all ranks; after completion,
    every row of every rank). Subscribers are called from the Lab's monitor thread
    with a DataFrame of the rows that are new since their previous call.
    """

    def __init__(self, lab: HandleOwner, config: RunConfig, timeout_s: float,
                 simulated: bool = False, skip_completed: bool = False, digest: str | None = None) -> None:
        self.lab = lab
        self.config = config
        # the config's hash, computed once per config object (``digest``: the submitter's)
        self._hashed: tuple[RunConfig, str] | None = (config, digest) if digest else None
        #: P virtual ranks in one Dask task (``worker.sim_task.run_simulated``) on one worker,
        #: instead of P rank tasks on P workers
        self.simulated = bool(simulated)
        self.run_id: str = str(config.run_id)
        #: A study's point (``Lab.submit(skip_completed=True)``): not run while another client
        #: runs the same point into this results folder, and ended as that run if it completed.
        self.skip_completed = bool(skip_completed)
        self.timeout_s = float(timeout_s)
        self.status: str = "queued"
        self.error: str | None = None
        self.summary: dict[str, Any] | None = None
        self.workers: list[str] = []
        self.device: str = "cpu"
        #: Continue from ``<out>/<run_id>/checkpoints`` (set by ``Lab.submit(resume=True)``
        #: when a checkpoint is there).
        self.resume = False
        self.submitted_at = utc_now()
        self.started_at: str | None = None
        self.finished_at: str | None = None
        self._lock = threading.RLock()
        self._done = threading.Event()
        self._rows: list[dict[str, Any]] = []
        self._frame_cache: pd.DataFrame | None = None
        self._undelivered: list[dict[str, Any]] = []
        #: rows not yet written to the run folder (the journal's), and the lock every write
        #: of the folder holds (journal flushes and the run's end)
        self._unjournaled: list[dict[str, Any]] = []
        self.files_lock = threading.Lock()
        #: (kind, rank, iteration) -> index in _rows; the keys of stored rows a resume redoes
        self._index: dict[tuple[Any, Any, Any], int] = {}
        self._provisional: set[tuple[Any, Any, Any]] = set()
        #: locks.Held of the run folder and of the study point (taken and freed by the monitor)
        self.run_lock: Any = None
        self.point_lock: Any = None
        self._subscribers: list[Subscriber] = []
        # run state, read and written by the Lab's monitor thread only
        self._futures: list[Any] = []
        self._key = ""
        self._errors: dict[int, RankError] = {}
        self._lost: dict[int, str] = {}
        self._first_error_at: float | None = None
        self._cancel_requested = False
        self._cancel_deadline: float | None = None
        self._drain_deadline: float | None = None
        self._released = False
        self._progress: Any = None
        #: rank -> (cause, detail) of lost workers (gtopk_lab.orchestration.faults)
        self._lost_causes: dict[int, tuple[str, str]] = {}
        #: rank -> (worker, seconds without a heartbeat) of peers that stopped answering
        self._silent: dict[int, tuple[str, float]] = {}
        #: Restarts so far, and why each was needed (RunConfig.max_restarts).
        self.restarts = 0
        self.restart_reasons: list[str] = []
        self._restarting = False
        #: Why a queued run waits (``"waiting for 2 of 2 workers: 2 held by other clients'
        #: runs"``); None once it started.
        self.queue_reason: str | None = None
        #: Added to the stored summary (failure details, restarts).
        self.summary_extra: dict[str, Any] = {}
        #: The labels it was submitted with (``Lab.submit(labels=...)``: its study, tags,
        #: varied fields) and the identity keys every summary of it carries
        #: (:mod:`~gtopk_lab.orchestration.run_identity`; beside the config, not in it).
        self.labels: RunLabels = RunLabels()
        self.identity: dict[str, Any] = labels_of(None)
        #: The labels of the other studies that follow this run (``Lab.share_point``).
        self.shared_labels: list[RunLabels] = []

    # --- public ------------------------------------------------------------------------
    @property
    def source(self) -> str:
        """``"real"`` (P Dask-launched ranks) or ``"simulated"`` (one simulator task)."""
        return "simulated" if self.simulated else "real"

    @property
    def source_fields(self) -> dict[str, Any]:
        """What every summary of the run says of its source (a queued one too, so a reader,
        ``Study.load``, finds its point before it ends)."""
        return {"source": self.source, "simulated": self.simulated}

    @property
    def config_hash(self) -> str:
        """``config_hash(self.config)``, computed once per config (its run id aside, which the
        hash leaves out, the handle's config does not change)."""
        if self._hashed is None or self._hashed[0] is not self.config:
            self._hashed = (self.config, config_hash(self.config))
        return self._hashed[1]

    @property
    def point_key(self) -> str:
        """The run's point in its results folder (config hash, plus the source when simulated)."""
        return point_key(self.config_hash, self.source)

    @property
    def workers_needed(self) -> int:
        """Dask workers the run holds while it runs: P, or 1 for a simulated run."""
        return 1 if self.simulated else self.config.workers

    def __repr__(self) -> str:
        return (f"RunHandle(run_id={self.run_id!r}, status={self.status!r}, "
                f"rows={len(self._rows)}, workers={self.workers})")

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the run ends; False if ``timeout_s`` passed first."""
        return self._done.wait(timeout_s)

    def result(self, timeout_s: float | None = None, raise_on_failure: bool = False
               ) -> tuple[pd.DataFrame, dict[str, Any]]:
        """``(metrics, summary)`` once the run has ended (any status).

        ``summary["status"]`` tells how it ended; with ``raise_on_failure=True`` a failed
        or cancelled run raises :class:`RunFailed` with the error instead.
        """
        if not self._done.wait(timeout_s):
            raise TimeoutError(f"run {self.run_id} still {self.status} after {timeout_s} s")
        assert self.summary is not None
        if raise_on_failure and self.status != "completed":
            raise RunFailed(f"run {self.run_id} {self.status}: {self.error}")
        return self.metrics, dict(self.summary)

    def cancel(self) -> None:
        """Cancel the run: a queued run ends at once; a running one stops at its ranks'
        next sink call (or is abandoned after ``timeout_s``)."""
        self.lab._cancel(self)

    # --- run life: tasks ---------------------------------------------------------------
    @property
    def rendezvous_key(self) -> str:
        """Key of this start's rendezvous variable and cancel flag ("" before the start)."""
        return self._key

    def mark_started(self, workers: list[str]) -> None:
        """The run got ``workers`` (rank r on ``workers[r]``): status ``running``, and a
        fresh rendezvous key, so a resumed run never meets its earlier start's ranks."""
        self.workers = list(workers)
        self._key = f"{self.run_id}.{secrets.token_hex(4)}"
        self.status = "running"
        self.started_at = utc_now()

    def attach_futures(self, futures: list[Any]) -> None:
        """The rank tasks, in rank order."""
        self._futures = list(futures)

    def task_keys(self) -> set[str]:
        """Dask keys of this run's rank tasks."""
        return {f.key for f in self._futures}

    def drop_futures(self) -> None:
        """Let Dask forget this start's rank tasks: the scheduler drops them and the workers
        the results they hold (every row of every rank) at once, not when the handle is
        garbage collected (a handle lives in reference cycles; the soak found 2 tasks a run)."""
        futures, self._futures = self._futures, []
        for future in futures:
            try:
                future.release()
            except Exception:  # a client that is closing
                pass

    def unfinished_futures(self) -> list[Any]:
        """Rank tasks that may still hold a worker."""
        return [f for f in self._futures if f.status not in _SETTLED]

    def lost_futures(self) -> list[Any]:
        """Rank tasks pinned to a worker that left the cluster."""
        return [self._futures[r] for r in self._lost]

    def rank_outputs(self, timeout_s: float) -> list[Any]:
        """Every rank task's return value (call once all are finished)."""
        return [f.result(timeout=timeout_s) for f in self._futures]

    @property
    def cancel_requested(self) -> bool:
        """Whether the run was asked to stop (it may still be winding down)."""
        return self._cancel_requested

    def request_cancel(self) -> bool:
        """Flag the run as cancelled (its ranks get ``timeout_s`` to stop); False when it
        already was."""
        if self._cancel_requested:
            return False
        self._cancel_requested = True
        self._cancel_deadline = time.monotonic() + self.timeout_s
        return True

    def drain_by(self, deadline: float) -> None:
        """Release the workers of this ended run at ``deadline`` (monotonic) at the latest,
        even if some rank tasks have not stopped."""
        self._drain_deadline = deadline

    def mark_released(self) -> bool:
        """Record that the workers were given back; False when they already were."""
        if self._released:
            return False
        self._released = True
        return True

    def record_end(self, out: str, status: str, error: str | None,
                   rank0_summary: dict[str, Any] | None = None, backend: str | None = None) -> bool:
        """Write the run folder ``<out>/<run_id>/`` and set status, error and summary;
        False (nothing written) when the run had already ended."""
        with self.files_lock, self._lock:
            if self.done() or self.status in ("completed", "failed", "cancelled"):
                return False
            if status == "completed" and self._provisional:  # stored rows it never redid
                self._rows = [r for r in self._rows if row_key(r) not in self._provisional]
                self._provisional = set()
                self._reindex()
            self.finished_at = utc_now()
            extra = {"submitted_at": self.submitted_at, "started_at": self.started_at,
                     "finished_at": self.finished_at, "dask_workers": self.workers,
                     "device": self.device, "source": self.source, "simulated": self.simulated,
                     **self.summary_extra}
            if backend:
                extra["backend"] = backend
            summary = run_summary(self.config, rank0_summary, status=status, error=error, extra=extra,
                                  identity=self.identity, digest=self.config_hash)
            try:
                write_run(out, self.config, self.metrics, summary, digest=self.config_hash)
            except Exception as exc:  # disk full etc.: still end the handle
                summary["error"] = (error or "") + f"\n(could not write the run folder: {exc!r})"
            self.status = status
            self.error = summary.get("error")
            self.summary = summary
        return True

    def add_labels(self, labels: RunLabels) -> bool:
        """Another study follows this run: its labels join every summary written from now on
        (:func:`~gtopk_lab.orchestration.run_identity.with_labels`). Returns whether the run
        had already ended (its final summary then lacks them: the caller records them)."""
        with self._lock:
            self.shared_labels.append(labels)
            self.identity = labels_of(with_labels(dict(self.identity), labels))
            return self.status in ("completed", "failed", "cancelled")

    def adopt(self, run_id: str, summary: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        """End this queued run as the completed run ``run_id`` that another client ran for the
        same point (its stored summary and rows; ``skipped`` as for a stored point). Call
        :meth:`mark_done` next."""
        with self.files_lock, self._lock:
            self.run_id = run_id
            digest = self.config_hash  # the run id is not hashed
            self.config = self.config.replace(run_id=run_id)
            self._hashed = (self.config, digest)
            self._rows, self._provisional, self._undelivered, self._unjournaled = list(rows), set(), [], []
            self._reindex()
            self.summary = {**summary, "skipped": True}
            self.error = None
            self.status = "completed"
            self.queue_reason = None

    def mark_done(self) -> None:
        """Close the progress bar and wake every ``wait``/``result``."""
        if self._progress is not None:
            self._progress.close(self.status)
        self._done.set()
