"""Client-side fault handling of the Lab's monitor: a lost scheduler, lost workers, restarts.

Client side. What :class:`~gtopk_lab.orchestration.monitor.RunMonitor` asks when something
outside a rank's code goes wrong (docs/deployment.md, "What happens when ..."):

1. **Scheduler contact** (:class:`SchedulerWatch`, every monitor tick, no message sent):
   the Dask client notices a broken scheduler connection at once (status
   ``connecting``) and tries to reconnect for its connect timeout (``Lab(...,
   connect_timeout_s=10)``), then closes itself. The monitor sends nothing to the
   scheduler meanwhile, and fails every run with one line, ``scheduler tcp://...
   unreachable: ...`` (:func:`unreachable_message`), once the client has given up or
   contact has been lost for ``min(timeout_s, SCHEDULER_GRACE_S)``: so within 30 s,
   10 s with the default connect timeout. The ranks stop on their own
   (:mod:`gtopk_lab.worker.faults`).
2. **Lost workers** (:func:`lost_worker_cause`, once per lost worker, two event-log
   reads): why a worker that held a rank left, from the scheduler's event log: its
   nanny restarted it for memory (``worker-restart-memory``), it closed itself (SIGTERM,
   retirement: a ``closing-worker`` event), or it vanished without a word (SIGKILL, the
   kernel's OOM killer, a crash); the memory it used at its last heartbeat is added.
3. **Restarts** (:func:`restart_point`): a run with ``RunConfig.max_restarts`` left
   continues from its newest complete checkpoint, if any.
4. **Silent hosts** (:func:`silent_workers`, once per run whose rank timed out in a
   collective: cause ``peer timeout``, no message sent): gloo's timeout does not say which
   peer stopped answering. A worker whose host dropped off the network (its link down, a
   switch port dead) still counts as in the cluster for minutes (Dask's worker TTL), but it
   sends the scheduler no heartbeats (every 0.5 s on small clusters). The run's workers
   whose last heartbeat is at least ``min_silence_s`` older than the newest heartbeat of
   the cluster (the reporting rank's own worker is among those, so scheduler time is
   compared with scheduler time) are the ones named: ``host 10.77.0.3 stopped answering``
   (:func:`stopped_answering_line`). Cost: O(workers) over the monitor's last
   ``worker_info`` snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gtopk_lab.config import RunConfig

__all__ = ["SCHEDULER_GRACE_S", "SchedulerWatch", "unreachable_message", "lost_worker_cause",
           "restart_point", "silent_workers", "silence_threshold_s", "stopped_answering_line", "WORKER_LEFT",
           "WORKER_KILLED", "OUT_OF_MEMORY", "SCHEDULER_UNREACHABLE", "STOPPED_ANSWERING"]

#: Longest the monitor waits for a client that is still reconnecting to its scheduler.
SCHEDULER_GRACE_S = 30.0

WORKER_LEFT = "worker left"
WORKER_KILLED = "killed"
OUT_OF_MEMORY = "out of memory"
SCHEDULER_UNREACHABLE = "scheduler unreachable"
STOPPED_ANSWERING = "stopped answering"


def scheduler_address(client: Any) -> str:
    """The scheduler address of ``client`` ("unknown" when it cannot say)."""
    for read in (lambda: client.scheduler.address, lambda: client.cluster.scheduler_address):
        try:
            address = read()
        except Exception:
            continue
        if address:
            return str(address)
    return "unknown"


class SchedulerWatch:
    """The client's contact with its scheduler as the monitor sees it (step 1 above).

    :meth:`check` returns None while all is well or the client is still reconnecting
    within the grace period, else a short reason; :attr:`connected` says whether the
    monitor may send requests to the scheduler now.
    """

    def __init__(self, client: Any, *, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.address = scheduler_address(client)
        self.grace_s = min(float(timeout_s), SCHEDULER_GRACE_S)
        self._clock = clock
        self._lost_since: float | None = None

    @property
    def connected(self) -> bool:
        return str(getattr(self.client, "status", "closed")) == "running"

    def check(self) -> str | None:
        status = str(getattr(self.client, "status", "closed"))
        now = self._clock()
        if status == "running":
            self._lost_since = None
            return None
        if self._lost_since is None:
            self._lost_since = now
        waited = now - self._lost_since
        if status in ("connecting", "newly-created") and waited < self.grace_s:
            return None  # the client is still trying to reconnect
        if status == "connecting":
            return f"no reconnect within {waited:.0f} s"
        return f"the Dask client gave up reconnecting and is {status}"

    def lost_for_s(self) -> float:
        """Seconds since contact was lost (0 while connected)."""
        return 0.0 if self._lost_since is None else self._clock() - self._lost_since


def unreachable_message(address: str, detail: str, config: RunConfig, out: str) -> str:
    """The one line a run ends with when its scheduler is gone (then what is kept, and how
    to resume)."""
    kept = "rows streamed so far and epoch checkpoints" if config.checkpoint else "rows streamed so far"
    return (f"scheduler {address} unreachable ({detail}); its ranks stop on their own when their "
            f"workers close, or after scheduler_timeout_s={config.scheduler_timeout_s:g} s without a "
            f"scheduler. Kept: {kept} in "
            f"{out}/{config.run_id}. Resume: gtopk-lab run --resume {config.run_id} --out {out} "
            f"--scheduler ADDRESS")


def _mib(n: Any) -> str:
    return f"{float(n) / 2**20:.0f} MiB"


def lost_worker_cause(client: Any, address: str, last_info: dict[str, Any] | None, *,
                      silent_for_s: float | None = None, min_silence_s: float = 10.0
                      ) -> tuple[str, str]:
    """``(cause, detail)`` for a worker that left during a run (step 2 above).

    ``cause`` is :data:`OUT_OF_MEMORY`, :data:`WORKER_LEFT`, :data:`STOPPED_ANSWERING` or
    :data:`WORKER_KILLED`; ``detail`` completes "Dask worker ADDR ...". ``last_info`` is the
    worker's entry of the last ``worker_info`` that still had it (its memory at that
    heartbeat). ``silent_for_s``: how much older its last heartbeat was than the cluster's
    newest when it was found gone. A killed process's sockets close at once, so the
    scheduler drops it within a heartbeat; a host that fell off the network sends nothing,
    and the scheduler drops it only when TCP's keepalive gives up on its connection
    (``distributed.comm.timeouts.tcp``, 30 s): ``min_silence_s`` or more of silence without
    a word of closing is :data:`STOPPED_ANSWERING`.
    """
    def events(topic: str) -> list[Any]:
        try:
            return list(client.get_events(topic))
        except Exception:  # the scheduler is gone too: fall back to the plain wording
            return []

    for _, msg in events("worker-restart-memory"):
        if isinstance(msg, dict) and msg.get("worker") == address:
            return OUT_OF_MEMORY, (f"was restarted by its nanny for memory (RSS {_mib(msg.get('rss', 0))}, "
                                   f"over distributed.worker.memory.terminate of its limit)")
    for _, msg in reversed(events(address)):
        if not isinstance(msg, dict):
            continue
        if msg.get("action") == "closing-worker":
            reason = str(msg.get("reason", "unknown"))
            how = " (SIGTERM)" if reason == "signal-15" else ""
            return WORKER_LEFT, (f"left the cluster: it closed itself, reason {reason}{how} "
                                 f"(dask worker stopped, retired or shut down)")
        if msg.get("action") == "remove-worker" and msg.get("expected"):
            return WORKER_LEFT, "left the cluster: the scheduler retired it"
    if silent_for_s is not None and silent_for_s >= min_silence_s:
        return STOPPED_ANSWERING, (f"sent no heartbeat for {silent_for_s:.0f} s, then the scheduler dropped "
                                   f"it: its network link or host is down, or it hung")
    detail = ("left the cluster without closing: killed (SIGKILL, e.g. by the kernel's OOM killer) "
              "or crashed")
    memory = ((last_info or {}).get("metrics") or {}).get("memory")
    limit = (last_info or {}).get("memory_limit")
    if memory and limit:
        detail += f"; it used {_mib(memory)} of its {_mib(limit)} memory limit at its last heartbeat"
    return WORKER_KILLED, detail


def restart_point(checkpoint_dir: str, config: RunConfig) -> dict[str, int] | None:
    """The checkpoint a restarted run continues from (step 3): the newest complete one
    written by as many ranks as the run has, or None (iteration 0); ``ValueError`` naming a
    damaged checkpoint file (the restart must not start afresh over it)."""
    from gtopk_lab.training.checkpoint import check_rank_files, read_latest

    latest = read_latest(checkpoint_dir)
    if latest is None or latest.get("workers") != config.workers:
        return None
    check_rank_files(checkpoint_dir, latest)
    return latest


def silence_threshold_s(timeout_s: float) -> float:
    """How much older than the cluster's newest heartbeat a worker's last one must be to
    call it silent: half the collective timeout (a peer timed out after all of it), at
    least 2 s (four missed heartbeats on a busy machine), at most 10 s."""
    return max(2.0, min(float(timeout_s) / 2.0, 10.0))


def silent_workers(workers: list[str], seen: dict[str, dict[str, Any]], *, newest_s: float | None,
                   min_silence_s: float) -> dict[int, tuple[str, float]]:
    """``{rank: (worker address, seconds of silence)}`` of a run's workers (``workers``, in
    rank order) whose last heartbeat (``seen[address]["last_seen"]``, scheduler time) is
    ``min_silence_s`` or more older than ``newest_s``, the newest heartbeat of the cluster
    (step 4 of the module docstring). Workers without an entry are left out (a lost
    worker is named by :func:`lost_worker_cause`)."""
    if newest_s is None:
        return {}
    silent: dict[int, tuple[str, float]] = {}
    for rank, address in enumerate(workers):
        last = (seen.get(address) or {}).get("last_seen")
        if isinstance(last, (int, float)) and newest_s - float(last) >= min_silence_s:
            silent[rank] = (address, newest_s - float(last))
    return silent


def worker_host(address: str) -> str:
    """``10.77.0.3`` of ``tcp://10.77.0.3:45751`` (the address as given when it has no host part)."""
    hostport = address.split("://", 1)[-1]
    return hostport.rsplit(":", 1)[0].strip("[]") or address


def stopped_answering_line(silent: dict[int, tuple[str, float]], rank: int, worker: str,
                           timeout_s: float, message: str) -> str:
    """The one line of a run that failed because ``silent`` hosts stopped answering: the
    hosts first, then the rank that timed out waiting for them and gloo's own words."""
    hosts = ", ".join(dict.fromkeys(worker_host(addr) for addr, _ in silent.values()))
    who = "; ".join(f"rank {r}, Dask worker {addr}, no heartbeat for {s:.0f} s"
                    for r, (addr, s) in sorted(silent.items()))
    noun = "host" if "," not in hosts else "hosts"
    return (f"{noun} {hosts} stopped answering ({who}): rank {rank} on {worker} timed out after "
            f"{timeout_s:g} s waiting for it in a collective ({message}); a link or host is down")
