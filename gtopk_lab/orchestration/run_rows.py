"""``RunRows``: a run's metric rows as the client holds them, from arrival to delivery.

Client side; mixed into :class:`~gtopk_lab.orchestration.handle.RunHandle` (whose
``__init__`` owns every attribute used here), as :class:`~gtopk_lab.orchestration.run_life.RunLife`
is. Each row is stored once, keyed by (kind, rank, iteration) (:func:`row_key`): a batch
from the ranks (:meth:`RunRows.on_event`, a ``subscribe_topic`` handler), rows a resumed
or restarted run keeps (:meth:`RunRows.preload_rows`: those it will recompute are
*provisional*, replaced one by one as the run sends its own), then handed to the
subscribers on the monitor thread (:meth:`RunRows.deliver`) and to the Lab's journal
(:meth:`RunRows.take_unjournaled`). ``metrics`` is the frame of every row stored.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd

from gtopk_lab.orchestration.results import rows_to_frame

__all__ = ["Subscriber", "safe_call", "RunRows", "row_key"]

Subscriber = Callable[[pd.DataFrame], None]


def safe_call(callback: Callable[..., Any], *args: Any) -> None:
    """Call a subscriber; an exception becomes a RuntimeWarning."""
    try:
        callback(*args)
    except Exception as exc:  # a broken plot must not stop the run
        warnings.warn(f"run subscriber {callback!r} raised {type(exc).__name__}: {exc}",
                      RuntimeWarning, stacklevel=2)


class RunRows:
    """Rows, subscribers and the journal's share of a
    :class:`~gtopk_lab.orchestration.handle.RunHandle` (see the module docstring)."""

    @property
    def metrics(self) -> pd.DataFrame:
        """All metric rows received so far, as a DataFrame (a fresh copy-safe frame)."""
        with self._lock:
            if self._frame_cache is None or len(self._frame_cache) != len(self._rows):
                self._frame_cache = rows_to_frame(list(self._rows))
            return self._frame_cache

    def subscribe(self, callback: Subscriber, replay: bool = True) -> Callable[[], None]:
        """Call ``callback(new_rows: DataFrame)`` whenever rows arrive.

        With ``replay=True`` the rows already received are delivered first (on the
        next monitor tick). Returns a function that unsubscribes.
        """
        if not callable(callback):
            raise TypeError(f"callback={callback!r} is not callable")
        with self._lock:
            self._subscribers.append(callback)
            if replay and self._rows:
                rows = list(self._rows)
                self.lab._post(lambda: safe_call(callback, rows_to_frame(rows)))

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def on_event(self, event: Any) -> None:
        """subscribe_topic handler (runs on the client's event loop: keep it cheap)."""
        msg = event[1] if isinstance(event, (tuple, list)) and len(event) == 2 else event
        rows = msg.get("rows") if isinstance(msg, dict) else None
        if not rows:
            return
        with self._lock:
            if self.done():
                return
            if msg.get("key") not in (None, self._key):  # a late batch of an earlier start
                return
            self._add_rows(rows)

    def add_rows(self, rows: Iterable[dict[str, Any]]) -> None:
        """Store rows not seen before (by kind, rank, iteration) and queue them for delivery."""
        with self._lock:
            self._add_rows(rows)

    def preload_rows(self, rows: Iterable[dict[str, Any]], redo_from: int | None = None) -> None:
        """Stored rows a resumed run keeps: stored, but not delivered as new (subscribers get
        them through ``replay``). With ``redo_from`` (the global iteration the run resumes
        at: its checkpoint's, or 0), iteration rows from it on and epoch rows after it are
        provisional: each is replaced when the resumed run sends its own row with that key,
        and dropped if the run completes without one."""
        rows = list(rows)
        with self._lock:
            self._add_rows(rows)
            self._undelivered = []
            if redo_from is not None:
                self._provisional = {row_key(r) for r in rows if _redone(r, redo_from)}

    def _add_rows(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            key = row_key(row)
            at = self._index.get(key)
            if at is None:
                self._index[key] = len(self._rows)
                self._rows.append(row)
            elif key in self._provisional:  # the resumed run's own row for a stored one
                self._provisional.discard(key)
                self._rows[at] = row
                self._frame_cache = None
            else:
                continue
            self._undelivered.append(row)
            self._unjournaled.append(row)

    def _reindex(self) -> None:
        """Rebuild the key index after ``_rows`` was filtered (lock held)."""
        self._index = {row_key(r): i for i, r in enumerate(self._rows)}
        self._provisional &= set(self._index)
        self._frame_cache = None

    def take_unjournaled(self) -> list[dict[str, Any]]:
        """The rows that arrived since the previous call (the journal writes them)."""
        with self._lock:
            rows, self._unjournaled = self._unjournaled, []
        return rows

    def return_unjournaled(self, rows: list[dict[str, Any]]) -> None:
        """Put back rows a failed write did not store (they go into the next part)."""
        with self._lock:
            self._unjournaled = rows + self._unjournaled

    def attach_progress(self, bar: Any) -> None:
        """A progress bar (a subscriber with ``close(status)``), closed when the run ends."""
        with self._lock:
            self._progress = bar
            self._subscribers.append(bar)

    def deliver(self) -> None:
        """Hand the rows that arrived since the last call to every subscriber."""
        with self._lock:
            if not self._undelivered:
                return
            rows, self._undelivered = self._undelivered, []
            subscribers = list(self._subscribers)
        frame = rows_to_frame(rows)
        for callback in subscribers:
            safe_call(callback, frame)


def row_key(row: dict[str, Any]) -> tuple[Any, Any, Any]:
    """A row's identity in the store: (kind, rank, iteration)."""
    return (row.get("kind"), row.get("rank"), row.get("iteration"))


def _redone(row: dict[str, Any], iteration: int) -> bool:
    """Whether a run resumed at global ``iteration`` produces this row again (an epoch row
    carries the iteration that ends its epoch, so the checkpointed epoch's row is kept)."""
    it = row.get("iteration")
    if not isinstance(it, (int, float)) or it != it:
        return False
    return it > iteration if row.get("kind") == "epoch" else it >= iteration
