"""``Lab``: run gtopk-lab training runs on a Dask cluster and watch them live.

Client side. A :class:`Lab` owns one ``distributed.Client``: either to an embedded
``LocalCluster`` (one process per worker, one thread each, everything on 127.0.0.1)
or to a scheduler address (``tcp://`` or ``tls://`` with a ``Security`` object or
certificate files). :meth:`Lab.submit` turns a :class:`~gtopk_lab.config.RunConfig`
into P rank tasks and returns a :class:`RunHandle`.

How a run is placed and watched:

1. **Reservation.** The workers of a run are reserved in one table on the scheduler,
   shared by every client (:mod:`~gtopk_lab.orchestration.reservations`): all P at
   once or none, and a worker another run holds or that processes any other task is
   not free. A run starts on P free, distinct workers (GPU workers, those with resource
   ``GPU >= 1``, when the run wants CUDA); otherwise it waits in a FIFO queue, saying
   why (``RunHandle.queue_reason``). Runs therefore never share a worker, whichever
   client submitted them, and each has its own rendezvous
   (``gtopk_lab.worker.rank_task``). A cluster with fewer than P eligible workers fails
   at once with ``ValueError`` (or waits, if asked).
2. **Tasks.** ``client.submit(run_rank, ..., workers=[addr], allow_other_workers=False,
   pure=False, retries=0)``, one per rank.
3. **Live metrics.** Each rank's sink calls ``Worker.log_event("gtopk-<run_id>", rows)``;
   the handler registered with ``Client.subscribe_topic`` appends the rows to the
   handle. A monitor thread hands new rows (as a DataFrame) to the subscribers, so
   slow subscribers (plots) never block the client's event loop.
4. **Failures.** The monitor polls every ``poll_interval_s``: a rank's exception
   fails the run with the earliest failing rank's error and traceback; a reserved
   worker that leaves the cluster (killed, OOM) fails the run naming the lost rank;
   surviving ranks fail fast because gloo sees the dead peer, or at the latest after
   ``timeout_s``. The task pinned to the dead worker is cancelled (it would otherwise
   wait forever) and the workers are released for the next run.
5. **Results.** At the end the run folder ``<out>/<run_id>/`` is written atomically
   (``gtopk_lab.orchestration.results``): all ranks' rows when the run completed, the
   rows streamed so far when it failed or was cancelled.

The pieces: this module is the user-facing ``Lab`` (connect, submit, cancel, close,
results); :mod:`~gtopk_lab.orchestration.lab_studies` its studies, sweeps and tuning;
:mod:`~gtopk_lab.orchestration.cluster` connects and picks eligible workers; :mod:`~gtopk_lab.orchestration.monitor` holds the queue, the reservations and
the monitor thread (steps 1-5); :mod:`~gtopk_lab.orchestration.handle` is ``RunHandle``.
``RunHandle``, ``RunFailed``, ``SchedulerUnreachable`` and ``validate_scheduler_address``
stay importable from here.

Example::

    from gtopk_lab.config import RunConfig
    from gtopk_lab.orchestration import Lab

    with Lab(n_workers=4) as lab:               # out: the results home (gtopk_lab.results_home)
        handle = lab.submit(RunConfig(method="gtopk", workers=4, density=0.01, max_iterations=50))
        handle.subscribe(lambda rows: print(len(rows), "new rows"))
        metrics, summary = handle.result()
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from gtopk_lab.config import RunConfig
from gtopk_lab.network.model import portable_bandwidth
from gtopk_lab.orchestration import results as _results
from gtopk_lab.orchestration.arguments import check_bool, check_optional_bool, check_seconds
from gtopk_lab.orchestration.cluster import (
    SchedulerUnreachable,
    connect,
    eligible_workers,
    install_method_plugins,
    validate_scheduler_address,
    wants_cuda,
    worker_info,
)
from gtopk_lab.orchestration.handle import FAILURE_SETTLE_S, RunFailed, RunHandle, Subscriber
from gtopk_lab.orchestration.lab_studies import StudyLauncher
from gtopk_lab.orchestration.monitor import RunMonitor
from gtopk_lab.orchestration.run_identity import (
    RunLabels, filter_runs, labels_of, run_labels, study_order, with_labels,
)
from gtopk_lab.results_home import results_home
from gtopk_lab.worker.rank_task import topic_for

__all__ = ["Lab", "RunHandle", "RunFailed", "SchedulerUnreachable", "validate_scheduler_address",
           "DEFAULT_TIMEOUT_S", "FAILURE_SETTLE_S", "Subscriber"]

#: Default seconds a rank waits for a peer (rendezvous, collectives) and the bound on
#: how long a failure may take to be reported.
DEFAULT_TIMEOUT_S = 60.0


class Lab(StudyLauncher):
    """A Dask cluster that runs gtopk-lab runs; see the module docstring. Its grids
    (``study``, ``sweep``, ``tune``, ``share_point``) are
    :class:`~gtopk_lab.orchestration.lab_studies.StudyLauncher`'s.

    Parameters
    ----------
    scheduler:
        ``tcp://HOST:PORT`` or ``tls://HOST:PORT`` of a running scheduler; None starts
        an embedded ``LocalCluster``.
    n_workers:
        Workers of the embedded cluster (default 4). Ignored with ``scheduler``.
    security:
        ``distributed.security.Security`` for ``tls://`` (or give the three file paths).
    out:
        Results folder; each run writes ``<out>/<run_id>/``. Default: the results home
        (:func:`gtopk_lab.results_home.results_home`: ``$GTOPK_LAB_RESULTS``, else
        ``results/`` of the gtopk-lab project around the current folder, else ``./results``),
        the folder the notebooks, the panel and every CLI command use too.
    timeout_s:
        Rendezvous and collective timeout of every rank, and so the longest a failure
        can take to be noticed by the surviving ranks.
    progress:
        Show a tqdm progress bar per run (and per sweep) by default.
    resources:
        Resources of each embedded worker, e.g. ``{"GPU": 1}``.
    train_fn:
        The per-rank training function (default ``gtopk_lab.training.loop.train_rank``);
        must be importable on the workers. Tests use it to inject failures.
    """

    def __init__(
        self,
        scheduler: str | None = None,
        n_workers: int | None = None,
        security: Any = None,
        out: str | os.PathLike[str] | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        progress: bool = False,
        tls_ca_file: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        resources: dict[str, float] | None = None,
        connect_timeout_s: float = 10.0,
        poll_interval_s: float = 0.25,
        train_fn: Callable[..., Any] | None = None,
        client: Any = None,
    ) -> None:
        if n_workers is not None and (isinstance(n_workers, bool) or not isinstance(n_workers, int)
                                      or n_workers < 1):
            raise ValueError(f"n_workers={n_workers!r} is invalid: expected an integer >= 1")
        self.out = str(results_home() if out is None else out)
        self.timeout_s = check_seconds("timeout_s", timeout_s)
        self.progress = check_bool("progress", progress)
        self.poll_interval_s = check_seconds("poll_interval_s", poll_interval_s, high=60.0)
        check_seconds("connect_timeout_s", connect_timeout_s)
        self.train_fn = train_fn
        self.cluster: Any = None
        self._own_client = client is None
        if client is not None:
            self.client = client
        else:
            self.client, self.cluster = connect(
                scheduler, n_workers, security, tls_ca_file=tls_ca_file, tls_cert=tls_cert,
                tls_key=tls_key, resources=resources, connect_timeout_s=connect_timeout_s)
        install_method_plugins(self.client)
        self._monitor = RunMonitor(self.client, self.out, timeout_s=self.timeout_s,
                                   poll_interval_s=self.poll_interval_s, train_fn=self.train_fn)
        self._monitor.start()

    # --- context manager ---------------------------------------------------------------
    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "LocalCluster" if self.cluster is not None else getattr(self.client, "scheduler", None)
        return f"Lab({where}, workers={len(self.worker_info())}, out={self.out!r})"

    @property
    def dashboard_link(self) -> str | None:
        """URL of the Dask dashboard (None when the scheduler has none)."""
        try:
            return self.client.dashboard_link
        except Exception:
            return None

    def close(self) -> None:
        """Cancel queued and running runs, stop the monitor, close client and cluster."""
        if self._monitor.closed:
            return
        handles = self._monitor.handles()
        for handle in handles:
            if not handle.done():
                self._cancel(handle)
        deadline = time.monotonic() + 5.0
        for handle in handles:
            handle.wait(max(0.0, deadline - time.monotonic()))
        self._monitor.stop(join_timeout_s=5.0)
        for handle in handles:  # anything still running is abandoned
            if not handle.done():
                self._monitor.finish(handle, "cancelled", "the Lab was closed while the run was running")
        if self._own_client:
            try:
                self.client.close()
            except Exception:
                pass
        if self.cluster is not None:
            try:
                self.cluster.close()
            except Exception:
                pass

    # --- cluster view ------------------------------------------------------------------
    def worker_info(self) -> dict[str, dict[str, Any]]:
        """``{address: info}`` of all workers, fetched fresh from the scheduler."""
        return worker_info(self.client)

    def run_active(self, run_id: str) -> bool:
        """Whether this Lab has a queued or running run ``run_id`` (a cancelled one stays
        active until its ranks have stopped)."""
        return self._monitor.is_active(str(run_id))

    # --- submit ------------------------------------------------------------------------
    def submit(self, config: RunConfig | dict[str, Any], wait_for_workers: bool = False,
               timeout_s: float | None = None, progress: bool | None = None,
               resume: bool = False, simulate: bool = False, skip_completed: bool = False,
               labels: RunLabels | dict[str, Any] | None = None) -> RunHandle:
        """Queue a run and return its :class:`RunHandle` at once.

        ``simulate=True`` runs the P ranks in the simulator, as one Dask task on one free
        worker (``worker.sim_task``; P may exceed the cluster): same rows, live events,
        cancel and run folder as a real run, with ``source: "simulated"`` in the summary.

        With ``config.checkpoint`` the ranks save epoch checkpoints under
        ``<out>/<run_id>/checkpoints`` (a path the workers must reach: shared or local
        disk). ``resume=True`` (needs ``config.run_id``) continues a failed, cancelled or
        crashed run from the newest complete checkpoint there, if any, else from iteration
        0, keeping every stored row: those the resumed run recomputes are replaced as its
        own arrive. While the run is queued or runs its rows stream into its folder and
        its heartbeat is written (``orchestration.journal``); the folder is locked, so a
        run id another client is running gives ``ValueError``.

        ``skip_completed=True`` makes the run a study's point (``Lab.study``, ``Lab.sweep``):
        it does not start while another client runs the same point (config hash and source)
        into this results folder, and if that run completed, this one ends as it (its run
        id, rows and summary, ``summary["skipped"]``) without running.

        ``labels`` (``{"study_id": ..., "tags": [...], "varied": {...}}``, each optional; a
        study passes its own) go into every summary of the run, beside the config: its hash,
        and so the point, do not change (:mod:`~gtopk_lab.orchestration.run_identity`). A
        resumed run keeps the labels it had and adds these.

        ``timeout_s`` (default the Lab's) is this run's rendezvous/collective timeout
        and, with ``wait_for_workers=True``, how long to wait for the cluster to have
        ``config.workers`` eligible workers. Without it, too few workers raise
        ``ValueError`` naming how many there are. Runs that find too few *free*
        workers wait in a FIFO queue.
        """
        if self._monitor.closed:
            raise RuntimeError("this Lab is closed")
        if isinstance(config, dict):
            config = RunConfig.from_dict(config)
        if not isinstance(config, RunConfig):
            raise TypeError(f"config={config!r} has type {type(config).__name__}: expected RunConfig")
        # every argument checked before anything is written or submitted
        timeout_s = self.timeout_s if timeout_s is None else check_seconds("timeout_s", timeout_s)
        for name, flag in (("wait_for_workers", wait_for_workers), ("resume", resume), ("simulate", simulate),
                           ("skip_completed", skip_completed)):
            check_bool(name, flag)
        check_optional_bool("progress", progress)
        labels = run_labels(labels)
        # built and hashed once: the hash leaves out the run id and hashes a calibration-file
        # bandwidth as its constants, so neither change below moves it
        digest = _results.config_hash(config)
        changes: dict[str, Any] = {}
        if config.run_id is None:
            changes["run_id"] = _results.new_run_id(config, digest)
        # a calibration file is read here: workers get its constants, not a path they may lack
        bandwidth = portable_bandwidth(config.bandwidth)
        if bandwidth != config.bandwidth:
            changes["bandwidth"] = bandwidth
        if changes:
            config = config.replace(**changes)
        if self._monitor.is_active(str(config.run_id)):
            raise ValueError(f"run_id={config.run_id!r} is invalid: a run with this id is active")
        self._check_capacity(config.replace(workers=1) if simulate else config, wait_for_workers,
                             timeout_s)

        handle = RunHandle(self, config, timeout_s, simulated=simulate, skip_completed=skip_completed,
                           digest=digest)
        store = _results.RunStore(self.out, handle.run_id)
        handle.labels = labels
        handle.identity = labels_of(with_labels({}, labels, earlier=store.read_summary() if resume else None))
        self._monitor.admit(handle)  # the folder's lock, then its first heartbeat
        try:
            if resume:
                from gtopk_lab.training.checkpoint import check_rank_files, read_latest

                folder = _results.checkpoint_folder(self.out, handle.run_id)
                latest = read_latest(folder)  # a damaged checkpoint: one line, nothing written
                if latest is not None:
                    check_rank_files(folder, latest)
                handle.resume = latest is not None
                stored = _results.rows_on_resume(store.read_metrics(), folder, latest)
                handle.preload_rows(stored.to_dict("records"), redo_from=latest["iteration"] if latest else 0)
            store.write_config(config, digest)
            store.write_summary(_results.run_summary(config, None, status="queued", identity=handle.identity,
                                                     extra={"submitted_at": handle.submitted_at, **handle.source_fields},
                                                     digest=digest))
            self.client.subscribe_topic(topic_for(handle.run_id), handle.on_event)
        except BaseException:
            self._monitor.abandon(handle)
            raise
        if self.progress if progress is None else progress:
            from gtopk_lab.orchestration.progress import RunProgress

            handle.attach_progress(RunProgress(config))
        self._monitor.enqueue(handle)
        return handle

    def run(self, config: RunConfig | dict[str, Any], **kwargs: Any) -> tuple[pd.DataFrame, dict[str, Any]]:
        """``submit(config, **kwargs).result()``."""
        return self.submit(config, **kwargs).result()

    def _check_capacity(self, config: RunConfig, wait: bool, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            workers = self.worker_info()
            eligible = eligible_workers(config, workers)
            if len(eligible) >= config.workers:
                return
            kind = "GPU " if wants_cuda(config, workers) else ""
            msg = (f"workers={config.workers} is more than the {len(eligible)} {kind}Dask worker(s) "
                   f"of this cluster: start more workers or use fewer ranks (or simulate)")
            if not wait:
                raise ValueError(msg)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{msg}; waited {timeout_s:.0f} s")
            time.sleep(0.5)

    # --- what a RunHandle asks of its Lab (handle.HandleOwner) --------------------------
    def _post(self, fn: Callable[[], None]) -> None:
        self._monitor.post(fn)

    def _cancel(self, handle: RunHandle) -> None:
        self._monitor.cancel(handle)

    # --- results -----------------------------------------------------------------------
    def runs(self, study: str | Sequence[str] | None = None,
             tag: str | Sequence[str] | None = None) -> pd.DataFrame:
        """Summaries of every run stored under ``out`` (see ``results.load_summaries``), each
        study's runs together (studies in the order they began, runs without one last);
        ``study``/``tag`` keep the runs of that study (any of several) / with that tag
        (every one of several): :func:`~gtopk_lab.orchestration.run_identity.filter_runs`."""
        return study_order(filter_runs(_results.load_summaries(self.out), study, tag))

    def load(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """``(summaries, metrics)`` of every run under ``out``."""
        return _results.load_runs(self.out)
