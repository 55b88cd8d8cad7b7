"""The function Dask runs on each worker: rendezvous, ``train_rank``, cleanup.

Worker side only: imports torch, dask's worker API and ``gtopk_lab.training``;
never plotting or notebook code.

One run of P ranks is P calls of :func:`run_rank`, one per Dask worker:

1. **Rendezvous** (:mod:`~gtopk_lab.worker.rendezvous`): rank 0 publishes its
   ``TCPStore``'s ``host:port`` in the Dask ``Variable`` ``gtopk-rdv-<run_id>``, the others
   read it and connect, and every rank waits for all P to join; both waits end with
   ``RunCancelled`` once the rank's own task is released (a dead client's other ranks may
   never start).
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
import time
import traceback
from collections.abc import Callable
from typing import Any

from gtopk_lab.worker.faults import PEER_LOST, SchedulerWatchdog, failure_cause
from gtopk_lab.worker.rendezvous import (  # noqa: F401  (re-exported: the client side names them here)
    RunCancelled, current_task_key, join_process_group, mark_cancelled, rendezvous_name, run_released,
)

#: Prefix of the per-run log_event topic that carries metric rows.
TOPIC_PREFIX = "gtopk-"


def topic_for(run_id: str) -> str:
    """The ``log_event`` topic of a run: ``gtopk-<run_id>``."""
    return f"{TOPIC_PREFIX}{run_id}"


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

