"""Per-rank epoch checkpoints for resuming interrupted runs (worker side, torch only).

Layout of a checkpoint folder (the Dask rank task uses ``<out>/<run_id>/checkpoints``)::

    epoch{E:05d}-rank{R:05d}.pt   one file per rank and completed epoch E (torch.save)
    epoch{E:05d}-rank{R:05d}.rows.json  that rank's metric rows since its previous
                                  checkpoint (JSON; written before the .pt file)
    latest.json                   {"epoch": E, "iteration": I, "workers": P}: written by
                                  rank 0 only after every rank saved epoch E

Every file is written atomically (temp file in the same folder, fsync, ``os.replace``),
so a crash leaves either the old or the new file, never a torn one. A file damaged
otherwise (a full disk, a copy cut short, bit rot) is reported in one line naming it
(:class:`~gtopk_lab.atomic_io.DamagedFile`, a ``ValueError``) and never written over: a
damaged ``latest.json`` (:func:`read_latest`) or rank file (:func:`check_rank_files` on
the client before a resume, :func:`load_rank_state` on a rank) stops the resume; damaged
saved rows are left out with a warning (:func:`load_checkpoint_rows`). ``latest.json``
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
import logging
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from gtopk_lab.atomic_io import DamagedFile, atomic_write_bytes, read_json_file, short_reason
from gtopk_lab.jsonsafe import json_safe

logger = logging.getLogger(__name__)

__all__ = ["LATEST_FILE", "rank_file", "rows_file", "save_rank_state", "load_rank_state", "save_rank_rows",
           "load_checkpoint_rows", "write_latest", "read_latest", "resume_point", "check_rank_files",
           "prune_older"]

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
    the rows of the epoch before it, at least. A missing rank file (a checkpoint written
    before rows were saved) adds nothing; a damaged one adds nothing and says so in one
    warning line naming it (the run's stored rows still hold most of them)."""
    if checkpoint_dir is None or latest is None:
        return []
    rows: list[dict[str, Any]] = []
    for rank in range(int(latest["workers"])):
        path = rows_file(checkpoint_dir, latest["epoch"], rank)
        try:
            saved = read_json_file(path, expect=list) or []
            if not all(isinstance(r, dict) for r in saved):
                raise DamagedFile(path, "expected a list of row objects")
        except DamagedFile as exc:
            logger.warning("checkpoint rows %s: %s; resuming without them", exc.path, exc.reason)
            continue
        rows.extend(saved)
    return rows


def load_rank_state(checkpoint_dir: str | os.PathLike[str], epoch: int, rank: int) -> dict[str, Any]:
    """Read rank ``rank``'s file of ``epoch`` (``weights_only`` loading: no code runs);
    :class:`~gtopk_lab.atomic_io.DamagedFile` when it is not a whole torch zip file or
    cannot be loaded."""
    path = _whole_rank_file(checkpoint_dir, epoch, rank, crc=False)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a member cut or changed inside a whole zip, a pickle it refuses
        raise DamagedFile(path, f"cannot be loaded as a torch checkpoint: {type(exc).__name__}: "
                                f"{short_reason(exc, path)}") from None
    if not isinstance(state, dict):
        raise DamagedFile(path, f"holds a {type(state).__name__}, not a rank's state")
    return state


def check_rank_files(checkpoint_dir: str | os.PathLike[str], latest: dict[str, int]) -> None:
    """Before a resume, on the client: every rank file of the checkpoint ``latest`` is there
    and whole (a zip from its first byte, as ``torch.save`` writes it, whose every member
    passes its CRC check; nothing is unpickled); :class:`~gtopk_lab.atomic_io.DamagedFile`
    (or ``FileNotFoundError``) names the first that is not. Cost: one read of every rank file."""
    for rank in range(int(latest["workers"])):
        _whole_rank_file(checkpoint_dir, latest["epoch"], rank, crc=True)


def _whole_rank_file(checkpoint_dir: str | os.PathLike[str], epoch: int, rank: int, crc: bool) -> Path:
    """The path of rank ``rank``'s file of ``epoch``, once it is there and a whole zip
    (``crc``: every member checked too); ``FileNotFoundError`` / ``DamagedFile`` otherwise."""
    path = rank_file(checkpoint_dir, epoch, rank)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} is missing: latest.json names epoch {epoch} "
                                f"but rank {rank} has no file for it")
    problem = _zip_problem(path, crc=crc)
    if problem is not None:
        raise DamagedFile(path, problem)
    return path


def _zip_problem(path: Path, crc: bool) -> str | None:
    """What makes ``path`` no whole torch zip file (None: nothing found)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
        if magic != b"PK\x03\x04":  # torch.save's zip starts with its first member
            return f"not a torch checkpoint ({size} bytes): it does not start as a zip file"
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip() if crc else None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        return f"not a whole torch checkpoint ({size} bytes): {short_reason(exc, path)}"
    return None if bad is None else f"damaged torch checkpoint: member {bad!r} fails its CRC check"


def write_latest(checkpoint_dir: str | os.PathLike[str], epoch: int, iteration: int,
                 workers: int) -> None:
    """Mark epoch ``epoch`` (ending before global ``iteration``) as complete on all ranks."""
    data = {"epoch": int(epoch), "iteration": int(iteration), "workers": int(workers)}
    atomic_write_bytes(Path(checkpoint_dir) / LATEST_FILE, json.dumps(data).encode())


def read_latest(checkpoint_dir: str | os.PathLike[str] | None) -> dict[str, int] | None:
    """``{"epoch", "iteration", "workers"}`` of the newest complete checkpoint, or None when
    there is none; :class:`~gtopk_lab.atomic_io.DamagedFile` when ``latest.json`` exists but
    is not such an object (a resume must not start afresh and write over the checkpoint)."""
    if checkpoint_dir is None:
        return None
    path = Path(checkpoint_dir) / LATEST_FILE
    data = read_json_file(path)
    if data is None:
        return None
    for key, low in (("epoch", 1), ("iteration", 0), ("workers", 1)):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise DamagedFile(path, f"{key}={value!r} is invalid: expected an integer >= {low}")
    return {key: data[key] for key in ("epoch", "iteration", "workers")}


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
