"""How a run's ranks meet on their Dask workers, and how a rank learns its run was released.

Worker side (:func:`~gtopk_lab.worker.rank_task.run_rank` and the link calibration's
:mod:`~gtopk_lab.worker.link_task` call :func:`join_process_group`):

1. **Address.** Rank 0 starts a ``torch.distributed.TCPStore`` on its own host, bound to
   port 0 so the OS picks a free port and listening on the worker's own address only
   (``comm.launch.master_store``), and publishes ``host:port`` in the Dask ``Variable``
   ``gtopk-rdv-<key>``; ranks 1..P-1 read it (:func:`_read_rendezvous`) and connect. One
   variable per rendezvous key, so two runs never share a rendezvous.
2. **Joined.** Every rank leaves its interface binding in the store and waits until all P
   have (:func:`_wait_for_ranks`), so the group then forms at once.
3. **Process group.** ``init_process_group(backend, store=..., timeout=...)``.

Both waits are bounded by the run's timeout and end with :class:`RunCancelled` once the
rank's own task is released (:func:`run_released`: the client flagged the run cancelled with
:func:`mark_cancelled`, or the scheduler released the task, as when its client died). A
client that dies before all its ranks start leaves the others waiting for peers that never
come; before these checks each held its worker's one thread for the whole timeout (60 s by
default) from the run the scheduler gave that worker to next.

Cost: one Variable round trip to the scheduler, a store check every 5-100 ms until all ranks
joined, and the group's own set-up.
"""

from __future__ import annotations

import datetime
import json
import socket
import time
from collections.abc import Callable
from typing import Any

__all__ = ["RENDEZVOUS_POLL_S", "RunCancelled", "current_task_key", "join_process_group", "mark_cancelled",
           "rendezvous_name", "run_released"]


def rendezvous_name(run_id: str) -> str:
    """Name of the Dask ``Variable`` through which rank 0 publishes ``host:port``."""
    return f"gtopk-rdv-{run_id}"


class RunCancelled(RuntimeError):
    """Raised inside a rank when the client cancelled the run."""


def _worker_host(worker: Any) -> str:
    """The host part of the worker's address (the interface its peers can reach)."""
    addr = str(worker.address)
    hostport = addr.split("://", 1)[-1]
    host = hostport.rsplit(":", 1)[0].strip("[]")
    return host or socket.gethostname()


#: Rendezvous keys of runs the client cancelled, set on each worker by
#: :func:`mark_cancelled` (run through ``Client.run`` on the worker's event loop, so it
#: lands while the rank's thread is busy training).
_CANCELLED_KEYS: set[str] = set()


def mark_cancelled(key: str) -> None:
    """Worker side: flag the run with rendezvous key ``key`` as cancelled."""
    _CANCELLED_KEYS.add(key)


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


def _read_rendezvous(key: str, client: Any, timeout_s: float, released: Callable[[], bool]) -> str:
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
    """Steps 1-3 of the module docstring for this worker's rank: bind gloo/NCCL to the
    worker's interface, meet the other ranks through the Dask Variable named after
    ``key`` and the TCPStore of rank 0, and initialise the default process group.
    Returns ``(store, binding)`` (``comm.launch.InterfaceBinding``); the caller destroys
    the group. Cost: one Variable round trip to the scheduler and the group's own set-up."""
    import torch.distributed as dist

    from gtopk_lab.comm.launch import bind_to_interface, master_store

    own_host = _worker_host(worker)
    binding = bind_to_interface(own_host)  # before the group: gloo reads it at creation
    task_key = current_task_key()

    def released() -> bool:
        return run_released(worker, key, task_key)

    if rank == 0:
        store = master_store(own_host, world, timeout)  # listens on this address only
        _publish_rendezvous(key, f"{own_host}:{store.port}", client)
    else:
        address = _read_rendezvous(key, client, timeout.total_seconds(), released=released)
        host, port = address.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), world, False, timeout=timeout)
    store.set(f"gtopk/interface/{rank}", json.dumps(binding.to_dict()))
    _wait_for_ranks(store, key, world, timeout.total_seconds(), released)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    return store, binding


def _wait_for_ranks(store: Any, key: str, world: int, timeout_s: float, released: Callable[[], bool]) -> None:
    """Until every rank has left its interface in ``store`` (so the group forms at once), up
    to ``timeout_s``; ``RunCancelled`` once ``released()``. Else a rank whose peer's task
    was released before it started (a dead client) waited out the whole timeout inside
    ``init_process_group``, holding its worker. ``store.check`` between short sleeps
    (5 ms, doubling to 100 ms): a timed ``store.wait`` logs a warning at every slice."""
    keys = [f"gtopk/interface/{r}" for r in range(world)]
    deadline = time.monotonic() + timeout_s
    pause = 0.005
    while not store.check(keys):
        if released():
            raise RunCancelled(f"rendezvous {key}: the run was cancelled (by its client, or the scheduler "
                               "released its task) while this rank waited for the others to join")
        if time.monotonic() >= deadline:
            joined = sum(store.check([k]) for k in keys)
            raise TimeoutError(f"rendezvous {key}: {world - joined} of {world} ranks did not join "
                               f"within {timeout_s:.0f} s")
        time.sleep(pause)
        pause = min(2 * pause, 0.1)
