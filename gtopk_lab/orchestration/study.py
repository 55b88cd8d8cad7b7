"""``Study``: a grid of runs (methods x P x network x density x seeds) that runs on the cluster
and whose scaling efficiency fills in while it runs.

``lab.study(methods=["dense", "topk", "gtopk"], workers=[1, 2, 4, 8, 16], seeds=3)`` returns
a :class:`Study` at once (:mod:`~gtopk_lab.orchestration.study_grid` expands the grid):

1. **Resume.** Points whose run already completed in the Lab's results folder (same config
   hash and source) are not run again; their stored summaries join the study. A damaged
   run folder is moved aside and its point runs again. Another client's study in the same
   folder runs each point at most once between them: a point it runs waits, and one it
   completed meanwhile joins as that run (``Lab.submit(skip_completed=True)``, the point
   locks of :mod:`~gtopk_lab.orchestration.locks`). A point whose newest run there was
   cancelled or crashed (its client died) continues that run (``Lab.submit(resume=True)``:
   from its last checkpoint if it has one, keeping its rows) under its run id.
2. **Launch.** Every other point is submitted at once, baselines (dense P = 1) first: real
   points as P Dask-launched ranks, simulated points as one simulator task each on a free
   worker (``Lab.submit(simulate=True)``): the Lab's FIFO queue places them as workers
   free up, several simulations at a time across the cluster, never in the client.
3. **Live.** Rows stream into each run's handle; :meth:`Study.points` turns every point
   into one row: a finished run's summary (``final``), or a running run's steady-state
   throughput estimated from its rows after warm-up (``final: False``), or nothing yet.
   Subscribers (:meth:`Study.subscribe`, e.g. ``plotting.live_study.live_scaling``) are
   called from a watcher thread at most every ``refresh_s`` while anything changed.
4. **Tables.** :meth:`efficiency` (mean +- std over seeds, provisional flags),
   :meth:`predicted`, :meth:`check` (measured vs alpha-beta prediction) from
   :mod:`gtopk_lab.analysis.study_tables`.
5. **Identity.** A study has a ``study_id`` (given, or ``study-<UTC time>-<hex>``) and
   ``tags``; every run it submits carries them in its summary with the point's values of
   the study's varied fields (``Lab.submit(labels=...)``), and a stored point it reuses
   gets them added (:mod:`~gtopk_lab.orchestration.run_identity`), so each study lists it.
6. **Shared points.** A point another study of the same Lab runs now (queued or running,
   same point key) is not submitted again: this study follows that run's handle
   (``Lab.share_point``; its summary records both studies) and leaves it running when it
   is cancelled itself (:attr:`Study.shared`).
7. **End.** :meth:`wait` blocks (Ctrl-C / a notebook interrupt returns control without
   cancelling, and says so), :meth:`cancel` cancels every unfinished run it launched.
8. **Reload.** :meth:`Study.load` reads a stored study back from the folder (finished or
   not, :mod:`~gtopk_lab.orchestration.study_load`): the same tables and figures, nothing run.

Step 1 reads the results folder once for the whole grid
(:func:`~gtopk_lab.orchestration.reading.scan_points`), not once per point.

Cost: one handle per point on the client; a refresh is O(rows received since the last one)
for the estimates plus O(points) for the tables.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from gtopk_lab.analysis.study_tables import (aggregate_seeds, fidelity_check, point_efficiency,
                                             predicted_efficiency)
from gtopk_lab.network.model import format_bandwidth, network_model
from gtopk_lab.orchestration import results as _results
from gtopk_lab.orchestration.run_identity import (
    RunLabels, check_study_id, check_tags, new_study_id, point_varied, record_labels, varied_fields,
)
from gtopk_lab.orchestration.study_grid import StudyPoint
from gtopk_lab.orchestration.study_load import stored_study
from gtopk_lab.training.rows import steady_seconds_per_iteration, sync_block, warmup_iterations

__all__ = ["Study"]

#: Summary fields copied into a running point's provisional row.
_POINT_FIELDS = ("method", "workers", "density", "algorithm", "model", "dataset", "batch_size", "seed")


class Study:
    """A launched grid of runs (see the module docstring). Made by ``Lab.study``."""

    def __init__(self, lab: Any, points: list[StudyPoint], *, skip_completed: bool = True,
                 progress: bool | None = None, refresh_s: float = 1.0, study_id: str | None = None,
                 tags: str | Sequence[str] = ()) -> None:
        self._setup(lab.out, points, refresh_s, study_id, tags)
        self.lab = lab
        show = getattr(lab, "progress", False) if progress is None else progress
        # one read of the folder for every point (not one per point): what completed, and
        # what was interrupted (a cancelled run, or one whose client died: continued)
        scan = _results.scan_points(lab.out, move_damaged=True) if skip_completed else _results.PointScan({}, {})
        done, interrupted = scan.completed, scan.interrupted
        if show:
            from gtopk_lab.orchestration.progress import SweepProgress

            self._bar = SweepProgress(len(points), desc="study")
        for point in self.points_list:
            if point.key in done:
                store = _results.RunStore(lab.out, done[point.key])
                summary = record_labels(store.path, self.labels(point)) or store.read_summary() or {}
                summary["skipped"] = True
                self.stored[point.key] = summary
                if self._bar is not None:
                    self._bar.run_finished("completed")
        try:
            for point in self.points_list:
                if point.key in self.stored:
                    continue
                # a point another study of this Lab runs now: this study follows that run
                shared = lab.share_point(point.key, self.labels(point)) if skip_completed else None
                if shared is not None:
                    self.handles[point.key] = shared
                    self.shared.add(point.key)
                else:
                    # (a run this Lab still winds down, just cancelled, is not continued: a new run)
                    resumed = point.key in interrupted and not lab.run_active(interrupted[point.key])
                    config = point.config.replace(run_id=interrupted[point.key]) if resumed else point.config
                    self.handles[point.key] = lab.submit(config, simulate=point.simulated, progress=False,
                                                         skip_completed=skip_completed, labels=self.labels(point),
                                                         **({"resume": True} if resumed else {}))
                handle = self.handles[point.key]
                if hasattr(handle, "subscribe"):
                    handle.subscribe(lambda _rows: self._changed.set(), replay=False)
        except BaseException:
            self.cancel()  # nothing half-launched keeps running behind an error
            raise
        if self._bar is not None:
            self._start_watcher()

    def _setup(self, out: str, points: list[StudyPoint], refresh_s: float, study_id: str | None,
               tags: str | Sequence[str]) -> None:
        """The state every study has, launched or loaded (nothing submitted here)."""
        if not points:
            raise ValueError("points=[] is invalid: a study needs at least one point")
        if not (refresh_s > 0):
            raise ValueError(f"refresh_s={refresh_s!r} is invalid: expected seconds > 0")
        #: The study's name in its runs' summaries, its tags, and the fields its points vary.
        self.study_id = new_study_id() if study_id is None else check_study_id(study_id)
        self.tags = check_tags(tags)
        self.varied = varied_fields(points)
        self.lab: Any = None
        self.out = str(out)
        self.points_list = list(points)
        self.refresh_s = float(refresh_s)
        self._lock = threading.RLock()
        self._changed = threading.Event()
        self._subscribers: list[Callable[["Study"], None]] = []
        self._watcher: threading.Thread | None = None
        self._stopped = False
        self.handles: dict[str, Any] = {}
        #: Points whose run another study of the Lab launched: followed, never cancelled here.
        self.shared: set[str] = set()
        self.stored: dict[str, dict[str, Any]] = {}
        self._bar: Any = None
        self._counted: set[str] = set()

    @classmethod
    def load(cls, out: str | os.PathLike[str], study_id: str, *, refresh_s: float = 1.0) -> "Study":
        """The study ``study_id`` as its runs under ``out`` record it, finished or not
        (:mod:`~gtopk_lab.orchestration.study_load`): its completed points' summaries, and a
        read-only view of every other point's run, so :meth:`points`, :meth:`efficiency`,
        :meth:`metrics` and the figures read it as they read a launched study (a run still
        going in another client fills in; :meth:`cancel` leaves it alone). Nothing is
        submitted; ``ValueError`` when no run there is the study's."""
        found = stored_study(out, study_id)
        study = cls.__new__(cls)
        study._setup(os.fspath(out), found.points, refresh_s, study_id, found.tags)
        study.stored, study.handles = found.stored, dict(found.views)
        return study

    # --- state ---------------------------------------------------------------------------
    def __repr__(self) -> str:
        counts = self.status()["status"].value_counts().to_dict() if self.points_list else {}
        return f"Study({self.study_id!r}, points={len(self.points_list)}, {counts})"

    def labels(self, point: StudyPoint) -> RunLabels:
        """What this study records on ``point``'s run: its id, tags, the point's varied values."""
        return RunLabels(self.study_id, self.tags, point_varied(point, self.varied))

    def done(self) -> bool:
        return all(h.done() for h in self.handles.values())

    def status(self) -> pd.DataFrame:
        """One row per point: its fields, source, run id, status, rows received and, for a
        queued run, why it waits (``queue_reason``)."""
        rows = []
        for point in self.points_list:
            c = point.config
            handle = self.handles.get(point.key)
            if handle is None:
                summary = self.stored.get(point.key, {})
                run_id, status, received = summary.get("run_id"), "completed (stored)", None
                reason = None
            else:
                run_id, status = handle.run_id, handle.status
                reason = handle.queue_reason if status == "queued" else None
                received = len(handle.metrics) if hasattr(handle, "metrics") else None
            rows.append({"study_id": self.study_id, "method": c.method, "workers": c.workers, "density": c.density,
                         "algorithm": c.algorithm, "bandwidth": c.bandwidth, "latency": c.latency,
                         "seed": c.seed, "source": point.source, "run_id": run_id,
                         "status": status, "rows": received, "queue_reason": reason})
        return pd.DataFrame(rows)

    # --- results -------------------------------------------------------------------------
    def summaries(self) -> pd.DataFrame:
        """Final summaries of the finished (and stored) points, with ``seed`` and ``source``."""
        records = []
        for point in self.points_list:
            summary = self._final_summary(point)
            if summary is not None:
                records.append({**summary, "seed": point.config.seed, "source": point.source})
        return pd.DataFrame.from_records(records)

    def metrics(self) -> pd.DataFrame:
        """Every metric row received or stored, with ``run_id``, ``seed`` and ``source``."""
        frames = []
        for point in self.points_list:
            handle = self.handles.get(point.key)
            if handle is not None:
                frame, run_id = handle.metrics, handle.run_id
            else:
                run_id = self.stored[point.key].get("run_id")
                frame = _results.RunStore(self.out, run_id).read_metrics() if run_id else None
            if frame is not None and len(frame):
                frames.append(frame.assign(run_id=run_id, seed=point.config.seed, source=point.source))
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def points(self) -> pd.DataFrame:
        """One row per point with a throughput so far: final summaries, and running runs'
        steady-state estimates (``final=False``); ``status`` is "completed" for both so that
        a running baseline serves as a provisional one."""
        records = []
        for point in self.points_list:
            summary = self._final_summary(point)
            if summary is not None:
                if summary.get("status") == "completed":
                    records.append({**summary, "seed": point.config.seed, "source": point.source,
                                    "final": True})
                continue
            estimate = self._estimate(point)
            if estimate is not None:
                records.append(estimate)
        return pd.DataFrame.from_records(records)

    def efficiency(self, time: str = "virtual") -> pd.DataFrame:
        """Scaling efficiency per point, mean +- std over seeds (``n``), ``provisional``."""
        return aggregate_seeds(point_efficiency(self.points(), time), time)

    def predicted(self) -> pd.DataFrame:
        """The alpha-beta model's efficiency of every point, from this study's measured
        compute (its dense P = 1 runs) and selection times."""
        return predicted_efficiency(self.points())

    def check(self, tolerance: float = 0.10) -> pd.DataFrame:
        """Measured vs predicted per point, ``trusted`` within ``tolerance``; see
        :func:`~gtopk_lab.analysis.study_tables.fidelity_check`."""
        return fidelity_check(self.efficiency(), self.predicted(), tolerance)

    def check_lines(self, tolerance: float = 0.10) -> list[str]:
        """The check as lines a person reads under the table (empty when all is well)."""
        checked = self.check(tolerance)
        bad = checked[~checked["trusted"].fillna(False).astype(bool) & checked["predicted"].notna()]
        several_links = checked[["bandwidth_bps", "latency_s"]].drop_duplicates().shape[0] > 1

        def link(r: Any) -> str:
            if not several_links:
                return ""
            rate = "unthrottled" if r.bandwidth_bps == float("inf") else format_bandwidth(r.bandwidth_bps)
            return f", {rate}, {r.latency_s * 1e3:g} ms"

        lines = [f"check: {r.method} P={r.workers} ({r.source}{link(r)}) measured {r.efficiency_mean:.0%} "
                 f"vs predicted {r.predicted:.0%}: do not trust this point"
                 for r in bad.itertuples()]
        if not lines and len(checked):
            lines.append(f"check: every point within {tolerance:.0%} of the alpha-beta prediction")
        return lines

    # --- control -------------------------------------------------------------------------
    def wait(self, timeout_s: float | None = None, *, cancel_on_interrupt: bool = False) -> bool:
        """Block until every run ended; False if ``timeout_s`` passed first.

        An interrupt (Ctrl-C, a notebook's stop button) returns control with False and
        leaves the study running (a message says so), unless ``cancel_on_interrupt``: then
        it cancels every unfinished run, waits up to 10 s for them to stop, and re-raises.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            for handle in list(self.handles.values()):
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not handle.wait(remaining):
                    return False
                self._count(handle)
        except KeyboardInterrupt:
            if cancel_on_interrupt:
                self.cancel()
                for handle in self.handles.values():
                    handle.wait(10.0)
                raise
            print("study.wait() interrupted: the study keeps running on the cluster; "
                  "study.cancel() stops it", file=sys.stderr)
            return False
        if self._bar is not None:
            self._bar.close()
        return True

    def cancel(self) -> None:
        """Cancel every unfinished run the study launched (completed points stay; a point it
        shares with another study of the Lab, :attr:`shared`, keeps running for that one)."""
        for key, handle in list(self.handles.items()):
            if key not in self.shared and not handle.done():
                handle.cancel()

    def subscribe(self, callback: Callable[["Study"], None]) -> Callable[[], None]:
        """Call ``callback(study)`` from a watcher thread whenever rows arrived or a run
        ended, at most every ``refresh_s``, and once more after the last run ended.
        Returns a function that unsubscribes."""
        if not callable(callback):
            raise TypeError(f"callback={callback!r} is not callable")
        with self._lock:
            self._subscribers.append(callback)
        if self.done():
            callback(self)  # every run ended: nothing more will change; one call, now
        else:
            self._changed.set()
            self._start_watcher()

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    # --- internals -----------------------------------------------------------------------
    def _final_summary(self, point: StudyPoint) -> dict[str, Any] | None:
        if point.key in self.stored:
            return self.stored[point.key]
        handle = self.handles[point.key]
        return dict(handle.summary) if handle.done() and handle.summary is not None else None

    def _estimate(self, point: StudyPoint) -> dict[str, Any] | None:
        """A running run's provisional row: steady throughput from its rank-0 rows."""
        handle = self.handles.get(point.key)
        frame = handle.metrics if handle is not None and hasattr(handle, "metrics") else None
        if frame is None or not len(frame) or "kind" not in frame.columns:
            return None
        rows = frame[(frame["kind"] == "iter") & (frame["rank"] == 0)].sort_values("iteration")
        records = rows.to_dict("records")
        warmup = warmup_iterations(point.config, len(records))
        if len(records) - warmup < 3:  # not stable yet
            return None
        config = point.config
        last = records[-1]
        iterations_per_epoch = max(1, int(round((last["iteration"] + 1) / last["epoch"]))) \
            if last.get("epoch") else 1
        t_iter = steady_seconds_per_iteration(records, warmup, "virtual", iterations_per_epoch,
                                              block=sync_block(config))
        if not t_iter > 0:
            return None
        net = network_model(config.bandwidth, config.latency)
        return {**{f: getattr(config, f) for f in _POINT_FIELDS}, "run_id": handle.run_id,
                "status": "completed", "final": False, "source": point.source,
                "bandwidth_bps": None if net.unthrottled else net.bandwidth_bps,
                "latency_s": net.latency_s, "iterations": len(records),
                "samples_per_s_virtual": config.batch_size * config.workers / t_iter}

    def _count(self, handle: Any) -> None:
        if self._bar is not None and handle.run_id not in self._counted:
            self._counted.add(handle.run_id)
            self._bar.run_finished(handle.status)

    def _start_watcher(self) -> None:
        with self._lock:
            if self._watcher is not None:
                return
            self._watcher = threading.Thread(target=self._watch, name="gtopk-lab-study", daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        finished_seen = -1
        while not self._stopped:
            self._changed.wait(self.refresh_s)
            ended = sum(h.done() for h in self.handles.values())
            if not self._changed.is_set() and ended == finished_seen:
                continue
            self._changed.clear()
            finished_seen = ended
            for handle in self.handles.values():
                if handle.done():
                    self._count(handle)
            with self._lock:
                callbacks = list(self._subscribers)
            for callback in callbacks:
                try:
                    callback(self)
                except Exception as exc:  # a broken figure must not stop the study
                    print(f"study subscriber {callback!r} failed: {type(exc).__name__}: {exc}",
                          file=sys.stderr)
            if ended == len(self.handles):
                if self._bar is not None:
                    self._bar.close()
                break
