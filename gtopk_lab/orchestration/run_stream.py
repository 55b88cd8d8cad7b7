"""The files of a run that is still going: its metric rows in parts, and its client's heartbeat.

Client side; the layer between ``run_files`` (names, atomic writes) and ``reading``. The
client that owns a run (:class:`~gtopk_lab.orchestration.journal.RunJournal`) writes, in
``<out>/<run_id>/``:

1. ``parts/part-<seq>.parquet``: the rows that reached the client since the previous part,
   every few seconds while rows arrive, each written atomically (temp file, fsync,
   ``os.replace``), so a SIGKILLed client loses at most the rows of its last seconds;
2. ``heartbeat.json``: ``{"heartbeat_unix_s", "heartbeat_at", "timeout_s", "host", "pid"}``,
   rewritten as often (not fsynced: a heartbeat is worthless after a power loss anyway).

A run's rows are ``metrics.parquet`` (the run's end writes every row there, and long runs
fold their parts into it now and then) overlaid by the parts in order, a later row of the
same (kind, rank, iteration) replacing an earlier one (:func:`merge_rows`): a resumed run's
recomputed rows replace the stored ones they redo. Once the final summary is written the
parts and the heartbeat are deleted.

A reader shows a run whose summary says ``queued`` or ``running`` but whose heartbeat is
older than its ``timeout_s`` as ``crashed`` (:func:`crash_note`); its client stopped
without ending it (SIGKILL, OOM kill, a closed laptop, a killed kernel). Times are the
writer's and the reader's wall clocks: hosts that share a results folder must agree on
the time to well within the timeout.

Cost: one part write per few seconds per running run (O(rows since the last part)); a
listing reads one small JSON file more per queued or running run.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from gtopk_lab.atomic_io import atomic_write_bytes, short_reason
from gtopk_lab.orchestration.run_files import (
    HEARTBEAT_FILE, PARTS_DIR, DamagedRun, _jsonable, read_json, rows_to_frame, utc_now,
    write_parquet_atomic,
)

__all__ = ["ROW_KEY", "part_files", "next_part_seq", "write_part", "read_parts", "drop_parts",
           "merge_rows", "owner", "write_heartbeat", "read_heartbeat", "drop_heartbeat",
           "crash_note"]

#: The identity of a metric row: a later row with the same key replaces an earlier one.
ROW_KEY: tuple[str, str, str] = ("kind", "rank", "iteration")
_PART = re.compile(r"^part-(\d{6,})\.parquet$")


# ------------------------------------------------------------------------------------------
# parts
def part_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The run's parts, oldest first (temporary files of an interrupted write are not parts)."""
    parts = Path(folder) / PARTS_DIR
    if not parts.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in parts.iterdir() if (m := _PART.match(p.name))]
    return [p for _, p in sorted(found)]


def next_part_seq(folder: str | os.PathLike[str]) -> int:
    """The number the next part gets (one more than the newest one there)."""
    files = part_files(folder)
    return int(_PART.match(files[-1].name).group(1)) + 1 if files else 1  # type: ignore[union-attr]


def write_part(folder: str | os.PathLike[str], rows: list[dict[str, Any]], seq: int) -> Path:
    """Write ``rows`` (the last of each :data:`ROW_KEY`) as part number ``seq`` (atomically,
    fsynced)."""
    last = {tuple(row.get(k) for k in ROW_KEY): row for row in rows}
    path = Path(folder) / PARTS_DIR / f"part-{seq:06d}.parquet"
    write_parquet_atomic(path, rows_to_frame(list(last.values())))
    return path


def read_parts(folder: str | os.PathLike[str], *, full: bool = True) -> list[pd.DataFrame]:
    """Every part's rows (``full=False``: only each file's footer is checked, empty frames
    come back); :class:`DamagedRun` naming the part that cannot be read."""
    frames = []
    for path in part_files(folder):
        name = f"{PARTS_DIR}/{path.name}"
        try:
            if full:
                frames.append(pd.read_parquet(path))
            else:
                import pyarrow.parquet as pq

                pq.read_metadata(path)
        except FileNotFoundError:  # folded into metrics.parquet meanwhile
            continue
        except Exception as exc:  # pyarrow: ArrowInvalid, OSError, ... for a bad file
            raise DamagedRun(folder, name, short_reason(exc, path=path)) from exc
    return frames


def drop_parts(folder: str | os.PathLike[str], upto: Iterable[Path] | None = None) -> None:
    """Delete the parts (``upto``: only those), and the parts folder once it is empty."""
    for path in list(upto) if upto is not None else part_files(folder):
        path.unlink(missing_ok=True)
    try:
        (Path(folder) / PARTS_DIR).rmdir()
    except OSError:  # not empty (a newer part, a temp file) or not there
        pass


def merge_rows(frames: list[pd.DataFrame | None]) -> pd.DataFrame:
    """Rows of ``frames`` in order, a later row with the same :data:`ROW_KEY` replacing an
    earlier one; sorted as ``rows_to_frame`` sorts."""
    frames = [f for f in frames if f is not None and len(f)]
    if not frames:
        return rows_to_frame([])
    if len(frames) == 1:
        return frames[0]
    merged = pd.concat(frames, ignore_index=True, sort=False)
    keys = [k for k in ROW_KEY if k in merged.columns]
    if keys:
        merged = merged.drop_duplicates(subset=keys, keep="last")
        merged = merged.sort_values(keys, kind="stable")
    return merged.reset_index(drop=True)


# ------------------------------------------------------------------------------------------
# heartbeat
def owner() -> dict[str, Any]:
    """Who writes: this host and process."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def write_heartbeat(folder: str | os.PathLike[str], timeout_s: float,
                    who: dict[str, Any] | None = None) -> None:
    """Say that the run's client is alive now; a reader calls the run crashed when the next
    heartbeat is more than ``timeout_s`` late."""
    data = {"heartbeat_unix_s": time.time(), "heartbeat_at": utc_now(), "timeout_s": float(timeout_s),
            **(who or owner())}
    atomic_write_bytes(Path(folder) / HEARTBEAT_FILE, (json.dumps(_jsonable(data)) + "\n").encode(),
                       durable=False)


def read_heartbeat(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The heartbeat (None when there is none); :class:`DamagedRun` when it is unreadable or
    lacks its time or timeout."""
    data = read_json(Path(folder), HEARTBEAT_FILE)
    if data is None:
        return None
    for key in ("heartbeat_unix_s", "timeout_s"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value == value:
            raise DamagedRun(folder, HEARTBEAT_FILE, f"{key}={value!r} is invalid: expected a number")
    return data


def drop_heartbeat(folder: str | os.PathLike[str]) -> None:
    (Path(folder) / HEARTBEAT_FILE).unlink(missing_ok=True)


def crash_note(summary: dict[str, Any] | None, heartbeat: dict[str, Any] | None,
               now: float | None = None) -> str | None:
    """Why a run reads ``crashed`` (None when it does not): its summary says queued or
    running, and its heartbeat is more than its timeout old."""
    if summary is None or heartbeat is None or summary.get("status") not in ("queued", "running"):
        return None
    age_s = (time.time() if now is None else now) - float(heartbeat["heartbeat_unix_s"])
    timeout_s = float(heartbeat["timeout_s"])
    if age_s <= timeout_s:
        return None
    who = f"pid {heartbeat.get('pid')} on {heartbeat.get('host')}"
    return (f"its client ({who}) stopped while the run was {summary.get('status')}: no heartbeat "
            f"for {age_s:.0f} s (timeout {timeout_s:.0f} s, last at {heartbeat.get('heartbeat_at')}); "
            f"gtopk-lab run --resume {summary.get('run_id')} continues it")
