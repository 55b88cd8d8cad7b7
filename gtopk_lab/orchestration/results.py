"""Results store: one folder per run, written atomically.

Layout::

    <out>/<run_id>/config.json      RunConfig.to_dict() (+ "config_hash")
    <out>/<run_id>/metrics.parquet  every metric row of every rank (docs/architecture.md)
    <out>/<run_id>/summary.json     run summary (docs/architecture.md) + status, error,
                                    config_hash, started_at, finished_at, provenance
    <out>/<run_id>/parts/           while it runs: the rows streamed so far (run_stream)
    <out>/<run_id>/heartbeat.json   while it is queued or runs: its client is alive
    <out>/<run_id>/.lock            held by the client writing the folder (locks)
    <out>/.points/                  one lock (and record) per point of a study (locks)

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
leaves ``queued``/``running`` (listed as ``crashed`` once its heartbeat is older than its
timeout) or no summary at all (listed as ``unknown``), never a completed run with half
its files; the rows it streamed are in its parts. :func:`read_run` is the one reader of a run folder:
a file that exists but cannot be read (truncated, not JSON/parquet, unreadable), or a
finished run without its ``metrics.parquet``, raises :class:`DamagedRun`. The listings
(:func:`load_summaries`, :func:`load_metrics`, :func:`load_runs`,
:func:`completed_runs`) skip such a run with one ``logging`` warning line
``skipping damaged run <path>: <file>: <reason>``; a resuming sweep
(``completed_runs(out, move_damaged=True)``) also renames it to
``<run>.damaged-<UTC stamp>`` (nothing is deleted) and runs its point again. Folders
named ``*.damaged-*`` are not runs.

The store is four modules; this one is the writing side and the one place to import
from (it re-exports the other three):

1. ``run_files``: file names, statuses, summary keys, ids and hashes, atomic writes,
   metric-row frames.
2. ``run_stream``: a live run's parts and heartbeat, and when a reader calls it crashed.
3. ``reading``: :func:`read_run`, :class:`DamagedRun`, moving damaged runs aside, the listings.
4. ``results`` (here): :class:`RunStore` (one run folder), :func:`run_summary` (the run
   summary written to summary.json) and :func:`write_run` (all three files, summary last).

Client side only (pandas/pyarrow); no torch, no Dask.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from gtopk_lab.config import RunConfig
from gtopk_lab.methods import get_method
from gtopk_lab.network.model import link_text
from gtopk_lab.orchestration.reading import (
    DamagedRun,
    StoredRun,
    completed_runs,
    interrupted_runs,
    PointScan,
    scan_points,
    point_key,
    load_metrics,
    load_runs,
    load_summaries,
    move_aside,
    read_json,
    read_parquet,
    read_run,
    read_runs,
    run_dirs,
)
from gtopk_lab.orchestration.run_files import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    CRASHED,
    DAMAGED_MARK,
    FINAL_STATUSES,
    HEARTBEAT_FILE,
    LISTED_STATUSES,
    LOCK_FILE,
    METRICS_FILE,
    PARTS_DIR,
    STATUSES,
    SUMMARY_FILE,
    SUMMARY_KEYS,
    _jsonable,
    checkpoint_folder,
    config_hash,
    new_run_id,
    rows_before,
    rows_kept_on_resume,
    rows_on_resume,
    rows_to_frame,
    utc_now,
    write_json_atomic,
    write_parquet_atomic,
)
from gtopk_lab.orchestration.run_identity import labels_of
from gtopk_lab.orchestration.run_stream import drop_heartbeat, drop_parts, merge_rows, read_parts
from gtopk_lab.provenance import provenance

__all__ = [
    # run_files
    "CHECKPOINT_DIR", "CONFIG_FILE", "CRASHED", "DAMAGED_MARK", "FINAL_STATUSES", "HEARTBEAT_FILE",
    "LISTED_STATUSES", "LOCK_FILE", "METRICS_FILE", "PARTS_DIR", "STATUSES",
    "SUMMARY_FILE", "SUMMARY_KEYS", "checkpoint_folder", "config_hash", "new_run_id", "rows_before",
    "rows_kept_on_resume", "rows_on_resume", "rows_to_frame", "utc_now", "write_json_atomic", "write_parquet_atomic",
    # reading
    "DamagedRun", "StoredRun", "completed_runs", "interrupted_runs", "PointScan", "scan_points", "point_key", "load_metrics", "load_runs", "load_summaries",
    "move_aside", "read_run", "read_runs", "run_dirs",
    # here
    "RunStore", "run_summary", "write_run",
]
# _jsonable (the JSON sanitiser) stays importable from here too: the CLI's --json output uses it.


# ------------------------------------------------------------------------------------------
class RunStore:
    """The folder of one run: ``<out>/<run_id>/``."""

    def __init__(self, out: str | os.PathLike[str], run_id: str) -> None:
        if not run_id or "/" in run_id or run_id in (".", ".."):
            raise ValueError(f"run_id={run_id!r} is invalid: expected a non-empty name without '/'")
        self.out = Path(out)
        self.run_id = run_id
        self.path = self.out / run_id

    def write_config(self, config: RunConfig, digest: str | None = None) -> None:
        """config.json: the full config plus its hash (``digest`` when the caller has it)."""
        data = config.to_dict()
        data["config_hash"] = digest or config_hash(config)
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
            return read_json(self.path, SUMMARY_FILE)
        except DamagedRun:
            return None

    def read_config(self) -> dict[str, Any] | None:
        """config.json, or None when it is missing or damaged."""
        try:
            return read_json(self.path, CONFIG_FILE)
        except DamagedRun:
            return None

    def read_metrics(self) -> pd.DataFrame:
        """The run's rows: metrics.parquet overlaid by the parts a live or crashed run
        streamed (an empty frame when there are none); :class:`DamagedRun` when a file is damaged."""
        parts = read_parts(self.path)
        return merge_rows([read_parquet(self.path, full=True), *parts])


def _pattern(config: RunConfig) -> str | None:
    """The pattern a run of ``config`` uses (the config's where its method is not loaded here)."""
    try:
        return get_method(config.method).pattern_for(config.algorithm)
    except ValueError:
        return config.algorithm


def run_summary(config: RunConfig, rank0_summary: dict[str, Any] | None, *, status: str,
                error: str | None = None, extra: dict[str, Any] | None = None,
                identity: dict[str, Any] | None = None, digest: str | None = None) -> dict[str, Any]:
    """The run summary (summary.json): rank 0's summary completed with every contract key.

    Not ``training.rows.build_summary``, which is one rank's summary (the ``rank0_summary``
    given here). Keys missing from rank 0's summary (for example when the run failed
    before rank 0 finished) are filled from the config where known, else None. Beyond the
    contract keys it records ``config_hash``, the pattern the run uses (``algorithm``:
    ``Method.pattern_for``, None where the method chooses none) and the config's ``bandwidth,
    latency, model, dataset, selector, residual_rule, preset`` (so tables need not open
    config.json), the run's identity (``identity``: ``study_id``, ``study_ids``, ``tags``,
    ``varied``, ``studies`` as :func:`~gtopk_lab.orchestration.run_identity.with_labels` makes
    them; blank without; never part of the config or its hash), ``link`` (the network
    charged, in words: ``1GbE: 888.9 Mbit/s, 436 us latency``), ``recipe`` and
    ``recipe_fields`` (the training recipe that applied and the fields it supplied,
    comma-separated; :mod:`gtopk_lab.recipe_defaults`) and ``provenance``
    (:func:`gtopk_lab.provenance.provenance`: versions, git commit, host, device, network
    calibration). ``digest``: the config's hash when the caller has
    it (a run's handle hashes its config once).
    """
    summary: dict[str, Any] = {key: None for key in SUMMARY_KEYS}
    summary.update({"method": config.method, "workers": config.workers, "density": config.density,
                    "epochs": config.epochs})
    if rank0_summary:
        summary.update(rank0_summary)
    summary["run_id"] = config.run_id
    summary["status"] = status
    summary["error"] = error
    summary["config_hash"] = digest or config_hash(config)
    summary.setdefault("algorithm", _pattern(config))
    for key in ("bandwidth", "latency", "model", "dataset", "selector", "residual_rule", "preset"):
        summary.setdefault(key, getattr(config, key))
    summary.update(labels_of(identity))
    summary["link"] = link_text(config.bandwidth, config.latency)
    recipe, supplied = config.applied_recipe
    summary["recipe"], summary["recipe_fields"] = recipe, ",".join(supplied)
    if extra:
        summary.update(extra)
    device = summary.get("device")
    summary["provenance"] = provenance(config, device=device if isinstance(device, str) else None)
    return summary


def write_run(out: str | os.PathLike[str], config: RunConfig, metrics: pd.DataFrame,
              summary: dict[str, Any], digest: str | None = None) -> Path:
    """Write all three files of a finished run (metrics first, summary last), then delete
    what its live run streamed (parts, heartbeat): ``metrics`` holds every row now."""
    if not config.run_id:
        raise ValueError("run_id=None is invalid: a stored run needs a run id")
    store = RunStore(out, config.run_id)
    store.write_config(config, digest)
    store.write_metrics(metrics)
    store.write_summary(summary)
    if summary.get("status") in FINAL_STATUSES:
        drop_parts(store.path)
        drop_heartbeat(store.path)
    return store.path
