"""Reading a results folder: one run (:func:`read_run`), damaged runs, and the listings.

The reading half of the results store (``gtopk_lab.orchestration.results`` documents the
folder layout and re-exports every public name here). How a folder is read:

1. **One run.** :func:`read_run` is the one reader of ``<out>/<run_id>/``. A file that
   exists but cannot be read (truncated, not JSON/parquet, unreadable), a summary without
   a known status or without ``config.json``, or a finished run without its
   ``metrics.parquet`` raises :class:`DamagedRun` naming the file. A run without a
   summary (killed before it wrote one) is not damaged: its status reads ``unknown``. A
   live run's rows are its ``metrics.parquet`` and the parts streamed since, and a queued
   or running run whose client's heartbeat stopped reads ``crashed``
   (:mod:`~gtopk_lab.orchestration.run_stream`).
2. **Many runs.** :func:`read_runs` reads every run folder (:func:`run_dirs`: not hidden,
   not ``*.damaged-*``) and skips each damaged one with one ``logging`` warning line
   ``skipping damaged run <path>: <file>: <reason>``; asked to, it first renames it to
   ``<run>.damaged-<UTC stamp>`` (:func:`move_aside`, nothing is deleted).
3. **Listings.** :func:`load_summaries`, :func:`load_metrics`, :func:`load_runs` turn the
   runs into frames; :func:`scan_points` maps point keys to completed (and interrupted) run ids in one
   pass, so a resumed study (``move_damaged=True``) skips what it already ran, continues
   what was interrupted and reruns damaged points; :func:`completed_runs` and
   :func:`interrupted_runs` are its halves.

Client side only (pandas/pyarrow); no torch, no Dask.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from gtopk_lab.atomic_io import short_reason as _short
from gtopk_lab.orchestration.run_files import (
    CONFIG_FILE,
    DAMAGED_MARK,
    FINAL_STATUSES,
    METRICS_FILE,
    STATUSES,
    SUMMARY_FILE,
    SUMMARY_KEYS,
    DamagedRun,
    CRASHED,
    config_hash,
    read_json,
    rows_to_frame,
)
from gtopk_lab.orchestration.run_stream import crash_note, merge_rows, read_heartbeat, read_parts

# The logger docs/training.md names for the damaged-run warnings (users filter on it), which
# predates this module's split out of results.py.
logger = logging.getLogger("gtopk_lab.orchestration.results")


@dataclass
class StoredRun:
    """One run folder as :func:`read_run` read it.

    ``summary`` is None when the writer never got to write one (an interrupted run);
    ``metrics`` is None when it was not asked for (``read_run(..., metrics=False)``).
    """

    path: Path
    config: dict[str, Any] | None
    summary: dict[str, Any] | None
    metrics: pd.DataFrame | None

    @property
    def status(self) -> str:
        """The summary's status; ``unknown`` for a run without a summary."""
        return str(self.summary["status"]) if self.summary is not None else "unknown"

    @property
    def crashed(self) -> bool:
        """Whether its client stopped without ending it (see :func:`read_run`)."""
        return self.status == CRASHED

    @property
    def source(self) -> str:
        """``"simulated"`` for a simulator run (on the cluster or in-process), else ``"real"``."""
        summary = self.summary or {}
        return "simulated" if summary.get("source") == "simulated" or summary.get("simulated") is True \
            else "real"

    @property
    def config_hash(self) -> str | None:
        """The stored config hash (summary first, then config.json, then recomputed)."""
        for data in (self.summary, self.config):
            if data and data.get("config_hash"):
                return str(data["config_hash"])
        if self.config:
            return config_hash(self.config)
        return None


def read_parquet(folder: Path, *, full: bool) -> pd.DataFrame | None:
    """``folder/metrics.parquet``: None when missing; with ``full=False`` only its footer is
    checked (an empty frame is returned); :class:`DamagedRun` when it cannot be read."""
    path = folder / METRICS_FILE
    if not path.exists():
        return None
    try:
        if full:
            return pd.read_parquet(path)
        import pyarrow.parquet as pq

        pq.read_metadata(path)
        return rows_to_frame([])
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError/... for a bad file
        # pyarrow names the whole path; the warning names the run already
        raise DamagedRun(folder, METRICS_FILE, _short(exc, path=path)) from exc


def read_run(path: str | os.PathLike[str], *, metrics: bool = True) -> StoredRun:
    """Read one run folder, or raise :class:`DamagedRun` naming the bad file.

    Damaged: ``config.json``, ``summary.json`` or ``heartbeat.json`` present but empty, not
    JSON or not an object; a summary without a known ``status``; a summary but no
    ``config.json`` (writers write it first); ``metrics.parquet`` or a part present but
    unreadable, or ``metrics.parquet`` missing from a finished run (its final summary is
    written after it). The rows are ``metrics.parquet`` overlaid by the parts a live (or
    crashed) run streamed (:func:`~gtopk_lab.orchestration.run_stream.merge_rows`). A
    queued or running run whose heartbeat is older than its timeout reads as ``crashed``
    (``stored_status`` keeps what the file says, ``error`` says why). With
    ``metrics=False`` the parquet files are only checked (footer) and
    ``StoredRun.metrics`` is None.
    """
    folder = Path(path)
    config = read_json(folder, CONFIG_FILE)
    summary = read_json(folder, SUMMARY_FILE)
    if summary is not None:
        if summary.get("status") not in STATUSES:
            raise DamagedRun(folder, SUMMARY_FILE, f"status={summary.get('status')!r} is not one of "
                                                   f"{', '.join(STATUSES)}")
        if config is None:
            raise DamagedRun(folder, CONFIG_FILE, "missing (summary.json is there)")
        if summary["status"] not in FINAL_STATUSES:
            note = crash_note(summary, read_heartbeat(folder))
            if note is not None:
                summary = {**summary, "status": CRASHED, "stored_status": summary["status"],
                           "error": note}
    # parts before metrics.parquet: a fold of the parts into it between the two reads then
    # loses nothing (the new metrics.parquet holds them)
    parts = read_parts(folder, full=metrics)
    frame = read_parquet(folder, full=metrics)
    if frame is None and summary is not None and summary["status"] in FINAL_STATUSES:
        raise DamagedRun(folder, METRICS_FILE, f"missing (summary.json says {summary['status']})")
    if metrics:
        frame = merge_rows([frame, *parts])
    return StoredRun(path=folder, config=config, summary=summary, metrics=frame if metrics else None)


def move_aside(path: str | os.PathLike[str]) -> Path:
    """Rename run folder (or file) ``path`` to ``<path>.damaged-<UTC stamp>`` (a free name);
    return it."""
    folder = Path(path)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = folder.with_name(f"{folder.name}{DAMAGED_MARK}{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = folder.with_name(f"{folder.name}{DAMAGED_MARK}{stamp}-{n}")
    os.rename(folder, target)
    return target


def _warn_damaged(exc: DamagedRun, moved_to: Path | None = None) -> None:
    tail = f"; moved it to {moved_to}" if moved_to is not None else ""
    logger.warning("skipping damaged run %s: %s: %s%s", exc.path, exc.file, exc.reason, tail)


# ------------------------------------------------------------------------------------------
def read_runs(out: str | os.PathLike[str], *, metrics: bool = True, move_damaged_runs: bool = False,
              run_ids: list[str] | None = None) -> list[StoredRun]:
    """Every readable run under ``out`` (sorted by name); each damaged one is skipped with
    one warning (and with ``move_damaged_runs`` renamed by :func:`move_aside`)."""
    runs: list[StoredRun] = []
    for path in run_dirs(out):
        if run_ids is not None and path.name not in run_ids:
            continue
        try:
            runs.append(read_run(path, metrics=metrics))
        except DamagedRun as exc:
            moved = None
            if move_damaged_runs:
                try:
                    moved = move_aside(path)
                except OSError as err:  # still skipped; say why it stayed
                    exc.reason += f" (could not move it aside: {_short(err)})"
            _warn_damaged(exc, moved)
    return runs


def run_dirs(out: str | os.PathLike[str]) -> list[Path]:
    """Run folders under ``out`` (those holding a config.json or summary.json), sorted by name.

    Hidden folders and ``*.damaged-*`` folders (moved aside by a resumed sweep) are not runs.
    """
    root = Path(out)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and DAMAGED_MARK not in p.name
                  and ((p / SUMMARY_FILE).exists() or (p / CONFIG_FILE).exists()))


def _summary_record(run: StoredRun) -> dict[str, Any]:
    summary = dict(run.summary) if run.summary is not None else None
    if summary is None:
        config = run.config or {}
        summary = {"run_id": run.path.name, "status": "unknown",
                   **{k: config.get(k) for k in ("method", "workers", "density", "epochs")},
                   "config_hash": config.get("config_hash")}
    summary.setdefault("run_id", run.path.name)
    breakdown = summary.get("time_breakdown_s")
    if isinstance(breakdown, dict):
        for phase, seconds in breakdown.items():
            summary[f"time_{phase}_s"] = seconds
    summary["path"] = str(run.path)
    return summary


def _summaries_frame(runs: list[StoredRun]) -> pd.DataFrame:
    records = [_summary_record(run) for run in runs]
    # the run identity (run_identity) too: a folder of older runs still lists by study
    columns = list(SUMMARY_KEYS) + ["config_hash", "study_id", "study_ids", "tags", "path"]
    frame = pd.DataFrame.from_records(records) if records else pd.DataFrame(columns=columns)
    for col in columns:
        if col not in frame.columns:
            frame[col] = None
    return frame


def _metrics_frame(runs: list[StoredRun]) -> pd.DataFrame:
    frames = []
    for run in runs:
        frame = run.metrics
        if frame is not None and len(frame):
            frame = frame.copy()
            frame["run_id"] = run.path.name
            frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=["run_id", "kind", "rank", "iteration", "epoch"])
    return pd.concat(frames, ignore_index=True, sort=False)


def load_summaries(out: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per run: summary keys (always all of SUMMARY_KEYS) plus flattened
    ``time_<phase>_s`` columns from ``time_breakdown_s`` and ``path``.

    Damaged runs are skipped with a warning (:func:`read_run`); metrics files are only
    checked, not read.
    """
    return _summaries_frame(read_runs(out, metrics=False))


def load_metrics(out: str | os.PathLike[str], run_ids: list[str] | None = None) -> pd.DataFrame:
    """All metric rows of the runs under ``out`` (or of ``run_ids``), with a ``run_id`` column.

    Damaged runs are skipped with a warning.
    """
    return _metrics_frame(read_runs(out, run_ids=run_ids))


def load_runs(out: str | os.PathLike[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(summaries, metrics)`` of every run stored under ``out`` (default: the results home,
    :func:`gtopk_lab.results_home.results_home`).

    ``summaries`` has one row per run (see :func:`load_summaries`); ``metrics`` holds
    every metric row of every run with a ``run_id`` column to join on. A missing
    ``out`` folder gives two empty frames. A damaged run (:func:`read_run`) is left out of
    both, with one warning line naming its folder and file.

    Example::

        summaries, metrics = load_runs(results_home("demo"))
        summaries[summaries.status == "completed"][["method", "workers", "samples_per_s_virtual"]]
    """
    if out is None:
        from gtopk_lab.results_home import results_home

        out = results_home()
    runs = read_runs(out)
    return _summaries_frame(runs), _metrics_frame(runs)


def point_key(digest: str, source: str = "real") -> str:
    """A point's identity in a results folder: its config hash, plus ``:simulated`` for a
    simulated run, so that a real and a simulated run of one config never stand in for
    each other when a sweep or study resumes."""
    return digest if source == "real" else f"{digest}:{source}"


#: Statuses of a run that stopped before its end without failing: a study continues it.
INTERRUPTED_STATUSES = ("crashed", "cancelled")


@dataclass(frozen=True)
class PointScan:
    """What one read of a results folder says about its study points (:func:`scan_points`):
    ``completed`` and ``interrupted`` map ``point_key(config_hash, source)`` to a run id."""

    completed: dict[str, str]
    interrupted: dict[str, str]


def scan_points(out: str | os.PathLike[str], move_damaged: bool = False) -> PointScan:
    """One pass over the runs under ``out`` (:func:`read_runs`, once): the completed run of
    each point, and the newest interrupted run (:data:`INTERRUPTED_STATUSES`: its client
    died, or it was cancelled) of each point. What a study reads when it starts, whatever its
    number of points. Damaged runs are neither (their metrics are read in full to be sure);
    with ``move_damaged`` (a resuming study) each is moved aside to ``<run>.damaged-<stamp>``
    so that its point runs again into a fresh folder."""
    done: dict[str, str] = {}
    found: dict[str, tuple[str, str]] = {}
    for run in read_runs(out, move_damaged_runs=move_damaged):
        digest = run.config_hash
        if not digest:
            continue
        key = point_key(digest, run.source)
        if run.status == "completed":
            done[key] = run.path.name
        elif run.status in INTERRUPTED_STATUSES:
            summary = run.summary or {}
            stamp = str(summary.get("started_at") or summary.get("submitted_at") or "")
            if key not in found or stamp >= found[key][0]:
                found[key] = (stamp, run.path.name)
    return PointScan(done, {key: run_id for key, (_, run_id) in found.items()})


def interrupted_runs(out: str | os.PathLike[str]) -> dict[str, str]:
    """``{point_key(config_hash, source): run_id}`` of the runs under ``out`` that were
    interrupted (:data:`INTERRUPTED_STATUSES`); the newest run per point when there are
    several (:func:`scan_points`). A resumed study continues each one
    (``Lab.submit(resume=True)``: from its last checkpoint, keeping its rows) instead of
    starting its point again in a new folder."""
    return scan_points(out).interrupted


def completed_runs(out: str | os.PathLike[str], move_damaged: bool = False) -> dict[str, str]:
    """``{point_key(config_hash, source): run_id}`` of the completed runs under ``out`` (for
    resumable sweeps and studies; a real run's key is its config hash; :func:`scan_points`).

    Damaged runs are not completed (their metrics are read in full to be sure); with
    ``move_damaged`` (a resuming sweep) each is moved aside to ``<run>.damaged-<stamp>``
    so that its point runs again into a fresh folder.
    """
    return scan_points(out, move_damaged).completed
