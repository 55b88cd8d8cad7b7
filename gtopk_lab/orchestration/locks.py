"""Locks that let several clients share one results folder.

Client side. Two Labs (two notebooks, a notebook and ``gtopk-lab sweep``, two hosts on one
shared disk) may point at one ``out`` folder. Without locks both could run the same point
of their studies, or both write one run folder. With them:

1. **Run lock** ``<out>/<run_id>/.lock``: taken by ``Lab.submit`` before it writes anything
   in the folder and held until the run ended (its final summary written). A second client
   that submits or resumes the same run id gets ``ValueError`` naming the holder (from the
   run's heartbeat). So a crashed run (its client's lock died with it) can be resumed, a
   live one cannot, whatever its heartbeat says.
2. **Point lock** ``<out>/.points/<point key>.lock``: a study's point (config hash and
   source, :func:`~gtopk_lab.orchestration.reading.point_key`) is taken by the Lab's monitor
   just before the run starts and held until it ended; a point another client holds waits
   in the queue (its reason says so) while other runs go ahead. A run that completes writes
   ``<out>/.points/<point key>.json`` (``{"run_id"}``) before it lets go, so the client that
   waited finds the point done (:func:`point_record`) and does not run it again.

3. **Calibration lock** ``<out>/.calibration.lock`` (:func:`wait_lock`): held while a client
   reads, measures and writes ``calibration.json`` (``orchestration.calibration``), so two
   clients' studies of one workload charge the same calibrated costs and so have the same
   points.

The locks are ``filelock.FileLock`` (``flock`` on Linux and macOS: the kernel drops the
lock of a process that died, SIGKILL included, so nothing needs breaking), taken without
waiting and shared across threads (taken by the caller's thread, released by the
monitor's). A lock file stays in place (waiters must share its inode). On NFS, ``flock``
works only where the server supports it (NFSv4: yes).

Cost: one ``open`` + ``flock`` per run and per study point; one file descriptor per lock
held (one or two per queued-to-start or running run).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import filelock

from gtopk_lab.atomic_io import DamagedFile, read_json_file
from gtopk_lab.orchestration.run_files import LOCK_FILE, write_json_atomic
from gtopk_lab.orchestration.run_stream import owner

__all__ = ["POINTS_DIR", "Held", "lock_run", "try_lock", "wait_lock", "try_lock_point", "point_record",
           "record_point"]

#: Where the point locks and records live (a hidden folder: not a run).
POINTS_DIR = ".points"

logger = logging.getLogger("gtopk_lab.orchestration.lab")


class Held:
    """A lock this process holds; :meth:`release` once (later calls do nothing)."""

    def __init__(self, lock: filelock.FileLock, path: Path) -> None:
        self._lock, self.path = lock, path

    def release(self) -> None:
        if self._lock is not None:
            lock, self._lock = self._lock, None
            lock.release(force=True)

    @property
    def held(self) -> bool:
        return self._lock is not None

    def __enter__(self) -> "Held":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Held({str(self.path)!r}, held={self.held})"


def try_lock(path: str | os.PathLike[str]) -> Held | None:
    """Take the lock file ``path`` now (its folder is made), or None when someone holds it;
    ``ValueError`` naming it when it cannot be a lock (a folder there, no permission)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(str(path), thread_local=False)
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return None
    except OSError as exc:
        raise ValueError(f"{path}: cannot be locked: {exc.strerror or exc}") from None
    return Held(lock, path)


def wait_lock(path: str | os.PathLike[str], timeout_s: float) -> Held:
    """Take the lock file ``path``, waiting up to ``timeout_s`` for whoever holds it;
    ``TimeoutError`` naming it after that."""
    path = Path(path)
    deadline = time.monotonic() + timeout_s
    while True:
        held = try_lock(path)
        if held is not None:
            return held
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{path}: another client held this lock for {timeout_s:.0f} s")
        time.sleep(0.1)


def lock_run(run_folder: str | os.PathLike[str], holder_note: str = "") -> Held:
    """The run folder's lock, or ``ValueError`` ``run_id=... is invalid: another client
    writes it (pid N on HOST)`` (module docstring, step 1)."""
    folder = Path(run_folder)
    held = try_lock(folder / LOCK_FILE)
    if held is not None:
        return held
    raise ValueError(f"run_id={folder.name!r} is invalid: another client writes {folder} "
                     f"({_holder(folder)}){holder_note}")


def _holder(folder: Path) -> str:
    try:
        beat: Any = read_json_file(folder / "heartbeat.json")
    except DamagedFile:
        beat = None
    if not isinstance(beat, dict):
        return "a live process holds its lock"
    return f"pid {beat.get('pid')} on {beat.get('host')}, heartbeat at {beat.get('heartbeat_at')}"


def _point_file(out: str | os.PathLike[str], key: str, suffix: str) -> Path:
    return Path(out) / POINTS_DIR / f"{key.replace(':', '.')}{suffix}"


def try_lock_point(out: str | os.PathLike[str], key: str) -> Held | None:
    """The point ``key``'s lock in ``out``, or None while another client (or another run
    of this one) holds it."""
    return try_lock(_point_file(out, key, ".lock"))


def point_record(out: str | os.PathLike[str], key: str) -> str | None:
    """The run id that completed point ``key`` in ``out`` (as its client recorded it), or
    None; a damaged record counts as none (one warning line names it; the point is then
    run again)."""
    try:
        data = read_json_file(_point_file(out, key, ".json"))
    except DamagedFile as exc:
        logger.warning("point record %s: %s; running the point to be sure", exc.path, exc.reason)
        return None
    run_id = data.get("run_id") if isinstance(data, dict) else None
    return run_id if isinstance(run_id, str) and run_id else None


def record_point(out: str | os.PathLike[str], key: str, run_id: str) -> None:
    """Record that run ``run_id`` completed point ``key`` (written under the point's lock)."""
    write_json_atomic(_point_file(out, key, ".json"), {"run_id": run_id, "point": key, **owner()})
