"""``Lab``: run gtopk-lab training runs on a Dask cluster and watch them live.

Client side. A :class:`Lab` owns one ``distributed.Client``: either to an embedded
``LocalCluster`` (one process per worker, one thread each, everything on 127.0.0.1)
or to a scheduler address (``tcp://`` or ``tls://`` with a ``Security`` object or
certificate files). :meth:`Lab.submit` turns a :class:`~gtopk_lab.config.RunConfig`
into P rank tasks and returns a :class:`RunHandle`.

How a run is placed and watched:

1. **Reservation.** The Lab keeps a client-side table of the workers its running
   runs hold, and also treats a worker that is processing any task (for example a
   rank of another client's run) as busy. A run starts on P free, distinct workers
   (GPU workers, those with resource ``GPU >= 1``, when the run wants CUDA); otherwise
   it waits in a FIFO queue. Runs therefore never share a worker, and each has its
   own rendezvous (``gtopk_lab.worker.rank_task``). A cluster with fewer than
   P eligible workers fails at once with ``ValueError`` (or waits, if asked).
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

Example::

    from gtopk_lab.config import RunConfig
    from gtopk_lab.orchestration import Lab

    with Lab(n_workers=4, out="results") as lab:
        handle = lab.submit(RunConfig(method="gtopk", workers=4, density=0.01, max_iterations=50))
        handle.subscribe(lambda rows: print(len(rows), "new rows"))
        metrics, summary = handle.result()
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from gtopk_lab.config import RunConfig
from gtopk_lab.methods.registry import load_plugins, plugin_modules
from gtopk_lab.network.model import portable_bandwidth
from gtopk_lab.orchestration import results as _results
from gtopk_lab.worker.plugins import MethodPlugins, single_file_plugins
from gtopk_lab.worker.rank_task import (
    RankFailed,
    mark_cancelled,
    rendezvous_name,
    run_rank,
    topic_for,
)

logger = logging.getLogger(__name__)

#: Default seconds a rank waits for a peer (rendezvous, collectives) and the bound on
#: how long a failure may take to be reported.
DEFAULT_TIMEOUT_S = 60.0
#: After the first failure is seen, how long to wait for the other ranks' errors so
#: that the earliest (root-cause) error is the one reported.
FAILURE_SETTLE_S = 2.0

Subscriber = Callable[[pd.DataFrame], None]


class SchedulerUnreachable(ConnectionError):
    """The scheduler address could not be reached within the connect timeout."""


class RunFailed(RuntimeError):
    """Raised by ``RunHandle.result(raise_on_failure=True)`` for a failed/cancelled run."""


@dataclass
class _RankError:
    rank: int
    worker: str
    message: str
    traceback: str
    failed_at: float


# ------------------------------------------------------------------------------------------
class RunHandle:
    """A submitted run: status, live metrics, subscribers, cancel and result.

    ``status`` goes ``queued -> running -> completed | failed | cancelled``.
    ``metrics`` is the DataFrame of rows received so far (all ranks; after completion,
    every row of every rank). Subscribers are called from the Lab's monitor thread
    with a DataFrame of the rows that are new since their previous call.
    """

    def __init__(self, lab: "Lab", config: RunConfig, timeout_s: float) -> None:
        self.lab = lab
        self.config = config
        self.run_id: str = str(config.run_id)
        self.timeout_s = float(timeout_s)
        self.status: str = "queued"
        self.error: str | None = None
        self.summary: dict[str, Any] | None = None
        self.workers: list[str] = []
        self.device: str = "cpu"
        self.submitted_at = _results.utc_now()
        self.started_at: str | None = None
        self.finished_at: str | None = None
        self._lock = threading.RLock()
        self._done = threading.Event()
        self._rows: list[dict[str, Any]] = []
        self._frame_cache: pd.DataFrame | None = None
        self._undelivered: list[dict[str, Any]] = []
        self._seen_keys: set[tuple[Any, Any, Any]] = set()
        self._subscribers: list[Subscriber] = []
        # internal run state (owned by the Lab's monitor thread)
        self._futures: list[Any] = []
        self._key = ""
        self._errors: dict[int, _RankError] = {}
        self._lost: dict[int, str] = {}
        self._first_error_at: float | None = None
        self._cancel_requested = False
        self._cancel_deadline: float | None = None
        self._drain_deadline: float | None = None
        self._released = False
        self._progress: Any = None
        self._resume = False          # continue from <out>/<run_id>/checkpoints (Lab.submit)

    # --- public ------------------------------------------------------------------------
    def __repr__(self) -> str:
        return (f"RunHandle(run_id={self.run_id!r}, status={self.status!r}, "
                f"rows={len(self._rows)}, workers={self.workers})")

    @property
    def metrics(self) -> pd.DataFrame:
        """All metric rows received so far, as a DataFrame (a fresh copy-safe frame)."""
        with self._lock:
            if self._frame_cache is None or len(self._frame_cache) != len(self._rows):
                self._frame_cache = _results.rows_to_frame(list(self._rows))
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
                self.lab._post(lambda: _safe_call(callback, _results.rows_to_frame(rows)))

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the run ends; False if ``timeout_s`` passed first."""
        return self._done.wait(timeout_s)

    def result(self, timeout_s: float | None = None, raise_on_failure: bool = False
               ) -> tuple[pd.DataFrame, dict[str, Any]]:
        """``(metrics, summary)`` once the run has ended (any status).

        ``summary["status"]`` tells how it ended; with ``raise_on_failure=True`` a failed
        or cancelled run raises :class:`RunFailed` with the error instead.
        """
        if not self._done.wait(timeout_s):
            raise TimeoutError(f"run {self.run_id} still {self.status} after {timeout_s} s")
        assert self.summary is not None
        if raise_on_failure and self.status != "completed":
            raise RunFailed(f"run {self.run_id} {self.status}: {self.error}")
        return self.metrics, dict(self.summary)

    def cancel(self) -> None:
        """Cancel the run: a queued run ends at once; a running one stops at its ranks'
        next sink call (or is abandoned after ``timeout_s``)."""
        self.lab._cancel(self)

    # --- called by the Lab -------------------------------------------------------------
    def _on_event(self, event: Any) -> None:
        """subscribe_topic handler (runs on the client's event loop: keep it cheap)."""
        msg = event[1] if isinstance(event, (tuple, list)) and len(event) == 2 else event
        rows = msg.get("rows") if isinstance(msg, dict) else None
        if not rows:
            return
        with self._lock:
            if self.done():
                return
            self._add_rows(rows)

    def _add_rows(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            key = (row.get("kind"), row.get("rank"), row.get("iteration"))
            if key in self._seen_keys:
                continue
            self._seen_keys.add(key)
            self._rows.append(row)
            self._undelivered.append(row)

    def _deliver(self) -> None:
        with self._lock:
            if not self._undelivered:
                return
            rows, self._undelivered = self._undelivered, []
            subscribers = list(self._subscribers)
        frame = _results.rows_to_frame(rows)
        for callback in subscribers:
            _safe_call(callback, frame)


def _safe_call(callback: Callable[..., Any], *args: Any) -> None:
    try:
        callback(*args)
    except Exception as exc:  # a broken plot must not stop the run
        warnings.warn(f"run subscriber {callback!r} raised {type(exc).__name__}: {exc}",
                      RuntimeWarning, stacklevel=2)


# ------------------------------------------------------------------------------------------
def _security_from_files(tls_ca_file: str | None, tls_cert: str | None, tls_key: str | None) -> Any:
    from pathlib import Path

    import dask.config
    from distributed.security import Security

    if tls_ca_file is None and tls_cert is None and tls_key is None \
            and dask.config.get("distributed.comm.tls.ca-file", None):
        # No files given, but the Dask config (e.g. cluster/dask/client.yaml in
        # DASK_CONFIG) names them: Security() reads it.
        return Security()
    for name, value in (("tls_ca_file", tls_ca_file), ("tls_cert", tls_cert), ("tls_key", tls_key)):
        if value is None:
            raise ValueError(f"{name}=None is invalid: a tls:// scheduler needs --tls-ca-file, "
                             "--tls-cert and --tls-key (or a Security object)")
        if not Path(value).is_file():
            raise ValueError(f"{name}={value!r} is invalid: no such file")
    return Security(tls_ca_file=tls_ca_file, tls_client_cert=tls_cert, tls_client_key=tls_key,
                    require_encryption=True)


def validate_scheduler_address(address: str) -> str:
    """``tcp://host:port`` / ``tls://host:port`` (``host:port`` means tcp); else ValueError."""
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"scheduler={address!r} is invalid: expected tcp://HOST:PORT or tls://HOST:PORT")
    address = address.strip()
    if "://" not in address:
        address = "tcp://" + address
    scheme, rest = address.split("://", 1)
    host, _, port = rest.rpartition(":")
    if scheme not in ("tcp", "tls") or not host or not port.isdigit() or not (0 < int(port) < 65536):
        raise ValueError(f"scheduler={address!r} is invalid: expected tcp://HOST:PORT or tls://HOST:PORT")
    return address


class Lab:
    """A Dask cluster that runs gtopk-lab runs; see the module docstring.

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
        Results folder; each run writes ``<out>/<run_id>/``.
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
        out: str = "results",
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
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r} is invalid: expected a number > 0")
        self.out = str(out)
        self.timeout_s = float(timeout_s)
        self.progress = bool(progress)
        self.poll_interval_s = float(poll_interval_s)
        self.train_fn = train_fn
        self.cluster: Any = None
        self._own_client = client is None
        self._lock = threading.RLock()
        self._pending: list[RunHandle] = []
        self._active: list[RunHandle] = []
        self._reserved: dict[str, str] = {}
        self._posted: list[Callable[[], None]] = []
        self._closed = False
        self._wake = threading.Event()

        from distributed import Client

        if client is not None:
            self.client = client
        elif scheduler is None:
            from distributed import LocalCluster

            self.cluster = LocalCluster(
                n_workers=n_workers or 4, threads_per_worker=1, processes=True, host="127.0.0.1",
                dashboard_address="127.0.0.1:0", resources=resources, silence_logs=logging.ERROR,
                security=security,
            )
            self.client = Client(self.cluster, security=security)
        else:
            address = validate_scheduler_address(scheduler)
            if address.startswith("tls://") and security is None:
                security = _security_from_files(tls_ca_file, tls_cert, tls_key)
            try:
                self.client = Client(address, security=security, timeout=connect_timeout_s)
            except (OSError, TimeoutError) as exc:
                raise SchedulerUnreachable(
                    f"scheduler={address!r} is unreachable within {connect_timeout_s:.0f} s: {exc}"
                ) from None
        self._install_method_plugins()
        self._monitor = threading.Thread(target=self._monitor_loop, name="gtopk-lab-monitor", daemon=True)
        self._monitor.start()

    def _install_method_plugins(self) -> None:
        """Make the client's ``$GTOPK_LAB_METHODS`` plugins importable and imported on every
        worker before any rank starts (gtopk_lab.worker.plugins)."""
        load_plugins()  # a broken plugin fails here, on the client, with one line
        modules = plugin_modules()
        if not modules:
            return
        for path in single_file_plugins(modules):
            self.client.upload_file(path)
        self.client.register_plugin(MethodPlugins(modules))

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
        if self._closed:
            return
        with self._lock:
            handles = list(self._pending) + list(self._active)
        for handle in handles:
            if not handle.done():
                self._cancel(handle)
        deadline = time.monotonic() + 5.0
        for handle in handles:
            handle.wait(max(0.0, deadline - time.monotonic()))
        self._closed = True
        self._wake.set()
        self._monitor.join(timeout=5.0)
        for handle in handles:  # anything still running is abandoned
            if not handle.done():
                self._finish(handle, "cancelled", "the Lab was closed while the run was running")
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
        """``{address: info}`` of all workers, fetched fresh from the scheduler.

        Not ``client.scheduler_info(n_workers=-1)``: that returns a cache which the
        client's periodic refresh (``n_workers=0``) may overwrite with an empty worker
        list between the fetch and the return, so live workers would look gone.
        """
        info = self.client.sync(self.client.scheduler.identity, n_workers=-1)
        return dict(info.get("workers", {}))

    @staticmethod
    def _is_gpu(info: dict[str, Any]) -> bool:
        return float((info.get("resources") or {}).get("GPU", 0)) >= 1

    def _wants_cuda(self, config: RunConfig, workers: dict[str, dict[str, Any]]) -> bool:
        if config.device == "cuda":
            return True
        if config.device == "cpu":
            return False
        return sum(self._is_gpu(i) for i in workers.values()) >= config.workers

    def _eligible(self, config: RunConfig, workers: dict[str, dict[str, Any]]) -> list[str]:
        if self._wants_cuda(config, workers):
            return sorted(a for a, i in workers.items() if self._is_gpu(i))
        # CPU runs prefer CPU-only workers so that GPUs stay free for GPU runs.
        return sorted(workers, key=lambda a: (self._is_gpu(workers[a]), a))

    # --- submit ------------------------------------------------------------------------
    def submit(self, config: RunConfig | dict[str, Any], wait_for_workers: bool = False,
               timeout_s: float | None = None, progress: bool | None = None,
               resume: bool = False) -> RunHandle:
        """Queue a run and return its :class:`RunHandle` at once.

        With ``config.checkpoint`` the ranks save epoch checkpoints under
        ``<out>/<run_id>/checkpoints`` (a path the workers must reach: shared or local
        disk). ``resume=True`` (needs ``config.run_id``) continues from the newest complete
        checkpoint there, if any: stored metric rows before its iteration are kept and
        the new rows appended; without a checkpoint the run starts from iteration 0.

        ``timeout_s`` (default the Lab's) is this run's rendezvous/collective timeout
        and, with ``wait_for_workers=True``, how long to wait for the cluster to have
        ``config.workers`` eligible workers. Without it, too few workers raise
        ``ValueError`` naming how many there are. Runs that find too few *free*
        workers wait in a FIFO queue.
        """
        if self._closed:
            raise RuntimeError("this Lab is closed")
        if isinstance(config, dict):
            config = RunConfig.from_dict(config)
        if not isinstance(config, RunConfig):
            raise TypeError(f"config={config!r} has type {type(config).__name__}: expected RunConfig")
        timeout_s = self.timeout_s if timeout_s is None else float(timeout_s)
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r} is invalid: expected a number > 0")
        if config.run_id is None:
            config = config.replace(run_id=_results.new_run_id(config))
        # a calibration file is read here: workers get its constants, not a path they may lack
        bandwidth = portable_bandwidth(config.bandwidth)
        if bandwidth != config.bandwidth:
            config = config.replace(bandwidth=bandwidth)
        with self._lock:
            if any(h.run_id == config.run_id for h in self._pending + self._active):
                raise ValueError(f"run_id={config.run_id!r} is invalid: a run with this id is active")
        self._check_capacity(config, wait_for_workers, timeout_s)

        handle = RunHandle(self, config, timeout_s)
        store = _results.RunStore(self.out, handle.run_id)
        if resume:
            from gtopk_lab.training.checkpoint import read_latest

            latest = read_latest(_results.checkpoint_folder(self.out, handle.run_id))
            handle._resume = latest is not None
            kept = _results.rows_before(store.read_metrics(), latest["iteration"] if latest else 0)
            with handle._lock:
                handle._add_rows(kept.to_dict("records"))
                handle._undelivered = []
        store.write_config(config)
        store.write_summary(_results.run_summary(config, None, status="queued",
                                                   extra={"submitted_at": handle.submitted_at}))
        self.client.subscribe_topic(topic_for(handle.run_id), handle._on_event)
        if self.progress if progress is None else progress:
            from gtopk_lab.orchestration.progress import RunProgress

            handle._progress = RunProgress(config)
            handle._subscribers.append(handle._progress)
        with self._lock:
            self._pending.append(handle)
        self._dispatch()
        self._wake.set()
        return handle

    def run(self, config: RunConfig | dict[str, Any], **kwargs: Any) -> tuple[pd.DataFrame, dict[str, Any]]:
        """``submit(config, **kwargs).result()``."""
        return self.submit(config, **kwargs).result()

    def _check_capacity(self, config: RunConfig, wait: bool, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            workers = self.worker_info()
            eligible = self._eligible(config, workers)
            if len(eligible) >= config.workers:
                return
            kind = "GPU " if self._wants_cuda(config, workers) else ""
            msg = (f"workers={config.workers} is more than the {len(eligible)} {kind}Dask worker(s) "
                   f"of this cluster: start more workers or use fewer ranks (or simulate)")
            if not wait:
                raise ValueError(msg)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{msg}; waited {timeout_s:.0f} s")
            time.sleep(0.5)

    # --- scheduling --------------------------------------------------------------------
    def _post(self, fn: Callable[[], None]) -> None:
        with self._lock:
            self._posted.append(fn)
        self._wake.set()

    def _busy_elsewhere(self) -> set[str]:
        """Workers processing any task that is not one of this Lab's rank tasks."""
        try:
            processing = self.client.processing()
        except Exception:
            return set()
        own = {f.key for h in self._active for f in h._futures}
        return {addr for addr, keys in processing.items() if any(k not in own for k in keys)}

    def _dispatch(self) -> None:
        """Start queued runs, oldest first, while enough free workers exist."""
        with self._lock:
            if not self._pending or self._closed:
                return
            workers = self.worker_info()
            busy = set(self._reserved) | self._busy_elsewhere()
            while self._pending:
                handle = self._pending[0]
                free = [a for a in self._eligible(handle.config, workers) if a not in busy]
                if len(free) < handle.config.workers:
                    break
                chosen = free[: handle.config.workers]
                self._pending.pop(0)
                busy.update(chosen)
                handle.device = "cuda" if self._wants_cuda(handle.config, workers) else "cpu"
                self._start(handle, chosen)

    def _start(self, handle: RunHandle, workers: list[str]) -> None:
        for addr in workers:
            self._reserved[addr] = handle.run_id
        handle.workers = list(workers)
        handle._key = f"{handle.run_id}.{secrets.token_hex(4)}"
        handle.status = "running"
        handle.started_at = _results.utc_now()
        self._active.append(handle)
        _results.RunStore(self.out, handle.run_id).write_summary(_results.run_summary(
            handle.config, None, status="running",
            extra={"submitted_at": handle.submitted_at, "started_at": handle.started_at,
                   "dask_workers": handle.workers}))
        config_dict = handle.config.to_dict()
        folder = _results.checkpoint_folder(self.out, handle.run_id)
        ckpt_kwargs = {"checkpoint_dir": folder if handle.config.checkpoint else None,
                       "resume_from": folder if handle._resume else None}
        resources = {"GPU": 1} if handle.device == "cuda" else None
        handle._futures = [
            self.client.submit(
                run_rank, config_dict, rank, handle.timeout_s, self.train_fn,
                rendezvous_key=handle._key, device=handle.device, **ckpt_kwargs,
                key=f"gtopk-rank{rank}-{handle._key}", workers=[addr], allow_other_workers=False,
                pure=False, retries=0, resources=resources,
            )
            for rank, addr in enumerate(workers)
        ]

    def _cancel(self, handle: RunHandle) -> None:
        with self._lock:
            if handle.done():
                return
            if handle in self._pending:
                self._pending.remove(handle)
                self._finish(handle, "cancelled", "cancelled before it started")
                return
            if handle._cancel_requested:
                return
            handle._cancel_requested = True
            handle._cancel_deadline = time.monotonic() + handle.timeout_s
        try:
            self.client.run(mark_cancelled, handle._key, workers=list(handle.workers), on_error="ignore")
        except Exception as exc:  # the monitor still abandons the run at the deadline
            logger.warning("could not flag %s as cancelled on its workers: %s", handle.run_id, exc)
        self._wake.set()

    # --- monitor -----------------------------------------------------------------------
    def _monitor_loop(self) -> None:
        last_ok = time.monotonic()
        while not self._closed:
            self._wake.wait(self.poll_interval_s)
            self._wake.clear()
            try:
                self._tick()
                last_ok = time.monotonic()
            except Exception as exc:  # keep watching: a transient scheduler hiccup
                if self._closed:
                    break
                logger.warning("gtopk-lab monitor: %s: %s", type(exc).__name__, exc)
                if time.monotonic() - last_ok > self.timeout_s:
                    self._fail_all(f"lost contact with the Dask scheduler for more than "
                                   f"{self.timeout_s:.0f} s: {type(exc).__name__}: {exc}")
                    last_ok = time.monotonic()

    def _fail_all(self, error: str) -> None:
        """The scheduler is gone: end every queued and running run as failed."""
        with self._lock:
            handles = list(self._pending) + list(self._active)
            self._pending.clear()
            self._active.clear()
            self._reserved.clear()
        for handle in handles:
            self._finish(handle, "failed", error)

    def _tick(self) -> None:
        with self._lock:
            posted, self._posted = self._posted, []
            active = list(self._active)
        for fn in posted:
            fn()
        if active:
            alive = set(self.worker_info())
            for handle in active:
                self._check(handle, alive)
        for handle in active:
            handle._deliver()
        self._dispatch()

    def _check(self, handle: RunHandle, alive: set[str]) -> None:
        now = time.monotonic()
        if handle.done():  # failed/cancelled already reported: drain, then release
            remaining = [f for r, f in enumerate(handle._futures)
                         if r not in handle._lost and f.status not in ("finished", "error", "cancelled")]
            if not remaining or (handle._drain_deadline is not None and now >= handle._drain_deadline):
                self._release(handle)
            return
        for rank, (addr, future) in enumerate(zip(handle.workers, handle._futures)):
            if future.status == "error" and rank not in handle._errors:
                handle._errors[rank] = self._rank_error(rank, addr, future)
            elif addr not in alive and rank not in handle._lost and future.status != "finished":
                handle._lost[rank] = addr
        if handle._errors or handle._lost:
            if handle._first_error_at is None:
                handle._first_error_at = now
            unsettled = [f for r, f in enumerate(handle._futures)
                         if r not in handle._lost and r not in handle._errors and f.status != "finished"]
            if handle._lost or not unsettled or now - handle._first_error_at >= FAILURE_SETTLE_S:
                self._fail(handle)
            return
        if all(f.status == "finished" for f in handle._futures):
            self._complete(handle)
            return
        if handle._cancel_requested and handle._cancel_deadline is not None and now >= handle._cancel_deadline:
            self._finish(handle, "cancelled", f"cancelled; ranks did not stop within {handle.timeout_s:.0f} s")
            handle._drain_deadline = now
            self._release(handle)

    @staticmethod
    def _rank_error(rank: int, addr: str, future: Any) -> _RankError:
        try:
            exc = future.exception(timeout=5)
        except Exception as err:  # pragma: no cover - scheduler gone
            exc = err
        if isinstance(exc, RankFailed):
            return _RankError(rank, exc.worker, exc.message, exc.traceback_text,
                              getattr(exc, "failed_at", time.time()))
        import traceback as _tb

        text = "".join(_tb.format_exception(exc)) if isinstance(exc, BaseException) else repr(exc)
        return _RankError(rank, addr, f"{type(exc).__name__}: {exc}", text, time.time())

    def _fail(self, handle: RunHandle) -> None:
        cancelled = handle._cancel_requested or any(
            "RunCancelled" in e.message for e in handle._errors.values())
        lines: list[str] = []
        if handle._lost:
            for rank, addr in sorted(handle._lost.items()):
                lines.append(f"rank {rank} lost: Dask worker {addr} left the cluster during the run "
                             f"(killed or crashed)")
            for err in sorted(handle._errors.values(), key=lambda e: e.failed_at):
                lines.append(f"rank {err.rank} on {err.worker} then failed: {err.message}")
        else:
            ordered = sorted(handle._errors.values(), key=lambda e: e.failed_at)
            first = ordered[0]
            lines.append(f"rank {first.rank} on {first.worker} failed: {first.message}")
            lines.append(first.traceback.rstrip())
            for err in ordered[1:]:
                lines.append(f"rank {err.rank} on {err.worker} then failed: {err.message}")
        status = "cancelled" if cancelled and not handle._lost else "failed"
        self._finish(handle, status, "\n".join(lines))
        # Tasks pinned to a lost worker would wait forever: cancel them now. Surviving
        # ranks are given timeout_s to notice (gloo usually notices at once).
        lost_futures = [handle._futures[r] for r in handle._lost]
        if lost_futures:
            self.client.cancel(lost_futures)
        handle._drain_deadline = time.monotonic() + handle.timeout_s + 5.0

    def _complete(self, handle: RunHandle) -> None:
        try:
            outputs = [f.result(timeout=30) for f in handle._futures]
        except Exception as exc:  # pragma: no cover - the futures just reported finished
            self._finish(handle, "failed", f"could not gather the ranks' results: {exc!r}")
            self._release(handle)
            return
        rows = [row for out in outputs for row in out.get("rows", [])]
        with handle._lock:
            handle._add_rows(rows)
        rank0 = next((o.get("summary") for o in outputs if o.get("rank") == 0), None)
        self._finish(handle, "completed", None, rank0_summary=rank0,
                     backend=outputs[0].get("backend") if outputs else None)
        self._release(handle)

    def _finish(self, handle: RunHandle, status: str, error: str | None,
                rank0_summary: dict[str, Any] | None = None, backend: str | None = None) -> None:
        """Write the run folder and mark the handle done (once)."""
        with handle._lock:
            if handle.done():
                return
            handle.finished_at = _results.utc_now()
            extra = {"submitted_at": handle.submitted_at, "started_at": handle.started_at,
                     "finished_at": handle.finished_at, "dask_workers": handle.workers,
                     "device": handle.device}
            if backend:
                extra["backend"] = backend
            summary = _results.run_summary(handle.config, rank0_summary, status=status,
                                             error=error, extra=extra)
            try:
                _results.write_run(self.out, handle.config, handle.metrics, summary)
            except Exception as exc:  # disk full etc.: still end the handle
                summary["error"] = (error or "") + f"\n(could not write the run folder: {exc!r})"
            handle.status = status
            handle.error = summary.get("error")
            handle.summary = summary
        handle._deliver()
        try:
            self.client.unsubscribe_topic(topic_for(handle.run_id))
        except Exception:
            pass
        if handle._progress is not None:
            handle._progress.close(status)
        handle._done.set()

    def _release(self, handle: RunHandle) -> None:
        with self._lock:
            if handle._released:
                return
            handle._released = True
            pending = [f for f in handle._futures if f.status not in ("finished", "error", "cancelled")]
            if pending:
                self.client.cancel(pending)
            for addr in handle.workers:
                if self._reserved.get(addr) == handle.run_id:
                    del self._reserved[addr]
            if handle in self._active:
                self._active.remove(handle)
        for name in (rendezvous_name(handle._key),):
            try:
                from distributed import Variable

                Variable(name, client=self.client).delete()
            except Exception:
                pass
        self._wake.set()

    # --- results -----------------------------------------------------------------------
    def runs(self) -> pd.DataFrame:
        """Summaries of every run stored under ``out`` (see ``results.load_summaries``)."""
        return _results.load_summaries(self.out)

    def load(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """``(summaries, metrics)`` of every run under ``out``."""
        return _results.load_runs(self.out)

    def sweep(self, configs: Iterable[RunConfig], skip_completed: bool = True,
              progress: bool | None = None, on_finish: Callable[[RunHandle], None] | None = None
              ) -> pd.DataFrame:
        """Run ``configs`` (queued, each on free workers) and return their summaries.

        With ``skip_completed`` a config whose hash already has a completed run under
        ``out`` is not run again (the stored summary is returned): an interrupted sweep
        resumes where it stopped. A damaged run there is moved aside (``results.read_run``).
        """
        configs = list(configs)
        done = _results.completed_runs(self.out, move_damaged=True) if skip_completed else {}
        show = self.progress if progress is None else progress
        bar = None
        if show:
            from gtopk_lab.orchestration.progress import SweepProgress

            bar = SweepProgress(len(configs))
        summaries: list[dict[str, Any]] = []
        handles: list[RunHandle] = []
        for config in configs:
            digest = _results.config_hash(config)
            if digest in done:
                stored = _results.RunStore(self.out, done[digest]).read_summary() or {}
                stored["skipped"] = True
                summaries.append(stored)
                if bar is not None:
                    bar.run_finished("completed")
                continue
            handles.append(self.submit(config, progress=False))
        try:
            for handle in handles:
                _, summary = handle.result()
                summaries.append(summary)
                if bar is not None:
                    bar.run_finished(summary["status"])
                if on_finish is not None:
                    on_finish(handle)
        finally:
            if bar is not None:
                bar.close()
        return pd.DataFrame.from_records(summaries)
