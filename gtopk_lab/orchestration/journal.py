"""``RunJournal``: one thread per Lab that keeps each of its live runs' folders current.

Client side. Rows reach the client as Dask events (``RunHandle.on_event``); before this
thread they reached disk only when the run ended, so a client killed mid-run left a
folder that said ``running`` forever and held no rows. Now, for every queued or running
run of the Lab, every :func:`flush_interval_s` (2 s, or a fifth of the run's timeout when
that is shorter):

1. the rows that arrived since the last flush go to a new part,
   ``<run>/parts/part-<seq>.parquet`` (:func:`~gtopk_lab.orchestration.run_stream.write_part`,
   atomic, fsynced), numbered after those already there (a resumed run keeps its old ones);
2. every :data:`FOLD_PARTS` parts, the run's rows so far are written to ``metrics.parquet``
   and those parts deleted, so a long run keeps a handful of files, not thousands;
3. the heartbeat (``heartbeat.json``, with the run's ``timeout_s``) is rewritten; a reader
   calls the run ``crashed`` once it is older than that timeout.

Each flush holds the handle's ``files_lock``, which the run's end (``RunHandle.record_end``:
all rows to ``metrics.parquet``, the final summary, parts and heartbeat deleted) holds too,
so a late part never lands beside a finished run. A write that fails (disk full) is
logged once per run and tried again at the next flush; the run goes on.

The thread is separate from the monitor's: a tick of the monitor that waits on a slow
scheduler must not stop the heartbeat (a live run would then read as crashed).

Cost: per run and flush, one parquet write of the new rows and one small JSON write.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from gtopk_lab.orchestration.run_files import FINAL_STATUSES, METRICS_FILE, write_parquet_atomic
from gtopk_lab.orchestration.run_stream import (
    drop_parts, next_part_seq, owner, part_files, write_heartbeat, write_part,
)

__all__ = ["FLUSH_S", "FOLD_PARTS", "RunJournal", "flush_interval_s"]

logger = logging.getLogger("gtopk_lab.orchestration.lab")

#: Longest time between two flushes of a run (rows and heartbeat).
FLUSH_S = 2.0
#: Parts after which the rows so far are folded into metrics.parquet.
FOLD_PARTS = 32


def flush_interval_s(timeout_s: float) -> float:
    """Seconds between two flushes of a run whose heartbeat times out after ``timeout_s``:
    :data:`FLUSH_S`, or ``timeout_s / 5`` when shorter, so that five heartbeats in a row
    must be missed before a reader calls the run crashed."""
    return max(0.05, min(FLUSH_S, float(timeout_s) / 5.0))


class _Entry:
    """What the journal keeps per run: its folder, next part number, parts since the last
    fold, when it is due, and whether a failed write was already logged."""

    __slots__ = ("handle", "folder", "seq", "parts", "due", "warned")

    def __init__(self, handle: Any, folder: Path) -> None:
        self.handle, self.folder = handle, folder
        self.seq = next_part_seq(folder)
        self.parts = len(part_files(folder))
        self.due = 0.0
        self.warned = False


class RunJournal:
    """Parts and heartbeats of one Lab's live runs (see the module docstring)."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.owner = owner()
        self._entries: dict[int, _Entry] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="gtopk-lab-journal", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, join_timeout_s: float = 5.0) -> None:
        self._stopped = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=join_timeout_s)

    def track(self, handle: Any) -> None:
        """Keep ``handle``'s folder current from now on; its first heartbeat is written here,
        before anything else of the run."""
        folder = self.out / handle.run_id
        entry = _Entry(handle, folder)
        write_heartbeat(folder, handle.timeout_s, self.owner)
        entry.due = time.monotonic() + flush_interval_s(handle.timeout_s)
        with self._lock:
            self._entries[id(handle)] = entry
        self._wake.set()

    def forget(self, handle: Any) -> None:
        with self._lock:
            self._entries.pop(id(handle), None)

    def tracked(self) -> int:
        with self._lock:
            return len(self._entries)

    # --- the thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopped:
            with self._lock:
                entries: Any = list(self._entries.values())
            now = time.monotonic()
            for entry in entries:
                if now >= entry.due and not self._stopped:
                    self.flush(entry)
                    entry.due = time.monotonic() + flush_interval_s(entry.handle.timeout_s)
            entries = entry = None  # an ended run's handle must not wait here for the next tick
            with self._lock:
                wait = min((e.due for e in self._entries.values()), default=now + FLUSH_S)
            self._wake.wait(max(0.01, min(FLUSH_S, wait - time.monotonic())))
            self._wake.clear()

    def flush(self, entry: _Entry) -> None:
        """Steps 1-3 of the module docstring for one run."""
        handle = entry.handle
        with handle.files_lock:
            if handle.status in FINAL_STATUSES:  # ended: its folder is final
                self.forget(handle)
                return
            try:
                rows = handle.take_unjournaled()
                if rows:
                    try:
                        write_part(entry.folder, rows, entry.seq)
                    except BaseException:
                        handle.return_unjournaled(rows)
                        raise
                    entry.seq += 1
                    entry.parts += 1
                if entry.parts >= FOLD_PARTS:
                    folded = part_files(entry.folder)
                    write_parquet_atomic(entry.folder / METRICS_FILE, handle.metrics)
                    drop_parts(entry.folder, upto=folded)
                    entry.parts = 0
                write_heartbeat(entry.folder, handle.timeout_s, self.owner)
                entry.warned = False
            except Exception as exc:  # disk full, folder removed: say so once, keep going
                if not entry.warned:
                    logger.warning("gtopk-lab: could not write the live rows of run %s to %s: %s: %s",
                                   handle.run_id, entry.folder, type(exc).__name__, exc)
                    entry.warned = True
