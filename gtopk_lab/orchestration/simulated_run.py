"""A run of the single-process simulator, stored like a Dask run and as crash-safe.

``gtopk-lab run --simulate`` (and anyone with a config and a results folder) calls
:func:`simulate_run`. The run's folder gets what a Lab's journal gives a Dask run
(:mod:`gtopk_lab.orchestration.run_stream`), so a SIGKILLed client leaves a run that
readers list as ``crashed`` with its rows, and ``--resume`` continues it:

1. ``config.json``, then a heartbeat and a ``running`` summary, before the first iteration;
2. while it runs, a daemon thread every :func:`~gtopk_lab.orchestration.journal.flush_interval_s`
   of ``timeout_s`` writes the rows produced since its last part as ``parts/part-<seq>.parquet``
   and rewrites the heartbeat; the simulator's thread appends rows to a list, and writes the
   part itself when a batch holds an epoch row (the first batch after a checkpoint), so that
   a checkpoint's saved rows (those since the previous checkpoint) and the parts leave no gap;
3. at the end, ``metrics.parquet`` with every row and the final summary
   (:func:`~gtopk_lab.orchestration.results.write_run`, which drops parts and heartbeat).

Cost: one part write and one heartbeat per flush interval (O(rows since the last part)),
on another thread; the simulator's loop pays one list append under a lock per sink call.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any

from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration import results as store
from gtopk_lab.orchestration.journal import flush_interval_s
from gtopk_lab.orchestration.run_stream import next_part_seq, write_heartbeat, write_part

__all__ = ["SIMULATED_TIMEOUT_S", "simulate_run"]

#: Heartbeat timeout of a simulated run when none is given: a reader calls it crashed after this.
SIMULATED_TIMEOUT_S = 60.0


class _RowStream:
    """The rows of one simulated run, and the thread that streams them to its folder."""

    def __init__(self, folder: Any, timeout_s: float) -> None:
        self.folder, self.timeout_s = folder, float(timeout_s)
        self.rows: list[dict[str, Any]] = []
        self._written = 0
        self._seq = next_part_seq(folder)
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gtopk-lab-simulated-run", daemon=True)

    def extend(self, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            self.rows.extend(rows)
        # An epoch row comes with the first batch after a checkpoint; writing the part now puts
        # every row handed over before that checkpoint on disk before the next one is taken,
        # and the next one carries the rows since this one: a kill loses no row between them.
        if any(row.get("kind") == "epoch" for row in rows):
            self.flush()

    def start(self) -> None:
        write_heartbeat(self.folder, self.timeout_s)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)

    def _loop(self) -> None:
        while not self._stop.wait(flush_interval_s(self.timeout_s)):
            self.flush()

    def flush(self) -> None:
        """Write the rows handed over since the last part, then the heartbeat."""
        with self._write_lock:
            with self._lock:
                fresh = self.rows[self._written:]
            try:
                if fresh:
                    write_part(self.folder, fresh, self._seq)
                    self._seq += 1
                    self._written += len(fresh)
                write_heartbeat(self.folder, self.timeout_s)
            except OSError:  # a full or vanished disk: the run goes on; its end writes every row
                pass


def simulate_run(config: RunConfig, out: str, resume_at: dict[str, int] | None = None,
                 timeout_s: float = SIMULATED_TIMEOUT_S) -> dict[str, Any]:
    """Run ``config`` with the single-process simulator and store it like a Dask run.

    With ``config.checkpoint`` the simulator writes epoch checkpoints to
    ``<out>/<run_id>/checkpoints``. ``resume_at`` (the checkpoint's ``latest.json``)
    continues from that checkpoint and keeps the stored rows before it (those of
    ``metrics.parquet`` and of the parts a crashed client streamed). Rows produced before a
    failure are stored with the failed run. ``timeout_s``: the heartbeat's timeout.
    """
    from gtopk_lab.training.simulator import simulate

    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r} is invalid: expected seconds > 0")
    if config.run_id is None:
        config = config.replace(run_id=store.new_run_id(config))
    run_store = store.RunStore(out, config.run_id)
    earlier = run_store.read_summary()  # a resumed run keeps its study and tags (run_identity)
    folder = store.checkpoint_folder(out, config.run_id)
    kept = (store.rows_kept_on_resume(run_store.read_metrics(), folder, resume_at).to_dict("records")
            if resume_at is not None else [])
    started = store.utc_now()
    run_store.write_config(config)
    stream = _RowStream(run_store.path, timeout_s)
    stream.start()
    run_store.write_summary(store.run_summary(config, None, status="running", identity=earlier,
                                              extra={"started_at": started, "simulated": True}))
    try:
        result = simulate(config, sink=stream.extend,
                          checkpoint_dir=folder if config.checkpoint else None,
                          resume_from=folder if resume_at is not None else None)
        rows, rank0, status, error = kept + list(result.rows), dict(result.summary), "completed", None
    except Exception as exc:  # a failed simulation is a failed run, stored as such
        rows, rank0, status = kept + stream.rows, None, "failed"
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    finally:
        stream.stop()
    summary = store.run_summary(config, rank0, status=status, error=error, identity=earlier,
                                extra={"started_at": started, "finished_at": store.utc_now(),
                                       "simulated": True})
    store.write_run(out, config, store.rows_to_frame(rows), summary)
    return summary
