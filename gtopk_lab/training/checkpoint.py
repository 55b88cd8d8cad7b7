"""Per-rank epoch checkpoints for resuming interrupted runs (worker side, torch only).

Layout of a checkpoint folder (the Dask rank task uses ``<out>/<run_id>/checkpoints``)::

    epoch{E:05d}-rank{R:05d}.pt   one file per rank and completed epoch E (torch.save)
    epoch{E:05d}-rank{R:05d}.rows.json  that rank's metric rows since its previous
                                  checkpoint (JSON; written before the .pt file)
    latest.json                   {"epoch": E, "iteration": I, "workers": P}: written by
                                  rank 0 only after every rank saved epoch E

Every file is written atomically (temp file in the same folder, fsync, ``os.replace``),
so a crash leaves either the old or the new file, never a torn one. ``latest.json``
names the newest *complete* epoch: a rank file of a newer epoch without a matching
``latest.json`` (crash between ranks) is ignored. After ``latest.json`` moves to epoch
E, rank 0 deletes the rank files of older epochs. On a multi-host cluster the folder
must be shared (or each host keeps its own ranks' files: resume then needs every rank
to come back on the host that saved it).

What a rank file holds (see :func:`gtopk_lab.training.loop.train_rank`): model
``state_dict`` (weights and BN buffers), optimiser ``state_dict`` (momentum buffers),
ErrorFeedback residual, DGC velocity, Ok-Topk state, this rank's torch RNG state,
the global iteration and epoch, and the virtual/wall clock totals. Metric rows stream to
the client (metrics.parquet keeps them); a rank also writes the rows it produced since its
previous checkpoint beside its file, so that a resume fills in rows that were still on
their way when the run stopped (the batch in flight when the scheduler died):
:func:`load_checkpoint_rows`. The data order needs no state: each epoch's batch
order is seeded by (seed, epoch, rank) in :class:`~gtopk_lab.training.data.Shard`.

Cost: one ``torch.save`` of ~ (2-4) x model size per rank per epoch, plus one barrier.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from gtopk_lab.atomic_io import atomic_write_bytes
from gtopk_lab.jsonsafe import json_safe

__all__ = ["LATEST_FILE", "rank_file", "rows_file", "save_rank_state", "load_rank_state", "save_rank_rows",
           "load_checkpoint_rows", "write_latest", "read_latest", "resume_point", "prune_older"]

LATEST_FILE = "latest.json"
_RANK_FILE = re.compile(r"^epoch(\d+)-rank(\d+)\.(pt|rows\.json)$")


def rank_file(checkpoint_dir: str | os.PathLike[str], epoch: int, rank: int) -> Path:
    """Path of rank ``rank``'s checkpoint after completed epoch ``epoch`` (1-based count)."""
    return Path(checkpoint_dir) / f"epoch{int(epoch):05d}-rank{int(rank):05d}.pt"


def save_rank_state(checkpoint_dir: str | os.PathLike[str], epoch: int, rank: int,
                    state: dict[str, Any]) -> Path:
    """Write ``state`` (tensors, numbers, strings, lists, dicts) as rank ``rank``'s file of ``epoch``."""
    if not isinstance(state, dict):
        raise TypeError(f"state has type {type(state).__name__}: expected dict")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path = rank_file(checkpoint_dir, epoch, rank)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def rows_file(checkpoint_dir: str | os.PathLike[str], epoch: int, rank: int) -> Path:
    """Path of rank ``rank``'s rows since its previous checkpoint, saved with epoch ``epoch``."""
    return Path(checkpoint_dir) / f"epoch{int(epoch):05d}-rank{int(rank):05d}.rows.json"


def save_rank_rows(checkpoint_dir: str | os.PathLike[str], epoch: int, rank: int,
                   rows: list[dict[str, Any]]) -> Path:
    """Write rank ``rank``'s metric rows since its previous checkpoint (JSON-safe values)."""
    path = rows_file(checkpoint_dir, epoch, rank)
    atomic_write_bytes(path, json.dumps(json_safe(rows)).encode())
    return path


def load_checkpoint_rows(checkpoint_dir: str | os.PathLike[str] | None,
                         latest: dict[str, int] | None) -> list[dict[str, Any]]:
    """Every rank's rows saved with the checkpoint ``latest`` names (:func:`read_latest`):
    the rows of the epoch before it, at least. A rank file that is missing or unreadable
    (a checkpoint written before rows were saved) adds nothing."""
    if checkpoint_dir is None or latest is None:
        return []
    rows: list[dict[str, Any]] = []
    for rank in range(int(latest["workers"])):
        try:
            saved = json.loads(rows_file(checkpoint_dir, latest["epoch"], rank).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(saved, list):
            rows.extend(r for r in saved if isinstance(r, dict))
    return rows


def load_rank_state(checkpoint_dir: str | os.PathLike[str], epoch: int, rank: int) -> dict[str, Any]:
    """Read rank ``rank``'s file of ``epoch`` (``weights_only`` loading: no code runs)."""
    path = rank_file(checkpoint_dir, epoch, rank)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} is missing: latest.json names epoch {epoch} "
                                f"but rank {rank} has no file for it")
    return torch.load(path, map_location="cpu", weights_only=True)


def write_latest(checkpoint_dir: str | os.PathLike[str], epoch: int, iteration: int,
                 workers: int) -> None:
    """Mark epoch ``epoch`` (ending before global ``iteration``) as complete on all ranks."""
    data = {"epoch": int(epoch), "iteration": int(iteration), "workers": int(workers)}
    atomic_write_bytes(Path(checkpoint_dir) / LATEST_FILE, json.dumps(data).encode())


def read_latest(checkpoint_dir: str | os.PathLike[str] | None) -> dict[str, int] | None:
    """``{"epoch", "iteration", "workers"}`` of the newest complete checkpoint, or None."""
    if checkpoint_dir is None:
        return None
    try:
        data = json.loads((Path(checkpoint_dir) / LATEST_FILE).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), int)
                                             for k in ("epoch", "iteration", "workers")):
        return None
    return data


def resume_point(resume_from: str | os.PathLike[str] | None, workers: int) -> dict[str, int] | None:
    """:func:`read_latest` of a run that resumes with ``workers`` ranks: None when there is
    no complete checkpoint (start from iteration 0); ``ValueError`` naming ``resume_from``
    when the checkpoint was written by another number of ranks."""
    latest = read_latest(resume_from)
    if latest is not None and latest["workers"] != workers:
        raise ValueError(f"resume_from={str(resume_from)!r} is invalid: its checkpoint has "
                         f"workers={latest['workers']}, this run has {workers}")
    return latest


def prune_older(checkpoint_dir: str | os.PathLike[str], keep_epoch: int) -> None:
    """Delete rank files (and their rows) of epochs older than ``keep_epoch``."""
    folder = Path(checkpoint_dir)
    for path in folder.iterdir() if folder.is_dir() else ():
        match = _RANK_FILE.match(path.name)
        if match and int(match.group(1)) < keep_epoch:
            path.unlink(missing_ok=True)
