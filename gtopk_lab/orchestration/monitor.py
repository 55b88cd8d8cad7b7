"""The Lab's monitor: the run queue, worker reservations, rank tasks and the watch thread.

Client side. One :class:`RunMonitor` per ``Lab``; it places and watches every run the Lab
submitted, and is what makes a :class:`~gtopk_lab.orchestration.handle.RunHandle` move:

1. **Reservation.** In one table on the scheduler for every client
   (:mod:`~gtopk_lab.orchestration.reservations`): the queue's oldest run asks for P of
   its eligible workers (:func:`~gtopk_lab.orchestration.cluster.eligible_workers`) and
   gets all P atomically, or none and a reason; it then waits in this FIFO queue saying
   why (``RunHandle.queue_reason``, ``queue_reason`` in ``summary.json``). Runs never
   share a worker, whichever client started them, and each has its own rendezvous.
2. **Tasks.** ``client.submit(run_rank, ..., workers=[addr], allow_other_workers=False,
   pure=False, retries=0)``, one per rank; ``summary.json`` says ``running``. A simulated
   run (``Lab.submit(..., simulate=True)``) is one ``run_simulated`` task on one reserved
   worker, so it never shares a worker with a real rank.
3. **Watching.** A daemon thread wakes every ``poll_interval_s`` (or when woken), runs
   the callbacks posted to it, asks each running handle what comes next
   (``RunHandle.poll``), hands new rows to subscribers (so slow subscribers never block
   the client's event loop) and starts queued runs that now fit.
4. **Failures.** A rank's error fails the run (after the others' errors settled, so the
   earliest is reported); a reserved worker that leaves the cluster fails it naming the
   lost rank, and the task pinned to it is cancelled (it would otherwise wait forever);
   surviving ranks get ``timeout_s`` to notice. A cancelled run whose ranks do not stop
   within ``timeout_s`` is abandoned. Why a worker left is looked up in the scheduler's
   event log (``faults.lost_worker_cause``); a run with ``RunConfig.max_restarts`` left
   restarts instead (step 6).
   Losing the scheduler: while the client reconnects the monitor sends nothing; once it
   gave up, or after ``min(timeout_s, 30 s)``, every run fails with one line,
   ``scheduler tcp://... unreachable (...)`` (``faults.SchedulerWatch``).
5. **End.** The handle writes its run folder (``RunHandle.record_end``), new rows are
   delivered, the metrics topic unsubscribed and waiters woken; once its rank tasks
   drained (or their deadline passed) the workers are released and its rendezvous
   variable deleted. A completed run's tasks have all drained, so its workers are
   released before its waiters wake.
6. **Restart.** A run that lost a worker with restarts left waits until its surviving
   rank tasks ended, gives its workers back, drops its rows past its newest complete
   checkpoint and goes back to the front of the queue; it starts again from that
   checkpoint on free workers. If the cluster has fewer eligible workers than the run
   needs for ``timeout_s``, it fails saying so: a restart never waits forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gtopk_lab.orchestration import faults as _faults
from gtopk_lab.orchestration import reservations as _reservations
from gtopk_lab.orchestration import results as _results
from gtopk_lab.orchestration.cluster import eligible_workers, wants_cuda, worker_info
from gtopk_lab.orchestration.handle import RunHandle
from gtopk_lab.orchestration.journal import RunJournal
from gtopk_lab.orchestration.monitor_release import WorkerRelease
from gtopk_lab.orchestration.run_claims import FolderClaims
from gtopk_lab.worker.rank_task import mark_cancelled, run_rank, topic_for
from gtopk_lab.worker.sim_task import run_simulated

logger = logging.getLogger("gtopk_lab.orchestration.lab")  # the Lab's warnings, as before the split

#: Why a run behind the head of the queue waits (stable text: written once per run).
BEHIND_EARLIER_RUNS = "waiting for earlier runs in this Lab's queue"
#: Why a study's point waits while another client (or run) holds its point lock.
POINT_ELSEWHERE = "waiting for another client that runs the same point into this results folder"



class RunMonitor(WorkerRelease):
    """Queue, reservations and watch thread of one Lab (see the module docstring)."""

    def __init__(self, client: Any, out: str, *, timeout_s: float, poll_interval_s: float,
                 train_fn: Callable[..., Any] | None) -> None:
        self.client = client
        self.out = out
        self.timeout_s = timeout_s
        self.poll_interval_s = poll_interval_s
        self.train_fn = train_fn
        self._lock = threading.RLock()
        self._pending: list[RunHandle] = []
        self._active: list[RunHandle] = []
        #: this Lab's share of the scheduler's reservation table (worker -> run id)
        self._reserved: dict[str, str] = {}
        self._posted: list[Callable[[], None]] = []
        self._closed = False
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gtopk-lab-monitor", daemon=True)
        self._scheduler = _faults.SchedulerWatch(client, timeout_s=timeout_s)
        #: last worker_info entry of each reserved worker (its memory when it is lost)
        self._last_seen: dict[str, dict[str, Any]] = {}
        #: the newest heartbeat (scheduler time) of any worker in that snapshot
        self._newest_heartbeat: float | None = None
        #: monotonic deadline by which a restarted run must find enough eligible workers
        self._restart_deadlines: dict[str, float] = {}
        #: parts and heartbeats of this Lab's live runs (its own thread), and its folder claims
        self.journal = RunJournal(out)
        self.claims = FolderClaims(out, self.journal)

    # --- used by the Lab ---------------------------------------------------------------
    def start(self) -> None:
        _reservations.install(self.client)
        self._thread.start()
        self.journal.start()

    def admit(self, handle: RunHandle) -> None:
        """Before ``Lab.submit`` writes anything of ``handle``'s run: take its folder's lock
        (``ValueError`` naming the client that holds it) and write its first heartbeat."""
        self.claims.admit(handle)

    def abandon(self, handle: RunHandle) -> None:
        """Undo :meth:`admit` for a run ``Lab.submit`` did not queue after all."""
        self.claims.abandon(handle)

    @property
    def closed(self) -> bool:
        return self._closed

    def stop(self, join_timeout_s: float) -> None:
        """Stop the watch thread (queued and running runs are the Lab's to end first)."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=join_timeout_s)
        self.journal.stop(join_timeout_s)
        with self._lock:
            left = list(self._pending) + list(self._active)
        for handle in left:  # a client the Lab does not own outlives it: free its share now
            self._release_on_scheduler(handle)

    def handles(self) -> list[RunHandle]:
        """Queued, then running runs."""
        with self._lock:
            return list(self._pending) + list(self._active)

    def enqueue(self, handle: RunHandle) -> None:
        """Queue ``handle`` and start it at once if its workers are free."""
        with self._lock:
            self._pending.append(handle)
        self._dispatch()
        self._wake.set()

    def is_active(self, run_id: str) -> bool:
        """Whether a queued or running run has this run id."""
        with self._lock:
            return any(h.run_id == run_id for h in self._pending + self._active)

    def active_point(self, key: str) -> RunHandle | None:
        """The queued or running study point of this Lab with point key ``key`` (not one
        being cancelled), or None."""
        with self._lock:
            for handle in self._pending + self._active:
                if handle.skip_completed and handle.point_key == key and not handle.done() \
                        and not handle.cancel_requested:
                    return handle
        return None

    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the watch thread at its next tick."""
        with self._lock:
            self._posted.append(fn)
        self._wake.set()

    def cancel(self, handle: RunHandle) -> None:
        with self._lock:
            if handle.done():
                return
            if handle in self._pending:
                self._pending.remove(handle)
                self.finish(handle, "cancelled", "cancelled before it started")
                self._release_on_scheduler(handle)  # its waiting entry there
                try:
                    _reservations.forget(self.client, topics=[topic_for(handle.run_id)])
                except Exception:
                    pass
                return
            if not handle.request_cancel():
                return
        try:
            self.client.run(mark_cancelled, handle.rendezvous_key, workers=list(handle.workers),
                            on_error="ignore")
        except Exception as exc:  # the monitor still abandons the run at the deadline
            logger.warning("could not flag %s as cancelled on its workers: %s", handle.run_id, exc)
        self._wake.set()

    def finish(self, handle: RunHandle, status: str, error: str | None,
               rank0_summary: dict[str, Any] | None = None, backend: str | None = None,
               wake: bool = True) -> bool:
        """Write the run folder and mark the handle done (once; False: it had ended already);
        ``wake=False`` leaves waking its waiters (``handle.mark_done()``) to the caller."""
        if not handle.record_end(self.out, status, error, rank0_summary=rank0_summary, backend=backend):
            return False
        self.claims.let_go(handle)
        handle.deliver()
        self._unsubscribe(handle)
        if wake:
            handle.mark_done()
        return True

    # --- placing -----------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Start queued runs, oldest first, while the scheduler grants them workers
        (one reserve call each, see the module docstring, step 1). A study's point that
        another client holds is passed over (it waits, saying so); one that client
        completed meanwhile ends as that run (:meth:`_claim_point`)."""
        with self._lock:
            if not self._pending or self._closed:
                return
            workers = worker_info(self.client)
            refused = False
            for handle in list(self._pending):
                if refused:
                    self._note_waiting(handle, BEHIND_EARLIER_RUNS)
                    continue
                if handle.skip_completed and handle.point_lock is None and not self._claim_point(handle):
                    continue
                placed = handle.config.replace(workers=1) if handle.simulated else handle.config
                answer = _reservations.reserve(self.client, handle.run_id, handle.workers_needed,
                                               eligible_workers(placed, workers))
                chosen = answer.get("workers")
                if not chosen:
                    self._note_waiting(handle, _reservations.waiting_reason(answer))
                    refused = True
                    continue
                self._pending.remove(handle)
                handle.device = "cuda" if wants_cuda(placed, workers) else "cpu"
                self._start(handle, list(chosen))

    def _claim_point(self, handle: RunHandle) -> bool:
        """Take the point lock of a queued study point (lock held); False when it cannot run
        now: another client holds the point (it waits), or completed it (it ends as that run)."""
        claim = self.claims.claim_point(handle)
        if claim is True:
            return True
        if claim is False:
            self._note_waiting(handle, POINT_ELSEWHERE)
            return False
        self._pending.remove(handle)
        self._unsubscribe(handle)
        self.claims.end_as(handle, claim)
        handle.mark_done()
        return False

    def _note_waiting(self, handle: RunHandle, reason: str) -> None:
        """Say why ``handle`` waits: on the handle and in its ``summary.json`` (written only
        when the reason changed)."""
        if handle.queue_reason == reason:
            return
        handle.queue_reason = reason
        _results.RunStore(self.out, handle.run_id).write_summary(_results.run_summary(
            handle.config, None, status="queued", identity=handle.identity,
            extra={"submitted_at": handle.submitted_at, "queue_reason": reason, **handle.source_fields}, digest=handle.config_hash))

    def _start(self, handle: RunHandle, workers: list[str]) -> None:
        self._restart_deadlines.pop(handle.run_id, None)
        handle.queue_reason = None
        for addr in workers:
            self._reserved[addr] = handle.run_id
        handle.mark_started(workers)
        self._active.append(handle)
        _results.RunStore(self.out, handle.run_id).write_summary(_results.run_summary(
            handle.config, None, status="running", identity=handle.identity,
            extra={"submitted_at": handle.submitted_at, "started_at": handle.started_at, **handle.source_fields,
                   "dask_workers": handle.workers}, digest=handle.config_hash))
        config_dict = handle.config.to_dict()
        folder = _results.checkpoint_folder(self.out, handle.run_id)
        ckpt_kwargs = {"checkpoint_dir": folder if handle.config.checkpoint else None,
                       "resume_from": folder if handle.resume else None}
        resources = {"GPU": 1} if handle.device == "cuda" else None
        key = handle.rendezvous_key
        if handle.simulated:
            handle.attach_futures([self.client.submit(
                run_simulated, config_dict, key, **ckpt_kwargs, key=f"gtopk-sim-{key}",
                workers=workers, allow_other_workers=False, pure=False, retries=0,
                resources=resources)])
            return
        handle.attach_futures([
            self.client.submit(
                run_rank, config_dict, rank, handle.timeout_s, self.train_fn,
                rendezvous_key=key, device=handle.device, **ckpt_kwargs,
                key=f"gtopk-rank{rank}-{key}", workers=[addr], allow_other_workers=False,
                pure=False, retries=0, resources=resources,
            )
            for rank, addr in enumerate(workers)
        ])

    # --- watching ----------------------------------------------------------------------
    def _loop(self) -> None:
        last_ok = time.monotonic()
        while not self._closed:
            self._wake.wait(self.poll_interval_s)
            self._wake.clear()
            lost = self._scheduler.check()
            if lost is not None:  # the scheduler is gone: end every run with one line
                self._fail_all(lost)
                last_ok = time.monotonic()
                continue
            if not self._scheduler.connected:  # reconnecting: no requests until it is back
                continue
            try:
                self._tick()
                last_ok = time.monotonic()
            except Exception as exc:  # keep watching: a transient scheduler hiccup
                if self._closed:
                    break
                logger.warning("gtopk-lab monitor: %s: %s", type(exc).__name__, exc)
                if time.monotonic() - last_ok > self.timeout_s:
                    self._fail_all(f"no answer for {self.timeout_s:.0f} s: "
                                               f"{type(exc).__name__}: {exc}")
                    last_ok = time.monotonic()

    def _fail_all(self, detail: str) -> None:
        """The scheduler is gone: end every queued and running run as failed, each with
        the one line of ``faults.unreachable_message``."""
        with self._lock:
            handles = list(self._pending) + list(self._active)
            self._pending.clear()
            self._active.clear()
            self._reserved.clear()
        for handle in handles:
            handle.note_failure(None, None, _faults.SCHEDULER_UNREACHABLE)
            self.finish(handle, "failed", _faults.unreachable_message(
                self._scheduler.address, detail, handle.config, self.out))

    def _tick(self) -> None:
        with self._lock:
            posted, self._posted = self._posted, []
            active = list(self._active)
        for fn in posted:
            fn()
        if active:
            workers = worker_info(self.client)
            self._remember(workers)
            alive = set(workers)
            for handle in active:
                self._check(handle, alive)
        for handle in active:
            handle.deliver()
        self._expire_restarts()
        self._dispatch()

    def _check(self, handle: RunHandle, alive: set[str]) -> None:
        now = time.monotonic()
        step = handle.poll(alive, now)
        if step == "release":
            self._release(handle)
        elif step == "fail":
            self._fail(handle)
        elif step == "complete":
            self._complete(handle)
        elif step == "restart":
            self._restart(handle)
        elif step == "cancel-timeout":
            self.finish(handle, "cancelled", f"cancelled; ranks did not stop within {handle.timeout_s:.0f} s")
            handle.drain_by(now)
            self._release(handle)

    def _fail(self, handle: RunHandle) -> None:
        lost = handle.lost_ranks()
        if lost:  # say why each worker left (one event-log read each)
            threshold = _faults.silence_threshold_s(handle.timeout_s)
            handle.explain_lost({rank: _faults.lost_worker_cause(
                self.client, addr, self._last_seen.get(addr), silent_for_s=self._silence_s(addr),
                min_silence_s=threshold) for rank, addr in lost.items()})
        elif handle.timed_out():  # which peer stopped answering: the workers' heartbeats
            handle.explain_silent(_faults.silent_workers(
                handle.workers, self._last_seen, newest_s=self._newest_heartbeat,
                min_silence_s=_faults.silence_threshold_s(handle.timeout_s)))
        if handle.can_restart():
            self._begin_restart(handle)
            return
        status, error = handle.failure_report()
        self.finish(handle, status, error)
        # Tasks pinned to a lost worker would wait forever: cancel them now. Surviving
        # ranks are given timeout_s to notice (gloo usually notices at once).
        lost_futures = handle.lost_futures()
        if lost_futures:
            self.client.cancel(lost_futures)
        handle.drain_by(time.monotonic() + handle.timeout_s + 5.0)

    def _complete(self, handle: RunHandle) -> None:
        try:
            outputs = handle.rank_outputs(timeout_s=30)
        except Exception as exc:  # pragma: no cover - the futures just reported finished
            self.finish(handle, "failed", f"could not gather the ranks' results: {exc!r}")
            self._release(handle)
            return
        handle.add_rows([row for out in outputs for row in out.get("rows", [])])
        rank0 = next((o.get("summary") for o in outputs if o.get("rank") == 0), None)
        # Its waiters wake once its workers are back: a caller that waited on it and submits
        # again (here or from another client) finds them free, not still reserved. (Released
        # after finish: the metrics topic is unsubscribed before release forgets it, or the
        # scheduler's subscriber table would keep an entry per run.)
        ended = self.finish(handle, "completed", None, rank0_summary=rank0,
                            backend=outputs[0].get("backend") if outputs else None, wake=False)
        try:
            self._release(handle)
        finally:  # a waiter never outlives a failed release
            if ended:
                handle.mark_done()

    # --- faults: restarts and what lost workers looked like ---------------------------
    def _remember(self, workers: dict[str, dict[str, Any]]) -> None:
        """Keep the newest worker_info entry of every reserved worker (a lost one keeps
        its last entry: its memory then goes into the failure message)."""
        with self._lock:
            reserved = set(self._reserved)
        self._last_seen = {a: workers.get(a, self._last_seen.get(a, {})) for a in reserved}
        beats = [w.get("last_seen") for w in workers.values() if isinstance(w.get("last_seen"), (int, float))]
        self._newest_heartbeat = max(beats) if beats else None

    def _silence_s(self, address: str) -> float | None:
        """How much older the worker's last heartbeat is than the cluster's newest."""
        last = (self._last_seen.get(address) or {}).get("last_seen")
        if self._newest_heartbeat is None or not isinstance(last, (int, float)):
            return None
        return self._newest_heartbeat - float(last)
