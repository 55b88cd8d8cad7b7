"""Steps 5 and 6 of the Lab's monitor (:mod:`~gtopk_lab.orchestration.monitor`): giving a
run's workers back, and restarting a run that lost a worker.

:class:`WorkerRelease` is the part of :class:`~gtopk_lab.orchestration.monitor.RunMonitor`
that ends a start of a run, mixed into it (it uses the monitor's lock, queue, reservation
table, client and wake event):

1. **Release** (``_release``): once a run's rank tasks drained, cancel what is unfinished,
   free its workers here and on the scheduler (``reservations.release``), delete its
   rendezvous variable and, when the run ended, its metrics topic (the soak found both
   kept forever otherwise), and wake the dispatcher.
2. **Restart** (``_begin_restart`` -> ``_restart``): cancel the lost rank tasks, let the
   survivors drain, give the workers back keeping the run's place in the scheduler's
   queue, drop rows past the newest complete checkpoint and queue the run first again;
   ``_expire_restarts`` fails a restart that waited ``timeout_s`` in a cluster with too
   few eligible workers.

Cost: O(P) scheduler calls per release; nothing per iteration.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gtopk_lab.orchestration import faults as _faults
from gtopk_lab.orchestration import reservations as _reservations
from gtopk_lab.orchestration import results as _results
from gtopk_lab.orchestration.cluster import eligible_workers, worker_info
from gtopk_lab.orchestration.handle import RunHandle
from gtopk_lab.worker.rank_task import rendezvous_name, topic_for

__all__ = ["WorkerRelease"]

logger = logging.getLogger("gtopk_lab.orchestration.lab")


class WorkerRelease:
    """Release and restart of a run's start; mixed into ``RunMonitor`` (see the module)."""

    client: Any
    out: Any
    _lock: Any
    _wake: Any
    _pending: list[RunHandle]
    _active: list[RunHandle]
    _reserved: dict[str, str]
    _restart_deadlines: dict[str, float]

    finish: Any  # RunMonitor.finish: write the run folder and mark the handle done

    def _begin_restart(self, handle: RunHandle) -> None:
        """A worker of ``handle`` was lost and it may restart: cancel the lost rank tasks
        and let the survivors drain (``poll`` then says "restart")."""
        _, reason = handle.failure_report()
        handle.summary_extra.pop("failure", None)  # not failed (yet)
        logger.warning("gtopk-lab: run %s restarts (%d of %d): %s", handle.run_id,
                       handle.restarts + 1, handle.config.max_restarts, reason.splitlines()[0])
        lost_futures = handle.lost_futures()
        if lost_futures:
            self.client.cancel(lost_futures)
        handle.begin_restart(reason.splitlines()[0], time.monotonic() + handle.timeout_s + 5.0)

    def _restart(self, handle: RunHandle) -> None:
        """The last start of ``handle`` drained: give its workers back and queue it again
        (first), from its newest complete checkpoint."""
        try:
            latest = _faults.restart_point(_results.checkpoint_folder(self.out, handle.run_id), handle.config)
        except (ValueError, OSError) as exc:  # a damaged checkpoint: fail, write nothing over it
            with self._lock:
                self._give_back(handle)
                handle.drop_futures()
            self._forget_rendezvous(handle)
            handle.note_failure(None, None, _faults.WORKER_LEFT)
            self.finish(handle, "failed", f"could not restart after {handle.restart_reasons[-1]}: {exc}")
            return
        with self._lock:
            self._give_back(handle, keep_place=True)
            handle.drop_futures()
            handle.prepare_restart(latest["iteration"] if latest else None)
            self._pending.insert(0, handle)
            self._restart_deadlines[handle.run_id] = time.monotonic() + handle.timeout_s
        self._forget_rendezvous(handle, run_ended=False)  # the old start's
        self._wake.set()

    def _expire_restarts(self) -> None:
        """Fail restarted runs that waited ``timeout_s`` in a cluster with fewer eligible
        workers than they need (a run that only waits for busy workers keeps waiting)."""
        now = time.monotonic()
        with self._lock:
            waiting = [h for h in self._pending if h.run_id in self._restart_deadlines]
        if not waiting:
            return
        workers = worker_info(self.client)
        for handle in waiting:
            if now < self._restart_deadlines[handle.run_id]:
                continue
            placed = handle.config.replace(workers=1) if handle.simulated else handle.config
            eligible = len(eligible_workers(placed, workers))
            if eligible >= handle.workers_needed:
                continue
            with self._lock:
                if handle not in self._pending:
                    continue
                self._pending.remove(handle)
                self._restart_deadlines.pop(handle.run_id, None)
            handle.note_failure(None, None, _faults.WORKER_LEFT)
            self.finish(handle, "failed", (
                f"could not restart after {handle.restart_reasons[-1]}: the cluster has {eligible} "
                f"eligible worker(s) and the run needs {handle.workers_needed}; waited "
                f"{handle.timeout_s:.0f} s"))

    def _release(self, handle: RunHandle) -> None:
        with self._lock:
            if not handle.mark_released():
                return
            self._give_back(handle)
            handle.drop_futures()
        self._forget_rendezvous(handle)  # it would outlive the run on the scheduler
        self._wake.set()

    def _give_back(self, handle: RunHandle, keep_place: bool = False) -> None:
        """Cancel the start's unfinished rank tasks and free its workers (lock held);
        ``keep_place``: a restart, which keeps its place in the scheduler's queue."""
        pending = handle.unfinished_futures()
        if pending:
            self.client.cancel(pending)
        for addr in handle.workers:
            if self._reserved.get(addr) == handle.run_id:
                del self._reserved[addr]
        if handle in self._active:
            self._active.remove(handle)
        self._release_on_scheduler(handle, keep_place=keep_place)

    def _release_on_scheduler(self, handle: RunHandle, keep_place: bool = False) -> None:
        """Drop the run's reservation and waiting entry on the scheduler (best effort: a
        scheduler that is gone took its table with it, and a client that leaves has its
        entries dropped there); ``keep_place``: a restart keeps its place in the queue."""
        try:
            _reservations.release(self.client, handle.run_id, keep_place=keep_place)
        except Exception as exc:
            logger.debug("could not release %s on the scheduler: %s", handle.run_id, exc)

    def _forget_rendezvous(self, handle: RunHandle, run_ended: bool = True) -> None:
        """Delete the start's rendezvous variable on the scheduler and the event topics it
        would keep for good: the Variable's and, once the run ended, the run's metrics
        topic (best effort; the soak found both, one a run)."""
        try:
            _reservations.forget(self.client, variables=[rendezvous_name(handle.rendezvous_key)],
                                 topics=[topic_for(handle.run_id)] if run_ended else [])
        except Exception as exc:
            logger.debug("could not forget the rendezvous of %s: %s", handle.run_id, exc)

    def _unsubscribe(self, handle: RunHandle) -> None:
        """Stop the run's metrics events; Dask's ``unsubscribe_topic`` leaves the handler
        (and so the handle with every row) in the client's table: drop it too."""
        topic = topic_for(handle.run_id)
        try:
            self.client.unsubscribe_topic(topic)
        except Exception:
            pass
        getattr(self.client, "_event_handlers", {}).pop(topic, None)
