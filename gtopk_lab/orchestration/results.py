"""Results store: one folder per run, written atomically.

Layout::

    <out>/<run_id>/config.json      RunConfig.to_dict() (+ "config_hash")
    <out>/<run_id>/metrics.parquet  every metric row of every rank (docs/architecture.md)
    <out>/<run_id>/summary.json     run summary (docs/architecture.md) + status, error,
                                    config_hash, started_at, finished_at

Every file is written to a temporary name in the same folder and moved into place
with ``os.replace``, so a reader never sees a half-written file, and a crash leaves
either the old or the new version. ``summary.json`` is written with
``status="running"`` when a run starts and rewritten when it ends.

A sweep is resumable: :func:`completed_runs` maps each completed run's
:func:`config_hash` (the config without its ``run_id``) to its run id, so the same
config is not run twice into one ``out`` folder.

Client side only (pandas/pyarrow); no torch, no Dask.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import secrets
from pathlib import Path
from typing import Any

import pandas as pd

from gtopk_lab.atomic_io import atomic_path, atomic_write_bytes
from gtopk_lab.config import RunConfig
from gtopk_lab.network.model import portable_bandwidth

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.parquet"
SUMMARY_FILE = "summary.json"
STATUSES: tuple[str, ...] = ("queued", "running", "completed", "failed", "cancelled")

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
def _jsonable(value: Any) -> Any:
    """NaN/inf become None (JSON has no NaN); tuples become lists; numpy scalars unwrap."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return _jsonable(item())
        except (ValueError, RuntimeError):
            pass
    return str(value)


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
        try:
            return json.loads((self.path / SUMMARY_FILE).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def read_config(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.path / CONFIG_FILE).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def read_metrics(self) -> pd.DataFrame:
        try:
            return pd.read_parquet(self.path / METRICS_FILE)
        except FileNotFoundError:
            return rows_to_frame([])


def build_summary(config: RunConfig, rank0_summary: dict[str, Any] | None, *, status: str,
                  error: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run summary: rank 0's summary completed with every contract key.

    Keys missing from rank 0's summary (for example when the run failed before rank 0
    finished) are filled from the config where known, else None. Beyond the contract
    keys it records ``config_hash`` and the config's ``algorithm, bandwidth, latency,
    model, dataset, selector, residual_rule`` (so tables need not open config.json).
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
def run_dirs(out: str | os.PathLike[str]) -> list[Path]:
    """Run folders under ``out`` (those holding a config.json or summary.json), sorted by name."""
    root = Path(out)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir()
                  if p.is_dir() and not p.name.startswith(".")
                  and ((p / SUMMARY_FILE).exists() or (p / CONFIG_FILE).exists()))


def load_summaries(out: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per run: summary keys (always all of SUMMARY_KEYS) plus flattened
    ``time_<phase>_s`` columns from ``time_breakdown_s`` and ``path``."""
    records: list[dict[str, Any]] = []
    for path in run_dirs(out):
        store = RunStore(path.parent, path.name)
        summary = store.read_summary()
        if summary is None:
            config = store.read_config() or {}
            summary = {"run_id": path.name, "status": "unknown",
                       **{k: config.get(k) for k in ("method", "workers", "density", "epochs")},
                       "config_hash": config.get("config_hash")}
        summary.setdefault("run_id", path.name)
        breakdown = summary.get("time_breakdown_s")
        if isinstance(breakdown, dict):
            for phase, seconds in breakdown.items():
                summary[f"time_{phase}_s"] = seconds
        summary["path"] = str(path)
        records.append(summary)
    columns = list(SUMMARY_KEYS) + ["config_hash", "path"]
    frame = pd.DataFrame.from_records(records) if records else pd.DataFrame(columns=columns)
    for col in columns:
        if col not in frame.columns:
            frame[col] = None
    return frame


def load_metrics(out: str | os.PathLike[str], run_ids: list[str] | None = None) -> pd.DataFrame:
    """All metric rows of the runs under ``out`` (or of ``run_ids``), with a ``run_id`` column."""
    frames = []
    for path in run_dirs(out):
        if run_ids is not None and path.name not in run_ids:
            continue
        frame = RunStore(path.parent, path.name).read_metrics()
        if len(frame):
            frame = frame.copy()
            frame["run_id"] = path.name
            frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=["run_id", "kind", "rank", "iteration", "epoch"])
    return pd.concat(frames, ignore_index=True, sort=False)


def load_runs(out: str | os.PathLike[str] = "results") -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(summaries, metrics)`` of every run stored under ``out``.

    ``summaries`` has one row per run (see :func:`load_summaries`); ``metrics`` holds
    every metric row of every run with a ``run_id`` column to join on. A missing
    ``out`` folder gives two empty frames.

    Example::

        summaries, metrics = load_runs("results/demo")
        summaries[summaries.status == "completed"][["method", "workers", "samples_per_s_virtual"]]
    """
    return load_summaries(out), load_metrics(out)


def completed_runs(out: str | os.PathLike[str]) -> dict[str, str]:
    """``{config_hash: run_id}`` of the completed runs under ``out`` (for resumable sweeps)."""
    done: dict[str, str] = {}
    for path in run_dirs(out):
        store = RunStore(path.parent, path.name)
        summary = store.read_summary()
        if not summary or summary.get("status") != "completed":
            continue
        digest = summary.get("config_hash")
        if not digest:
            config = store.read_config()
            if not config:
                continue
            config.pop("config_hash", None)
            digest = config_hash(config)
        done[str(digest)] = path.name
    return done
