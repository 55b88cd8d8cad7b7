"""Results store: one folder per run, written atomically.

Layout::

    <out>/<run_id>/config.json      RunConfig.to_dict() (+ "config_hash")
    <out>/<run_id>/metrics.parquet  every metric row of every rank (docs/architecture.md)
    <out>/<run_id>/summary.json     run summary (docs/architecture.md) + status, error,
                                    config_hash, started_at, finished_at, provenance

Every file is written to a temporary name in the same folder and moved into place
with ``os.replace``, so a reader never sees a half-written file, and a crash leaves
either the old or the new version. ``summary.json`` is written with
``status="running"`` when a run starts and rewritten when it ends.

A sweep is resumable: :func:`completed_runs` maps each completed run's
:func:`config_hash` (the config without its ``run_id``) to its run id, so the same
config is not run twice into one ``out`` folder.

Complete and damaged runs. Writers write ``config.json`` first and the final
``summary.json`` last (after ``metrics.parquet``), so a run is *finished* once its
summary has a final status (``completed``, ``failed`` or ``cancelled``) and *completed*
(skipped by a resumed sweep) only with ``status="completed"``. A process killed mid-run
leaves ``queued``/``running`` or no summary at all (listed as ``unknown``), never a
completed run with half its files. :func:`read_run` is the one reader of a run folder:
a file that exists but cannot be read (truncated, not JSON/parquet, unreadable), or a
finished run without its ``metrics.parquet``, raises :class:`DamagedRun`. The listings
(:func:`load_summaries`, :func:`load_metrics`, :func:`load_runs`,
:func:`completed_runs`) skip such a run with one ``logging`` warning line
``skipping damaged run <path>: <file>: <reason>``; a resuming sweep
(``completed_runs(out, move_damaged=True)``) also renames it to
``<run>.damaged-<UTC stamp>`` (nothing is deleted) and runs its point again. Folders
named ``*.damaged-*`` are not runs.

Client side only (pandas/pyarrow); no torch, no Dask.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from gtopk_lab.atomic_io import atomic_path, atomic_write_bytes
from gtopk_lab.config import RunConfig
from gtopk_lab.jsonsafe import json_safe as _jsonable  # the one sanitiser; old name kept for callers
from gtopk_lab.network.model import portable_bandwidth
from gtopk_lab.provenance import provenance

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.parquet"
SUMMARY_FILE = "summary.json"
STATUSES: tuple[str, ...] = ("queued", "running", "completed", "failed", "cancelled")
#: Statuses of the final summary.json, written after every other file of the run.
FINAL_STATUSES: tuple[str, ...] = ("completed", "failed", "cancelled")
#: ``<run>.damaged-<stamp>``: where a resumed sweep moves a damaged run; never listed.
DAMAGED_MARK = ".damaged-"

logger = logging.getLogger(__name__)

#: Summary keys of docs/architecture.md, in order; load_runs() always has these columns.
SUMMARY_KEYS: tuple[str, ...] = (
    "run_id", "method", "workers", "density", "k", "numel", "bandwidth_bps", "latency_s",
    "epochs", "iterations", "final_train_loss", "final_test_accuracy", "wall_time_s",
    "virtual_time_s", "samples_per_s_wall", "samples_per_s_virtual",
    "bytes_sent_per_rank_per_iter", "time_breakdown_s", "status", "error",
)


# ------------------------------------------------------------------------------------------
# ids and hashes
def config_hash(config: RunConfig | dict[str, Any]) -> str:
    """SHA-256 (first 16 hex digits) of the canonical JSON of a config without its run_id.

    Two configs that differ only in ``run_id`` hash equal; any other field changes it. A
    calibration-file ``bandwidth`` hashes as the constants in it (the form the Lab
    stores, :func:`gtopk_lab.network.model.portable_bandwidth`).
    """
    data = config.to_dict() if isinstance(config, RunConfig) else dict(config)
    if isinstance(data.get("bandwidth"), str):
        try:
            data["bandwidth"] = portable_bandwidth(data["bandwidth"])
        except ValueError:  # unreadable file: hash the path; submitting will say what is wrong
            pass
    data.pop("run_id", None)
    data.pop("config_hash", None)
    text = json.dumps(_jsonable(data), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def new_run_id(config: RunConfig) -> str:
    """A fresh, sortable, readable run id: ``<UTC time>-<method>-p<P>-<hash8>-<rand4>``."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{config.method}-p{config.workers}-{config_hash(config)[:8]}-{secrets.token_hex(2)}"


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


def rows_to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Metric rows -> DataFrame sorted by (kind, rank, iteration); empty rows -> empty frame."""
    if not rows:
        return pd.DataFrame(columns=["kind", "rank", "iteration", "epoch"])
    frame = pd.DataFrame.from_records(rows)
    keys = [c for c in ("kind", "rank", "iteration") if c in frame.columns]
    if keys:
        frame = frame.sort_values(keys, kind="stable").reset_index(drop=True)
    return frame


CHECKPOINT_DIR = "checkpoints"


def checkpoint_folder(out: str | os.PathLike[str], run_id: str) -> str:
    """Absolute ``<out>/<run_id>/checkpoints``: where the ranks of a run save epoch checkpoints."""
    return str((Path(out) / run_id / CHECKPOINT_DIR).resolve())


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


# ------------------------------------------------------------------------------------------
class RunStore:
    """The folder of one run: ``<out>/<run_id>/``."""

    def __init__(self, out: str | os.PathLike[str], run_id: str) -> None:
        if not run_id or "/" in run_id or run_id in (".", ".."):
            raise ValueError(f"run_id={run_id!r} is invalid: expected a non-empty name without '/'")
        self.out = Path(out)
        self.run_id = run_id
        self.path = self.out / run_id

    def write_config(self, config: RunConfig) -> None:
        """config.json: the full config plus its hash."""
        data = config.to_dict()
        data["config_hash"] = config_hash(config)
        write_json_atomic(self.path / CONFIG_FILE, data)

    def write_metrics(self, metrics: pd.DataFrame) -> None:
        write_parquet_atomic(self.path / METRICS_FILE, metrics)

    def write_summary(self, summary: dict[str, Any]) -> None:
        status = summary.get("status")
        if status not in STATUSES:
            raise ValueError(f"status={status!r} is invalid: expected one of {', '.join(STATUSES)}")
        write_json_atomic(self.path / SUMMARY_FILE, summary)

    def read_summary(self) -> dict[str, Any] | None:
        """summary.json, or None when it is missing or damaged."""
        try:
            return _read_json(self.path, SUMMARY_FILE)
        except DamagedRun:
            return None

    def read_config(self) -> dict[str, Any] | None:
        """config.json, or None when it is missing or damaged."""
        try:
            return _read_json(self.path, CONFIG_FILE)
        except DamagedRun:
            return None

    def read_metrics(self) -> pd.DataFrame:
        """metrics.parquet (an empty frame when missing); raises :class:`DamagedRun` when damaged."""
        frame = _read_parquet(self.path, full=True)
        return rows_to_frame([]) if frame is None else frame


def build_summary(config: RunConfig, rank0_summary: dict[str, Any] | None, *, status: str,
                  error: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run summary: rank 0's summary completed with every contract key.

    Keys missing from rank 0's summary (for example when the run failed before rank 0
    finished) are filled from the config where known, else None. Beyond the contract
    keys it records ``config_hash`` and the config's ``algorithm, bandwidth, latency,
    model, dataset, selector, residual_rule`` (so tables need not open config.json) and
    ``provenance`` (:func:`gtopk_lab.provenance.provenance`: versions, git commit, host,
    device, network calibration).
    """
    summary: dict[str, Any] = {key: None for key in SUMMARY_KEYS}
    summary.update({"method": config.method, "workers": config.workers, "density": config.density,
                    "epochs": config.epochs})
    if rank0_summary:
        summary.update(rank0_summary)
    summary["run_id"] = config.run_id
    summary["status"] = status
    summary["error"] = error
    summary["config_hash"] = config_hash(config)
    for key in ("algorithm", "bandwidth", "latency", "model", "dataset", "selector", "residual_rule"):
        summary.setdefault(key, getattr(config, key))
    if extra:
        summary.update(extra)
    device = summary.get("device")
    summary["provenance"] = provenance(config, device=device if isinstance(device, str) else None)
    return summary


def write_run(out: str | os.PathLike[str], config: RunConfig, metrics: pd.DataFrame,
              summary: dict[str, Any]) -> Path:
    """Write all three files of a finished run (metrics first, summary last)."""
    if not config.run_id:
        raise ValueError("run_id=None is invalid: a stored run needs a run id")
    store = RunStore(out, config.run_id)
    store.write_config(config)
    store.write_metrics(metrics)
    store.write_summary(summary)
    return store.path


# ------------------------------------------------------------------------------------------
class DamagedRun(ValueError):
    """A run folder with a file that exists but cannot be read (or a finished run missing
    its metrics). ``path`` is the run folder, ``file`` the file's name, ``reason`` short."""

    def __init__(self, path: str | os.PathLike[str], file: str, reason: str) -> None:
        self.path, self.file, self.reason = Path(path), file, reason
        super().__init__(f"{self.path}: {file}: {reason}")


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
    def config_hash(self) -> str | None:
        """The stored config hash (summary first, then config.json, then recomputed)."""
        for data in (self.summary, self.config):
            if data and data.get("config_hash"):
                return str(data["config_hash"])
        if self.config:
            return config_hash(self.config)
        return None


def _short(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text if len(text) <= 160 else text[:157] + "..."


def _read_json(folder: Path, name: str) -> dict[str, Any] | None:
    """``folder/name`` as a JSON object; None when missing; :class:`DamagedRun` otherwise."""
    try:
        data = (folder / name).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DamagedRun(folder, name, f"cannot be read: {exc.strerror or _short(exc)}") from exc
    if not data.strip():
        raise DamagedRun(folder, name, f"empty file ({len(data)} bytes)")
    try:
        value = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DamagedRun(folder, name, f"not valid JSON ({len(data)} bytes): {_short(exc)}") from exc
    if not isinstance(value, dict):
        raise DamagedRun(folder, name, f"expected a JSON object, found {type(value).__name__}")
    return value


def _read_parquet(folder: Path, *, full: bool) -> pd.DataFrame | None:
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
        raise DamagedRun(folder, METRICS_FILE, _short(exc)) from exc


def read_run(path: str | os.PathLike[str], *, metrics: bool = True) -> StoredRun:
    """Read one run folder, or raise :class:`DamagedRun` naming the bad file.

    Damaged: ``config.json`` or ``summary.json`` present but empty, not JSON or not an
    object; a summary without a known ``status``; a summary but no ``config.json``
    (writers write it first); ``metrics.parquet`` present but unreadable, or missing from
    a finished run (its final summary is written after it). With ``metrics=False`` the
    parquet file is only checked (footer) and ``StoredRun.metrics`` is None.
    """
    folder = Path(path)
    config = _read_json(folder, CONFIG_FILE)
    summary = _read_json(folder, SUMMARY_FILE)
    if summary is not None:
        if summary.get("status") not in STATUSES:
            raise DamagedRun(folder, SUMMARY_FILE, f"status={summary.get('status')!r} is not one of "
                                                   f"{', '.join(STATUSES)}")
        if config is None:
            raise DamagedRun(folder, CONFIG_FILE, "missing (summary.json is there)")
    frame = _read_parquet(folder, full=metrics)
    if frame is None and summary is not None and summary["status"] in FINAL_STATUSES:
        raise DamagedRun(folder, METRICS_FILE, f"missing (summary.json says {summary['status']})")
    if frame is None and metrics:
        frame = rows_to_frame([])
    return StoredRun(path=folder, config=config, summary=summary, metrics=frame if metrics else None)


def move_aside(path: str | os.PathLike[str]) -> Path:
    """Rename run folder ``path`` to ``<path>.damaged-<UTC stamp>`` (a free name); return it."""
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
    columns = list(SUMMARY_KEYS) + ["config_hash", "path"]
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


def load_runs(out: str | os.PathLike[str] = "results") -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(summaries, metrics)`` of every run stored under ``out``.

    ``summaries`` has one row per run (see :func:`load_summaries`); ``metrics`` holds
    every metric row of every run with a ``run_id`` column to join on. A missing
    ``out`` folder gives two empty frames. A damaged run (:func:`read_run`) is left out of
    both, with one warning line naming its folder and file.

    Example::

        summaries, metrics = load_runs("results/demo")
        summaries[summaries.status == "completed"][["method", "workers", "samples_per_s_virtual"]]
    """
    runs = read_runs(out)
    return _summaries_frame(runs), _metrics_frame(runs)


def completed_runs(out: str | os.PathLike[str], move_damaged: bool = False) -> dict[str, str]:
    """``{config_hash: run_id}`` of the completed runs under ``out`` (for resumable sweeps).

    Damaged runs are not completed (their metrics are read in full to be sure); with
    ``move_damaged`` (a resuming sweep) each is moved aside to ``<run>.damaged-<stamp>``
    so that its point runs again into a fresh folder.
    """
    done: dict[str, str] = {}
    for run in read_runs(out, move_damaged_runs=move_damaged):
        if run.status != "completed":
            continue
        digest = run.config_hash
        if digest:
            done[digest] = run.path.name
    return done
