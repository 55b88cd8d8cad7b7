"""Worker reservations kept on the Dask scheduler, shared by every client of a cluster.

Client side (the plugin object is built here and runs inside the scheduler). Each Lab used
to keep its own table of busy workers, so two clients of one scheduler could pick the same
workers at once, and a run placed on some of them could wait in its rendezvous forever.
Now one table lives in the scheduler's process, and every change to it is one handler
call in the scheduler's event loop, which runs one handler at a time: a reservation is
all-or-nothing and atomic across clients.

1. **Registration** (:func:`install`): every Lab registers :class:`ReservationPlugin`
   under :data:`PLUGIN_NAME` with ``idempotent=True``, so the first client's plugin stays
   and later clients share its table. The module imports only the standard library and
   ``distributed`` and is pickled by value, so a scheduler without gtopk-lab installed
   runs it too.
2. **Reserve** (``gtopk_lab_reserve``; :meth:`ReservationTable.reserve`): a run asks for
   ``needed`` of its ``candidates`` (the eligible workers in the order the Lab picks them).
   A candidate is free when no run holds it and the scheduler sees no task processing on
   it. Older waiting requests of any client (FIFO by arrival at the scheduler) first set
   aside up to what they need from the free workers they could use; the run gets the
   first ``needed`` of what is left, or nothing and a reason (how many workers other
   clients' runs hold, how many are busy, how many are kept for older runs). A refused
   run is remembered as waiting, so workers that become free go to the oldest run first:
   nobody starves behind a stream of small runs.
3. **Release** (``gtopk_lab_release``): a run's reservation and waiting entry are dropped
   when it ends or is cancelled; ``gtopk_lab_forget`` then deletes its rendezvous Variable
   and drops that Variable's event topic and the run's metrics topic (Dask keeps every topic and its last events for the
   scheduler's life: the soak found two topics, one holding the run's rows, per run). A run that restarts (a worker was lost) releases with
   ``keep_place``: its workers are freed, and it waits again under the arrival number it
   first asked with, so runs queued meanwhile by other clients do not overtake it.
4. **Stale entries**: a client that disappears (closed, killed, network gone) loses its
   reservations and waiting entries when the scheduler removes it
   (``SchedulerPlugin.remove_client``); a waiting entry not renewed for
   :data:`WAITING_STALE_S` is dropped too (its client stopped asking).

Cost: reserve is O(R W + H) for W candidate workers, R waiting runs and H held workers
(tens at most), one scheduler round trip per dispatch attempt of the head of a Lab's
queue (every ``poll_interval_s`` while it waits); release is O(H).
"""

from __future__ import annotations

import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

#: Name of the plugin on the scheduler (one per cluster, shared by every client).
PLUGIN_NAME = "gtopk-lab-reservations"
#: Seconds after which a waiting request that was not asked again is forgotten.
WAITING_STALE_S = 15.0


class _Waiter:
    """A refused request: its arrival number, client, needs and when it last asked."""

    __slots__ = ("seq", "client", "needed", "candidates", "seen")

    def __init__(self, seq: int, client: str, needed: int, candidates: list[str], seen: float) -> None:
        self.seq, self.client, self.needed, self.candidates, self.seen = seq, client, needed, candidates, seen


class ReservationTable:
    """Reservations ``{worker: (run_id, client)}`` and the waiting requests
    (``{"<client> <run_id>": _Waiter}``, in arrival order). A run is named by its id and its
    client, so two clients that reuse a run id never get each other's workers."""

    def __init__(self) -> None:
        self.held: dict[str, tuple[str, str]] = {}
        self.waiting: dict[str, _Waiter] = {}
        #: arrival number of each run holding workers ("<client> <run_id>"), for keep_place
        self.granted: dict[str, int] = {}
        self._seq = 0

    def reserve(self, run_id: str, client: str, needed: int, candidates: list[str],
                busy: set[str], now: float) -> dict[str, Any]:
        """``{"workers": [...]}`` (now held by ``run_id``) or ``{"workers": None, ...counts}``."""
        self._expire(now)
        mine = [a for a, held_by in self.held.items() if held_by == (run_id, client)]
        if mine:  # asked again after a lost answer: the same workers
            return {"workers": [a for a in candidates if a in mine] or mine}
        free = [a for a in candidates if a not in self.held and a not in busy]
        key = f"{client} {run_id}"
        me = self.waiting.get(key)
        seq = me.seq if me is not None else self._seq
        if me is None:
            self._seq += 1
        kept: set[str] = set()
        for waiter in sorted(self.waiting.values(), key=lambda w: w.seq):
            if waiter.seq >= seq or waiter is me:
                continue
            usable = [a for a in waiter.candidates if a in free and a not in kept]
            kept.update(usable[: waiter.needed])
        left = [a for a in free if a not in kept]
        if len(left) >= needed:
            self.waiting.pop(key, None)
            chosen = left[:needed]
            for addr in chosen:
                self.held[addr] = (run_id, client)
            self.granted[key] = seq
            return {"workers": chosen}
        if me is None:
            self.waiting[key] = _Waiter(seq, client, needed, list(candidates), now)
        else:
            me.needed, me.candidates, me.seen = needed, list(candidates), now
        others = sum(1 for a in candidates if a in self.held and self.held[a][1] != client)
        own = sum(1 for a in candidates if a in self.held and self.held[a][1] == client)
        return {"workers": None, "needed": needed, "free": len(left), "held_by_others": others,
                "held_by_self": own, "busy": sum(1 for a in candidates if a in busy and a not in self.held),
                "kept_for_older": len(kept & set(candidates))}

    def release(self, run_id: str, client: str, keep_place: bool = False,
                now: float | None = None) -> list[str]:
        """Drop ``client``'s run ``run_id``: its reservation and waiting entry; the workers it
        held. ``keep_place`` (a restart): it waits again under its first arrival number."""
        key = f"{client} {run_id}"
        self.waiting.pop(key, None)
        seq = self.granted.pop(key, None)
        freed = [a for a, held_by in self.held.items() if held_by == (run_id, client)]
        for addr in freed:
            del self.held[addr]
        if keep_place and seq is not None and freed:
            self.waiting[key] = _Waiter(seq, client, len(freed), list(freed),
                                        time.monotonic() if now is None else now)
        return freed

    def drop_client(self, client: str) -> None:
        """Forget everything ``client`` held or waited for."""
        for addr in [a for a, (_, c) in self.held.items() if c == client]:
            del self.held[addr]
        for key in [k for k in self.granted if k.split(" ", 1)[0] == client]:
            del self.granted[key]
        for key in [k for k, w in self.waiting.items() if w.client == client]:
            del self.waiting[key]

    def _expire(self, now: float) -> None:
        for key in [k for k, w in self.waiting.items() if now - w.seen > WAITING_STALE_S]:
            del self.waiting[key]


class ReservationPlugin(SchedulerPlugin):
    """The scheduler side: the table and its three handlers (see the module docstring)."""

    idempotent = True
    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.table = ReservationTable()
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        scheduler.handlers["gtopk_lab_reserve"] = self.reserve
        scheduler.handlers["gtopk_lab_release"] = self.release
        scheduler.handlers["gtopk_lab_reservations"] = self.snapshot
        scheduler.handlers["gtopk_lab_forget"] = self.forget

    def reserve(self, run_id: str, client: str, needed: int, candidates: list[str]) -> dict[str, Any]:
        workers = self.scheduler.workers
        known = [a for a in candidates if a in workers]
        busy = {a for a in known if workers[a].processing}
        return self.table.reserve(run_id, client, int(needed), known, busy, time.monotonic())

    def release(self, run_id: str, client: str, keep_place: bool = False) -> list[str]:
        return self.table.release(run_id, client, keep_place=bool(keep_place))

    async def forget(self, variables: list[str], topics: list[str]) -> int:
        """Delete the Dask Variables ``variables`` and drop their event topics and ``topics``
        that no client subscribes to any more, in this order, in one handler call (Dask
        keeps every topic and its last events for the scheduler's life: ``Broker._topics``,
        no public way out; a Variable's delete logs on the topic ``variable-<name>``)."""
        extension = self.scheduler.extensions.get("variables")
        for name in variables:
            if extension is not None and name in getattr(extension, "variables", {}):
                await extension.delete(name=name)
        known = getattr(getattr(self.scheduler, "_broker", None), "_topics", None)
        dropped = 0
        for topic in [f"variable-{n}" for n in variables] + list(topics) if known is not None else ():
            if topic in known and not known[topic].subscribers:
                del known[topic]
                dropped += 1
        return dropped

    def snapshot(self) -> dict[str, Any]:
        return {"held": {a: list(v) for a, v in self.table.held.items()},
                "waiting": {k: {"client": w.client, "needed": w.needed, "seq": w.seq}
                            for k, w in self.table.waiting.items()}}

    def remove_client(self, scheduler: Any, client: str) -> None:
        self.table.drop_client(client)


def install(client: Any) -> None:
    """Register the plugin on ``client``'s scheduler (a no-op when one is there)."""
    import sys

    import cloudpickle

    # by value: the scheduler need not have gtopk-lab installed to run the table
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    client.register_plugin(ReservationPlugin(), name=PLUGIN_NAME)


def waiting_reason(answer: dict[str, Any]) -> str:
    """One line from a refused reservation: ``waiting for 2 of 2 workers: 2 held by other clients' runs``."""
    needed = int(answer.get("needed", 0))
    missing = max(needed - int(answer.get("free", 0)), 0)
    parts = [(answer.get("held_by_others", 0), "held by other clients' runs"),
             (answer.get("held_by_self", 0), "held by this Lab's runs"),
             (answer.get("busy", 0), "busy with other Dask tasks"),
             (answer.get("kept_for_older", 0), "kept for older queued runs")]
    why = ", ".join(f"{n} {text}" for n, text in parts if n)
    return f"waiting for {missing} of {needed} workers" + (f": {why}" if why else "")


def reserve(client: Any, run_id: str, needed: int, candidates: list[str]) -> dict[str, Any]:
    """One reserve call on the scheduler (see :meth:`ReservationTable.reserve`)."""
    return client.sync(client.scheduler.gtopk_lab_reserve, run_id=run_id, client=client.id,
                       needed=int(needed), candidates=list(candidates))


def release(client: Any, run_id: str, keep_place: bool = False) -> list[str]:
    """Give ``run_id``'s workers back on the scheduler; ``keep_place`` for a restart (the
    run keeps its place in the cross-client queue)."""
    return client.sync(client.scheduler.gtopk_lab_release, run_id=run_id, client=client.id,
                       keep_place=bool(keep_place))


def forget(client: Any, variables: list[str] = (), topics: list[str] = ()) -> int:
    """Delete an ended start's rendezvous ``variables`` and drop their topics and ``topics``
    (an ended run's metrics topic) on the scheduler, unless a client still subscribes to
    them; how many topics were dropped."""
    return client.sync(client.scheduler.gtopk_lab_forget, variables=list(variables), topics=list(topics))


def snapshot(client: Any) -> dict[str, Any]:
    """The scheduler's table: ``{"held": {worker: [run_id, client]}, "waiting": {...}}``."""
    return client.sync(client.scheduler.gtopk_lab_reservations)
