"""What a Lab's run holds in its results folder, from ``Lab.submit`` to its end.

Client side; used by the Lab's monitor (:mod:`~gtopk_lab.orchestration.monitor`), which
decides when. :class:`FolderClaims` is the bookkeeping of one Lab:

1. :meth:`~FolderClaims.admit` (``Lab.submit``, before anything of the run is written): the
   run folder's lock (:func:`~gtopk_lab.orchestration.locks.lock_run`; another client's run
   id: ``ValueError``) and its first heartbeat (the journal keeps it going);
   :meth:`~FolderClaims.abandon` undoes it for a run that was not queued after all;
2. :meth:`~FolderClaims.claim_point` (a study point about to start): the point's lock, and
   whether another client completed the point meanwhile (its record, checked against the
   stored run's config hash and status);
3. :meth:`~FolderClaims.end_as` (such a point): the queued folder this Lab wrote is removed
   (its known files only), the stored run gets the handle's study and tags recorded
   (:func:`~gtopk_lab.orchestration.run_identity.record_labels`) and the handle ends as it;
4. :meth:`~FolderClaims.let_go` (the run ended, after its final summary): the journal stops,
   a completed point is recorded for other clients, both locks are released.

Cost: a few small file operations per run; reading the stored run once for a point another
client completed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from gtopk_lab.orchestration import locks as _locks
from gtopk_lab.orchestration import results as _results
from gtopk_lab.orchestration import run_identity as _identity
from gtopk_lab.orchestration.journal import RunJournal
from gtopk_lab.orchestration.run_stream import drop_heartbeat

__all__ = ["FolderClaims"]

logger = logging.getLogger("gtopk_lab.orchestration.lab")

#: The files a queued run's folder holds before it starts (all a run ended as another
#: client's completed run leaves behind, and removes).
_QUEUED_FILES = (_results.CONFIG_FILE, _results.SUMMARY_FILE, _results.HEARTBEAT_FILE,
                 _results.LOCK_FILE)


class FolderClaims:
    """Run-folder and study-point claims of one Lab's runs (see the module docstring)."""

    def __init__(self, out: str, journal: RunJournal) -> None:
        self.out = Path(out)
        self.journal = journal

    def admit(self, handle: Any) -> None:
        """Take the run folder's lock (``ValueError`` naming the client that holds it) and
        write its first heartbeat."""
        handle.run_lock = _locks.lock_run(self.out / handle.run_id)
        try:
            self.journal.track(handle)
        except BaseException:
            self.abandon(handle)
            raise

    def abandon(self, handle: Any) -> None:
        """Undo :meth:`admit` for a run that was not queued after all."""
        self.journal.forget(handle)
        drop_heartbeat(self.out / handle.run_id)
        self.let_go(handle)

    def claim_point(self, handle: Any) -> Any:
        """The point lock of a queued study point: True when this Lab holds it now, False
        while another client (or run) holds it, or the stored run that completed the point
        meanwhile (the lock is then given back)."""
        held = _locks.try_lock_point(self.out, handle.point_key)
        if held is None:
            return False
        done = self._completed(handle, _locks.point_record(self.out, handle.point_key))
        if done is None:
            handle.point_lock = held
            return True
        held.release()
        return done

    def _completed(self, handle: Any, run_id: str | None) -> Any:
        if run_id is None or run_id == handle.run_id:
            return None
        try:
            stored = _results.read_run(self.out / run_id)
        except (_results.DamagedRun, OSError):
            return None
        same = stored.config_hash is not None and _results.point_key(
            stored.config_hash, stored.source) == handle.point_key
        return stored if same and stored.status == "completed" else None

    def end_as(self, handle: Any, stored: Any) -> None:
        """``handle`` never started and ``stored`` completed its point: remove the queued
        folder it wrote, end it as that run (call ``handle.mark_done()`` next)."""
        self.journal.forget(handle)
        folder = self.out / handle.run_id
        for name in _QUEUED_FILES:
            (folder / name).unlink(missing_ok=True)
        try:
            folder.rmdir()
        except OSError:  # something else is in it: leave it
            pass
        self.let_go(handle)
        # the completed run now belongs to this handle's study too (its summary says so)
        labelled = None
        for labels in [handle.labels, *handle.shared_labels]:  # and every study that follows it
            if labels.study_id or labels.tags:
                labelled = _identity.record_labels(stored.path, labels) or labelled
        handle.adopt(stored.path.name, dict(labelled or stored.summary or {}), stored.metrics.to_dict("records"))

    def let_go(self, handle: Any) -> None:
        """An ended run gives up its folder: the journal stops, a completed study point is
        recorded for other clients, the point and run locks are released."""
        self.journal.forget(handle)
        if handle.point_lock is not None:
            if handle.status == "completed":
                try:
                    _locks.record_point(self.out, handle.point_key, handle.run_id)
                except OSError as exc:  # the point stays findable by its summary
                    logger.warning("could not record point %s of %s: %s", handle.point_key,
                                   handle.run_id, exc)
            handle.point_lock.release()
            handle.point_lock = None
        if handle.run_lock is not None:
            handle.run_lock.release()
            handle.run_lock = None
