"""The function Dask runs on each worker: rendezvous, ``train_rank``, cleanup.

Worker side only: imports torch, dask's worker API and ``gtopk_lab.training``;
never plotting or notebook code.

One run of P ranks is P calls of :func:`run_rank`, one per Dask worker:

1. **Rendezvous.** Rank 0 starts a ``torch.distributed.TCPStore`` on its own host,
   bound to port 0 so the OS picks a free port (no race between "pick" and "bind") and
   listening on the worker's own address only (``comm.launch.master_store``), and
   publishes ``host:port`` in the Dask ``Variable`` ``gtopk-rdv-<run_id>``.
   Ranks 1..P-1 read that variable (waiting at most ``timeout_s``, and ending with
   ``RunCancelled`` once their own task is released: a dead client's rank 0 may never
   start) and connect. One variable per run id, so two runs never share a rendezvous.
2. **Process group.** ``init_process_group(backend, store=..., timeout=timeout_s)``:
   NCCL on a worker that holds a ``GPU`` resource and sees CUDA, gloo otherwise.
   The timeout bounds how long a rank waits for a dead or late peer. Before it, the
   rank binds gloo's and NCCL's sockets to the interface that carries its worker's
   address (``comm.launch.bind_to_interface``; ``GLOO_SOCKET_IFNAME`` /
   ``NCCL_SOCKET_IFNAME`` set by the operator win) and leaves its choice in the store;
   rank 0's summary lists every rank's (``network_interfaces``).
3. **Training.** ``train_rank(config, sink, device)``. The sink sends each batch of
   metric rows to the scheduler with ``Worker.log_event("gtopk-<run_id>", rows)``
   (one event per batch: the scheduler keeps only the last 1000 events per topic),
   and raises ``RunCancelled`` once the client has flagged the run as cancelled, or
   once the scheduler released the rank's own task (its state on the worker is
   ``cancelled``): that is how the ranks of a client that died (its futures dropped by
   the scheduler) stop instead of holding workers the scheduler already gave to others.
4. **Cleanup** (``finally``): the process group is destroyed, which closes the gloo
   sockets so that peers blocked in a collective fail at once instead of waiting.
5. **Watchdog** (:class:`~gtopk_lab.worker.faults.SchedulerWatchdog`, all steps): when the
   worker shuts down (its scheduler gone, SIGTERM) or has run without a scheduler
   connection for ``config.scheduler_timeout_s``, the sink raises ``WorkerClosing`` /
   ``SchedulerLost`` so that the rank ends on its own (step 4 frees its peers); a rank
   stuck past the collective timeout after that ends its worker process. A rank's
   failure carries its cause (:func:`~gtopk_lab.worker.faults.failure_cause`: out of
   memory, scheduler lost, peer lost, ...) to the client.

Cost per sink call: a msgpack check of the batch and one message on the worker's
batched stream to the scheduler (asynchronous, no round trip); the cancel check is a
set lookup and one dict lookup of the task's state, the watchdog check an Event read. benchmarks/streaming_overhead.py measures it
against the iteration time.
"""

from __future__ import annotations

import datetime
import json
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

from gtopk_lab.worker.faults import PEER_LOST, SchedulerWatchdog, failure_cause

#: Prefix of the per-run log_event topic that carries metric rows.
TOPIC_PREFIX = "gtopk-"


def topic_for(run_id: str) -> str:
    """The ``log_event`` topic of a run: ``gtopk-<run_id>``."""
    return f"{TOPIC_PREFIX}{run_id}"


def rendezvous_name(run_id: str) -> str:
    """Name of the Dask ``Variable`` through which rank 0 publishes ``host:port``."""
    return f"gtopk-rdv-{run_id}"


class RunCancelled(RuntimeError):
    """Raised inside a rank when the client cancelled the run."""


def to_plain(value: Any) -> Any:
    """Convert numpy/torch scalars and tuples to msgpack-friendly Python values."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (ValueError, RuntimeError):
            pass
    return str(value)


def _worker_host(worker: Any) -> str:
    """The host part of the worker's address (the interface its peers can reach)."""
    addr = str(worker.address)
    hostport = addr.split("://", 1)[-1]
    host = hostport.rsplit(":", 1)[0].strip("[]")
    return host or socket.gethostname()


def select_device(worker: Any, requested: str, rank: int = 0) -> tuple[Any, str]:
    """Pick ``(torch.device, backend)`` for this rank.

    A worker that holds a ``GPU`` resource (and sees CUDA) gets a GPU and NCCL;
    dask-cuda and our GPU deployments give each worker one visible device, so that is
    ``cuda:0``. A worker that sees several devices (the embedded LocalCluster on a
    multi-GPU machine) takes ``cuda:(rank mod device_count)``, so ranks on one machine get
    distinct GPUs. Every other worker gets the CPU and gloo.
    ``requested="cuda"`` on a worker without a usable GPU raises ``ValueError``.
    """
    import torch

    has_gpu_resource = float(getattr(worker.state, "total_resources", {}).get("GPU", 0)) >= 1
    cuda_ok = torch.cuda.is_available()
    if requested == "cpu":
        return torch.device("cpu"), "gloo"
    if requested == "cuda" and not cuda_ok:
        raise ValueError(f"device='cuda' but worker {worker.address} sees no CUDA device")
    if cuda_ok and (requested == "cuda" or has_gpu_resource):
        return torch.device("cuda", rank % max(1, torch.cuda.device_count())), "nccl"
    return torch.device("cpu"), "gloo"


#: Rendezvous keys of runs the client cancelled, set on each worker by
#: :func:`mark_cancelled` (run through ``Client.run`` on the worker's event loop, so it
#: lands while the rank's thread is busy training).
_CANCELLED_KEYS: set[str] = set()


def mark_cancelled(key: str) -> None:
    """Worker side: flag the run with rendezvous key ``key`` as cancelled."""
    _CANCELLED_KEYS.add(key)


class EventSink:
    """Sends batches of metric rows to the client via ``Worker.log_event``.

    Called by ``train_rank`` every ``sink_every`` iterations with the buffered rows;
    one call is one event (msgpack check + hand-off to the worker's batched stream, no
    round trip). Raises :class:`RunCancelled` when the client has cancelled the run
    (a set lookup: the client pushes the flag with :func:`mark_cancelled`), and
    ``WorkerClosing``/``SchedulerLost`` once ``watchdog`` trips. Each event carries the start's
    ``key``, so the client can drop rows of an earlier start of a restarted run.
    """

    def __init__(self, worker: Any, run_id: str, rank: int, cancel_key: str | None = None,
                 watchdog: SchedulerWatchdog | None = None, task_key: Any = None) -> None:
        self.worker = worker
        self.topic = topic_for(run_id)
        self.run_id = run_id
        self.rank = rank
        self.cancel_key = cancel_key or run_id
        self.watchdog = watchdog
        #: the Dask key of the task this rank runs in (None outside a task)
        self.task_key = task_key if task_key is not None else current_task_key()
        self.rows_sent = 0

    def __call__(self, rows: list[dict]) -> None:
        if rows:
            batch = [to_plain(dict(r)) for r in rows]
            self.worker.log_event(self.topic, {"run_id": self.run_id, "rank": self.rank,
                                               "key": self.cancel_key, "rows": batch})
            self.rows_sent += len(batch)
        if self.cancelled():
            raise RunCancelled(f"run {self.run_id} was cancelled (by its client, or the scheduler released its task)")
        if self.watchdog is not None:
            self.watchdog.check()

    def cancelled(self) -> bool:
        """True once the client has cancelled the run, or the scheduler released this
        rank's task (cancelled by its client, or its client left the cluster)."""
        return run_released(self.worker, self.cancel_key, self.task_key)


def run_released(worker: Any, cancel_key: str, task_key: Any) -> bool:
    """True once the client flagged the run ``cancel_key`` cancelled (:func:`mark_cancelled`)
    or the scheduler released the task ``task_key`` that runs this rank on ``worker`` (its
    state there is ``cancelled``: cancelled by its client, or its client left the cluster)."""
    if cancel_key in _CANCELLED_KEYS:
        return True
    tasks = getattr(getattr(worker, "state", None), "tasks", None)
    task = tasks.get(task_key) if tasks is not None and task_key is not None else None
    return task is not None and task.state == "cancelled"


def current_task_key() -> Any:
    """The Dask key of the task running in this thread (None outside one)."""
    from distributed.worker import thread_state

    return getattr(thread_state, "key", None)


def _publish_rendezvous(key: str, value: str, client: Any) -> None:
    from distributed import Variable

    Variable(rendezvous_name(key), client=client).set(value)


#: how often a rank waiting for rank 0's address checks whether its own task was released
RENDEZVOUS_POLL_S = 0.5


def _read_rendezvous(key: str, client: Any, timeout_s: float,
                     released: Callable[[], bool] = lambda: False) -> str:
    """Rank 0's address, waited for up to ``timeout_s`` in slices of :data:`RENDEZVOUS_POLL_S`:
    between them ``released()`` (:func:`run_released`) ends the wait with ``RunCancelled``.
    A run whose client died before its rank 0 started never publishes one, and a rank that
    waited out the whole timeout held its worker (one thread) from the run the scheduler
    had given that worker to (60 s by default)."""
    from distributed import Variable

    variable = Variable(rendezvous_name(key), client=client)
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"rendezvous {key}: rank 0 did not publish its address within {timeout_s:.0f} s")
        try:
            return str(variable.get(timeout=min(RENDEZVOUS_POLL_S, left)))
        except TimeoutError:
            if released():
                raise RunCancelled(f"rendezvous {key}: the run was cancelled (by its client, or the scheduler "
                                   "released its task) while this rank waited for rank 0's address") from None


def join_process_group(worker: Any, client: Any, key: str, rank: int, world: int, backend: str,
                       timeout: datetime.timedelta) -> tuple[Any, Any]:
    """Steps 1-2 of the module docstring for this worker's rank: bind gloo/NCCL to the
    worker's interface, meet the other ranks through the Dask Variable named after
    ``key`` and the TCPStore of rank 0, and initialise the default process group.
    Returns ``(store, binding)`` (``comm.launch.InterfaceBinding``); the caller destroys
    the group. Cost: one Variable round trip to the scheduler and the group's own set-up."""
    import torch.distributed as dist

    from gtopk_lab.comm.launch import bind_to_interface, master_store

    own_host = _worker_host(worker)
    binding = bind_to_interface(own_host)  # before the group: gloo reads it at creation
    if rank == 0:
        store = master_store(own_host, world, timeout)  # listens on this address only
        _publish_rendezvous(key, f"{own_host}:{store.port}", client)
    else:
        task_key = current_task_key()
        address = _read_rendezvous(key, client, timeout.total_seconds(),
                                   released=lambda: run_released(worker, key, task_key))
        host, port = address.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), world, False, timeout=timeout)
    store.set(f"gtopk/interface/{rank}", json.dumps(binding.to_dict()))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    return store, binding


def run_rank(
    config_dict: dict[str, Any],
    rank: int,
    timeout_s: float = 60.0,
    train_fn: Callable[..., Any] | None = None,
    rendezvous_key: str | None = None,
    device: str | None = None,
    checkpoint_dir: str | None = None,
    resume_from: str | None = None,
) -> dict[str, Any]:
    """Run rank ``rank`` of the run described by ``config_dict`` on this Dask worker.

    Returns ``{"rank", "worker", "rows", "summary", "backend", "device"}`` (plain
    Python values). Any exception from rendezvous or training propagates to the
    client with its traceback; the process group is destroyed in every case.

    ``train_fn`` defaults to ``gtopk_lab.training.loop.train_rank``; the tests pass
    another function with the same signature to inject failures. ``rendezvous_key``
    (default: the run id) names the rendezvous Variable and cancel Event; the Lab
    makes it unique per start so a resumed run never meets a stale address.
    ``device`` ("cpu" | "cuda"; default ``config.device``) is the client's choice for
    the whole run, so that all ranks agree on the backend. ``checkpoint_dir`` /
    ``resume_from`` (the Lab passes ``<out>/<run_id>/checkpoints``) go to ``train_fn``
    as keywords only when given, so train functions without them keep working.
    """
    import torch
    import torch.distributed as dist
    from distributed import get_client, get_worker

    from gtopk_lab.comm.allocator import tune_for_collectives
    from gtopk_lab.config import RunConfig

    tune_for_collectives()  # the nanny's MALLOC_TRIM_THRESHOLD_ maps every message anew
    # numba's merge kernels, loaded once per process (~0.5-1 s of CPU; compiled, ~5 s, on a
    # cold cache): else the first sparse collective pays it, booked as communication
    import gtopk_lab.compression.fast_merge_warm  # noqa: F401
    config = RunConfig.from_dict(config_dict)
    run_id = config.run_id
    if not run_id:
        raise ValueError("run_id=None is invalid: the client assigns a run id before submitting")
    if not (0 <= rank < config.workers):
        raise ValueError(f"rank={rank!r} is invalid: expected 0 <= rank < workers={config.workers}")
    key = rendezvous_key or run_id
    worker = get_worker()
    client = get_client()
    device, backend = select_device(worker, device or config.device, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=float(timeout_s))
    if train_fn is None:
        from gtopk_lab.training.loop import train_rank as train_fn

    store = None
    sink: EventSink | None = None
    initialised = False
    # After a trip, a rank still running past the collective timeout is stuck (module faults).
    watchdog = SchedulerWatchdog(worker, timeout_s=config.scheduler_timeout_s,
                                 hard_stop_after_s=float(timeout_s) + 10.0,
                                 label=f"rank {rank} of run {run_id}").start()
    try:
        store, binding = join_process_group(worker, client, key, rank, config.workers, backend, timeout)
        initialised = True
        sink = EventSink(worker, run_id, rank, cancel_key=key, watchdog=watchdog)
        ckpt_kwargs = {name: value for name, value in (("checkpoint_dir", checkpoint_dir),
                                                       ("resume_from", resume_from))
                       if value is not None}
        result = train_fn(config, sink=sink, device=device, **ckpt_kwargs)
        rows = getattr(result, "rows", None)
        summary = getattr(result, "summary", None)
        if rows is None and isinstance(result, dict):  # tolerate a plain dict result
            rows, summary = result.get("rows", []), result.get("summary", {})
        summary = dict(summary or {})
        if rank == 0:
            summary["network_interfaces"] = _interfaces(store, config.workers)
        return {
            "rank": rank,
            "worker": str(worker.address),
            "rows": to_plain(list(rows or [])),
            "summary": to_plain(summary),
            "backend": backend,
            "device": str(device),
            "interface": binding.interface,
        }
    except BaseException as exc:
        # Name the rank and worker in the message the client shows; keep the chain.
        tb = traceback.format_exc()
        exc = _as_cancellation(exc, sink)
        raise RankFailed(rank, str(worker.address), f"{type(exc).__name__}: {exc}", tb,
                         time.time(), failure_cause(exc)) from None
    finally:
        watchdog.stop()
        if initialised:
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        del store


def _interfaces(store: Any, world: int) -> list[dict[str, str]]:
    """Every rank's interface binding, in rank order, as each left it in the store before
    the group formed (so all are there once the group is up)."""
    return [json.loads(store.get(f"gtopk/interface/{r}").decode()) for r in range(world)]


#: How long a rank whose peer left waits to learn that the run was cancelled.
CANCEL_GRACE_S = 2.0


def _as_cancellation(exc: BaseException, sink: "EventSink | None") -> BaseException:
    """``exc``, or a :class:`RunCancelled` when the run was cancelled and ``exc`` is only
    how this rank learned it.

    Ranks notice a cancellation at their next sink call, not all at once: the first to
    notice leaves its collective, and its peers fail there with a closed connection
    (``peer lost``). Such a rank waits up to :data:`CANCEL_GRACE_S` for the cancellation
    to reach its own worker, so the client and the summary say "cancelled", not that a
    peer failed."""
    if sink is None or isinstance(exc, RunCancelled) or failure_cause(exc) != PEER_LOST:
        return exc
    deadline = time.monotonic() + CANCEL_GRACE_S
    while not sink.cancelled():
        if time.monotonic() >= deadline:
            return exc
        time.sleep(0.05)
    return RunCancelled(f"run {sink.run_id} was cancelled (rank {sink.rank} saw it as: "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")


class RankFailed(RuntimeError):
    """A rank's exception, carried to the client with the rank, worker, traceback and
    cause (:func:`~gtopk_lab.worker.faults.failure_cause`)."""

    def __init__(self, rank: int, worker: str, message: str, traceback_text: str,
                 failed_at: float = 0.0, cause: str = "error") -> None:
        # every argument goes to args: exceptions are unpickled as cls(*args)
        super().__init__(rank, worker, message, traceback_text, failed_at, cause)
        self.failed_at = failed_at
        self.cause = cause
        self.rank = rank
        self.worker = worker
        self.message = message
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        return f"rank {self.rank} on {self.worker} failed: {self.message}"

