"""The files of a run folder: names, ids and hashes, atomic JSON/parquet writes, row frames.

The lowest layer of the results store (``gtopk_lab.orchestration.results`` documents the
layout and re-exports every name here). Both the writers (``results.RunStore``,
``results.write_run``) and the readers (``gtopk_lab.orchestration.reading``) build on it:

1. **Layout**: the file names of ``<out>/<run_id>/``, the statuses a summary may carry
   (and the two only a reader shows: ``crashed``, ``unknown``), the contract keys of a run
   summary and the checkpoint sub-folder; :class:`DamagedRun` and :func:`read_json`, the
   checked read of a run's JSON file.
2. **Identity**: :func:`config_hash` (a config without its run id, so a resumed sweep
   recognises a point it already ran), :func:`new_run_id`, :func:`utc_now`.
3. **Atomic writes**: JSON (NaN/inf as null) and parquet go to a temporary name and are
   moved into place with ``os.replace`` (:mod:`gtopk_lab.atomic_io`).
4. **Metric rows**: :func:`rows_to_frame` (the one frame order, by kind, rank, iteration)
   and :func:`rows_on_resume` / :func:`rows_before` / :func:`rows_kept_on_resume` (the rows
   a resumed run has, and those it keeps as they are).

Client side only (pandas/pyarrow); no torch, no Dask.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

import pandas as pd

from gtopk_lab.jsonsafe import json_safe as _jsonable  # the one sanitiser
from gtopk_lab.atomic_io import DamagedFile, atomic_path, atomic_write_bytes, read_json_file
from gtopk_lab.config import RunConfig, hashed_fields
from gtopk_lab.network.model import portable_bandwidth

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.parquet"
SUMMARY_FILE = "summary.json"
STATUSES: tuple[str, ...] = ("queued", "running", "completed", "failed", "cancelled")
#: Statuses of the final summary.json, written after every other file of the run.
FINAL_STATUSES: tuple[str, ...] = ("completed", "failed", "cancelled")
#: ``<run>.damaged-<stamp>``: where a resumed sweep moves a damaged run; never listed.
DAMAGED_MARK = ".damaged-"
CHECKPOINT_DIR = "checkpoints"
#: A live run's metric rows, appended while it runs (``run_stream``), and its client's heartbeat.
PARTS_DIR = "parts"
HEARTBEAT_FILE = "heartbeat.json"
#: The run folder's lock file (``locks``): held by the client that writes the folder.
LOCK_FILE = ".lock"
#: What a reader shows for a queued/running run whose client's heartbeat stopped.
CRASHED = "crashed"
#: Every status a listing may show: the stored ones, ``crashed`` and ``unknown`` (no summary).
LISTED_STATUSES: tuple[str, ...] = STATUSES + (CRASHED, "unknown")

#: Summary keys of docs/architecture.md, in order; load_runs() always has these columns.
SUMMARY_KEYS: tuple[str, ...] = (
    "run_id", "method", "workers", "density", "k", "numel", "bandwidth_bps", "latency_s",
    "epochs", "iterations", "final_train_loss", "final_test_accuracy", "wall_time_s",
    "virtual_time_s", "samples_per_s_wall", "samples_per_s_virtual",
    "bytes_sent_per_rank_per_iter", "time_breakdown_s", "status", "error",
)


# ------------------------------------------------------------------------------------------
class DamagedRun(ValueError):
    """A run folder with a file that exists but cannot be read (or a finished run missing
    its metrics). ``path`` is the run folder, ``file`` the file's name, ``reason`` short."""

    def __init__(self, path: str | os.PathLike[str], file: str, reason: str) -> None:
        self.path, self.file, self.reason = Path(path), file, reason
        super().__init__(f"{self.path}: {file}: {reason}")


def read_json(folder: Path, name: str) -> dict[str, Any] | None:
    """``folder/name`` as a JSON object; None when missing; :class:`DamagedRun` otherwise."""
    try:
        return read_json_file(Path(folder) / name)
    except DamagedFile as exc:
        raise DamagedRun(folder, name, exc.reason) from exc


# ------------------------------------------------------------------------------------------
# ids and hashes
def config_hash(config: RunConfig | dict[str, Any]) -> str:
    """SHA-256 (first 16 hex digits) of the canonical JSON of a config without its run_id.

    Two configs that differ only in ``run_id``, in the failure policy
    (``config.POLICY_FIELDS``: ``max_restarts``, ``scheduler_timeout_s``) or in ``preset``
    (``config.DERIVED_FIELDS``: the fields it set are hashed) hash equal; fields added later
    (``config.LATER_FIELDS``) are hashed only away from their earlier value, so stored runs
    keep their hash (:func:`gtopk_lab.config.hashed_fields`); any other field changes it. A calibration-file ``bandwidth`` hashes as the constants in it
    (the form the Lab stores, :func:`gtopk_lab.network.model.portable_bandwidth`).
    """
    data = config.to_dict() if isinstance(config, RunConfig) else dict(config)
    if isinstance(data.get("bandwidth"), str):
        try:
            data["bandwidth"] = portable_bandwidth(data["bandwidth"])
        except ValueError:  # unreadable file: hash the path; submitting will say what is wrong
            pass
    text = json.dumps(_jsonable(hashed_fields(data)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def new_run_id(config: RunConfig, digest: str | None = None) -> str:
    """A fresh, sortable, readable run id: ``<UTC time>-<method>-p<P>-<hash8>-<rand4>``
    (``digest``: the config's hash when the caller has it)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{config.method}-p{config.workers}-{(digest or config_hash(config))[:8]}-{secrets.token_hex(2)}"


def utc_now() -> str:
    """ISO-8601 UTC timestamp with seconds."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------------------------------
# atomic writes
def write_json_atomic(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON via temp file + ``os.replace``."""
    atomic_write_bytes(Path(path), (json.dumps(_jsonable(data), indent=2, sort_keys=False) + "\n").encode())


def write_parquet_atomic(path: str | os.PathLike[str], frame: pd.DataFrame) -> None:
    """Write ``frame`` as parquet via temp file + ``os.replace``."""
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)


# ------------------------------------------------------------------------------------------
# metric rows
def rows_to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Metric rows -> DataFrame sorted by (kind, rank, iteration); empty rows -> empty frame."""
    if not rows:
        return pd.DataFrame(columns=["kind", "rank", "iteration", "epoch"])
    frame = pd.DataFrame.from_records(rows)
    keys = [c for c in ("kind", "rank", "iteration") if c in frame.columns]
    if keys:
        frame = frame.sort_values(keys, kind="stable").reset_index(drop=True)
    return frame


def checkpoint_folder(out: str | os.PathLike[str], run_id: str) -> str:
    """Absolute ``<out>/<run_id>/checkpoints``: where the ranks of a run save epoch checkpoints."""
    return str((Path(out) / run_id / CHECKPOINT_DIR).resolve())


def rows_on_resume(metrics: pd.DataFrame, checkpoint_dir: str | os.PathLike[str] | None,
                   latest: dict[str, int] | None) -> pd.DataFrame:
    """Every row a run resumed from the checkpoint ``latest`` (None: from iteration 0) has:
    the stored ``metrics`` together with the rows its ranks saved beside that checkpoint
    (those since their previous one), where the store lacks them: rows that were still in
    flight when the run stopped (at most ``sink_every`` per rank) come back this way.
    Stored rows win where both have one (same kind, rank and iteration)."""
    from gtopk_lab.training.checkpoint import load_checkpoint_rows

    saved = load_checkpoint_rows(checkpoint_dir, latest)
    if saved:
        have: set[tuple[Any, Any, Any]] = set()
        if not metrics.empty and {"kind", "rank", "iteration"} <= set(metrics.columns):
            have = set(zip(metrics["kind"], metrics["rank"], metrics["iteration"]))
        missing = [r for r in saved if (r.get("kind"), r.get("rank"), r.get("iteration")) not in have]
        if missing:
            metrics = rows_to_frame(metrics.to_dict("records") + missing)
    return metrics


def rows_kept_on_resume(metrics: pd.DataFrame, checkpoint_dir: str | os.PathLike[str] | None,
                        latest: dict[str, int] | None) -> pd.DataFrame:
    """The rows a run resumed from the checkpoint ``latest`` keeps as they are:
    :func:`rows_before` its iteration of :func:`rows_on_resume`."""
    return rows_before(rows_on_resume(metrics, checkpoint_dir, latest), latest["iteration"] if latest else 0)


def rows_before(metrics: pd.DataFrame, iteration: int) -> pd.DataFrame:
    """Stored rows a run resumed at global ``iteration`` keeps.

    ``kind="iter"`` rows with ``iteration < iteration`` and ``kind="epoch"`` rows with
    ``iteration <= iteration`` (an epoch row carries the iteration that *ends* its
    epoch, so the checkpointed epoch's own row is kept; the resumed run never re-emits it).
    """
    if metrics.empty or "iteration" not in metrics.columns:
        return metrics.iloc[0:0]
    it = metrics["iteration"]
    is_epoch = metrics["kind"] == "epoch"
    keep = (~is_epoch & (it < iteration)) | (is_epoch & (it <= iteration))
    return metrics[keep].reset_index(drop=True)
