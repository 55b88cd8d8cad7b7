"""A stored study read back from its results folder: ``Study.load(out, study_id)``.

Every run a study submits records the study's id in its summary (``study_id`` /
``study_ids``, :mod:`~gtopk_lab.orchestration.run_identity`), so the folder alone says
which runs were the study's points. :func:`stored_study` rebuilds them:

1. one pass over the run folders (:func:`~gtopk_lab.orchestration.reading.read_runs`, rows
   not read), keeping the runs whose summary lists ``study_id``;
2. each run's ``config.json`` back into a ``RunConfig`` (its run id aside) and its source:
   a :class:`~gtopk_lab.orchestration.study_grid.StudyPoint`, whose key is the one the study
   used; several runs of one point (a rerun): the completed one, else the newest;
3. a completed point's summary joins as stored; any other point (queued, running, crashed,
   cancelled, failed) becomes a :class:`StoredRunView`, a read-only handle that re-reads
   its folder (status at most every :data:`REREAD_S`, rows when asked), so a study still
   running in another client fills in as it goes;
4. the study's tags: those its summaries record for it; points ordered as ``expand_grid``
   orders them (baselines, then real, then simulated points, P ascending).

Cost: one listing of the folder plus one ``summary.json``/``config.json`` read per run;
rows are read per point when a table or figure asks for them. Client side only.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration.reading import read_run, read_runs
from gtopk_lab.orchestration.run_files import CRASHED, FINAL_STATUSES, DamagedRun
from gtopk_lab.orchestration.run_identity import check_study_id
from gtopk_lab.orchestration.study_grid import StudyPoint

__all__ = ["REREAD_S", "LoadedStudy", "StoredRunView", "stored_study"]

#: The fewest seconds between two reads of an unfinished stored run's summary.
REREAD_S = 1.0
#: A stored run in one of these has ended (a crashed one's client is gone).
_ENDED = tuple(FINAL_STATUSES) + (CRASHED,)


class StoredRunView:
    """What a :class:`~gtopk_lab.orchestration.study.Study` reads of a run handle, for a
    run that only its folder describes: ``run_id``, ``status``, ``queue_reason``,
    ``summary``, ``metrics``, ``done()``, ``wait()``; ``cancel()`` and ``subscribe()`` do
    nothing (the run is not this client's)."""

    def __init__(self, path: str | os.PathLike[str], summary: dict[str, Any] | None) -> None:
        self.path = Path(path)
        self.run_id = self.path.name
        self._summary = summary
        self._read_at = time.monotonic()
        self._lock = threading.Lock()

    def _current(self) -> dict[str, Any]:
        with self._lock:
            ended = (self._summary or {}).get("status") in _ENDED
            if not ended and time.monotonic() - self._read_at >= REREAD_S:
                try:
                    self._summary = read_run(self.path, metrics=False).summary
                except (DamagedRun, OSError):  # mid-write or moved: keep the last one read
                    pass
                self._read_at = time.monotonic()
            return dict(self._summary or {})

    @property
    def status(self) -> str:
        return str(self._current().get("status", "unknown"))

    @property
    def queue_reason(self) -> str | None:
        reason = self._current().get("queue_reason")
        return reason if isinstance(reason, str) else None

    @property
    def summary(self) -> dict[str, Any] | None:
        summary = self._current()
        return summary if summary.get("status") in _ENDED else None

    @property
    def metrics(self) -> pd.DataFrame:
        try:
            frame = read_run(self.path).metrics
        except (DamagedRun, OSError):
            return pd.DataFrame()
        return frame if frame is not None else pd.DataFrame()

    def done(self) -> bool:
        return self.status in _ENDED

    def wait(self, timeout_s: float | None = None) -> bool:
        """Poll the folder until the run ended; False if ``timeout_s`` passed first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.done():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(REREAD_S / 4)
        return True

    def cancel(self) -> None:
        """Nothing: the run belongs to the client that launched it."""

    def subscribe(self, callback: Callable[[Any], None], replay: bool = True) -> Callable[[], None]:
        """Nothing arrives live from a folder: no calls; returns a no-op unsubscribe."""
        return lambda: None

    def __repr__(self) -> str:
        return f"StoredRunView({self.run_id!r}, status={self.status!r})"


@dataclass
class LoadedStudy:
    """What :func:`stored_study` found: the points in order, the completed points' summaries,
    the other points' views, and the study's tags."""

    points: list[StudyPoint]
    stored: dict[str, dict[str, Any]]
    views: dict[str, StoredRunView]
    tags: tuple[str, ...]


def _in_study(summary: dict[str, Any] | None, study_id: str) -> bool:
    if not summary:
        return False
    ids = summary.get("study_ids")
    return summary.get("study_id") == study_id or (isinstance(ids, list) and study_id in ids)


def stored_study(out: str | os.PathLike[str], study_id: str) -> LoadedStudy:
    """Steps 1-4 of the module docstring; ``ValueError`` when no run under ``out`` is the
    study's."""
    check_study_id(study_id)
    chosen: dict[str, tuple[tuple[bool, str], StudyPoint, Any]] = {}
    tags: list[str] = []
    for run in read_runs(out, metrics=False):  # step 1
        summary = run.summary
        if not _in_study(summary, study_id) or run.config is None:
            continue
        fields = {k: v for k, v in run.config.items() if k not in ("config_hash", "run_id")}
        try:
            point = StudyPoint(RunConfig.from_dict(fields), run.source)  # step 2
        except (TypeError, ValueError):  # a config this version cannot read: not a point here
            continue
        rank = (run.status == "completed", str(summary.get("started_at") or summary.get("submitted_at") or ""))
        if point.key not in chosen or rank >= chosen[point.key][0]:
            chosen[point.key] = (rank, point, run)
        own = (summary.get("studies") or {}).get(study_id) or {}
        tags += [t for t in own.get("tags", []) if isinstance(t, str) and t not in tags]
    if not chosen:
        raise ValueError(f"study_id={study_id!r} is invalid: no run under {os.fspath(out)} belongs to it")
    stored: dict[str, dict[str, Any]] = {}
    views: dict[str, StoredRunView] = {}
    for key, (_, _, run) in chosen.items():  # step 3
        if run.status == "completed":
            stored[key] = {**run.summary, "skipped": True}
        else:
            views[key] = StoredRunView(run.path, run.summary)
    points = sorted((point for _, point, _ in chosen.values()), key=lambda pt: (  # step 4
        not pt.is_baseline, pt.source != "real", pt.config.workers))
    return LoadedStudy(points, stored, views, tuple(tags))
