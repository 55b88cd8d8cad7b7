"""Helpers to run real torch.distributed process groups on one machine (tests, benchmarks).

- :func:`free_port` — a free TCP port on 127.0.0.1 (bind port 0; never a fixed port).
- :func:`run_gloo` — run ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes
  joined in a gloo group on 127.0.0.1; returns each rank's return value in rank order,
  raises ``RuntimeError`` with the failing rank's traceback, kills everything on timeout.
- :func:`set_single_thread` — one intra-op thread per process (many ranks share few cores).
- :func:`master_store` — a ``TCPStore`` master that listens on one address only.
- :func:`bind_to_interface` — point gloo and NCCL at the interface that carries a
  worker's address (:func:`interface_for_address`), unless the environment chose one.

The rendezvous store is a ``TCPStore`` owned by the calling process on a port the OS picks
(port 0), so concurrent ``run_gloo`` calls never collide and there is no port race.

Example::

    def work(rank, world_size, x):
        t = torch.full((3,), float(rank + x))
        torch.distributed.all_reduce(t)
        return t

    results = run_gloo(work, 4, 1.0, timeout_s=60)
"""

from __future__ import annotations

import ipaddress
import os
import pickle
import queue as queue_mod
import socket
import time
import traceback
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psutil
import torch
import torch.distributed as dist

from gtopk_lab.comm.allocator import tune_for_collectives
from gtopk_lab.comm.process_start import adopt_state, child_state, process_context

__all__ = ["free_port", "run_gloo", "set_single_thread", "master_store", "LOCALHOST",
           "InterfaceBinding", "bind_to_interface", "interface_for_address", "SOCKET_IFNAME_VARS"]

LOCALHOST = "127.0.0.1"


def free_port(host: str = LOCALHOST) -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it via port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def set_single_thread() -> None:
    """Use one intra-op (and, where still possible, inter-op) thread in this process."""
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # only allowed before any parallel work started
        pass


def _loopback_ifname() -> str | None:
    for name in ("lo", "lo0"):
        if os.path.exists(f"/sys/class/net/{name}"):
            return name
    return None


def master_store(host: str, world_size: int | None, timeout: timedelta) -> dist.TCPStore:
    """A ``TCPStore`` master listening on ``host``'s address only, on a port the OS picks.

    ``TCPStore(host, 0, is_master=True)`` listens on every interface whatever ``host``
    says. Here the listening socket is bound first (``socket.create_server((host, 0))``)
    and handed over with ``master_listen_fd``: a store for 127.0.0.1 is unreachable from
    the network, and a Dask worker's store listens on the address its peers are told.
    Read the port from ``store.port``. (A torch whose libuv backend refuses a listening
    fd gets the legacy backend, which takes it.)
    """
    sock = socket.create_server((host, 0))
    port = sock.getsockname()[1]
    fd = sock.detach()  # the store owns the listening socket from here on
    try:
        try:
            return dist.TCPStore(host, port, world_size, True, timeout=timeout,
                                 wait_for_workers=False, master_listen_fd=fd)
        except RuntimeError:
            return dist.TCPStore(host, port, world_size, True, timeout=timeout,
                                 wait_for_workers=False, master_listen_fd=fd, use_libuv=False)
    except Exception:
        os.close(fd)
        raise


#: The variables through which gloo and NCCL take the interface their sockets bind to.
SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
#: what :func:`bind_to_interface` itself set in this process (so a later run does not take
#: its own earlier choice for the operator's)
_BOUND_HERE: dict[str, str] = {}


@dataclass(frozen=True)
class InterfaceBinding:
    """The interface a rank's gloo / NCCL sockets use, and why."""

    interface: str
    #: "GLOO_SOCKET_IFNAME" (the environment's choice) or "worker address <ip>"
    source: str

    def to_dict(self) -> dict[str, str]:
        return {"interface": self.interface, "source": self.source}


def interface_for_address(address: str) -> str | None:
    """The name of this host's interface that carries ``address`` (an IP or a host name,
    resolved to its addresses; IPv4 or IPv6), or None when no interface does."""
    try:
        wanted = {ipaddress.ip_address(address)}
    except ValueError:
        try:
            wanted = {ipaddress.ip_address(info[4][0].split("%")[0])
                      for info in socket.getaddrinfo(address, None, proto=socket.IPPROTO_TCP)}
        except (socket.gaierror, ValueError):
            return None
    for name, addrs in psutil.net_if_addrs().items():
        for addr in addrs:
            if addr.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                if ipaddress.ip_address(addr.address.split("%")[0]) in wanted:
                    return name
            except ValueError:
                continue
    return None


def bind_to_interface(host: str, environ: MutableMapping[str, str] | None = None) -> InterfaceBinding:
    """Make gloo (``GLOO_SOCKET_IFNAME``) and NCCL (``NCCL_SOCKET_IFNAME``) bind to the
    interface that carries ``host``, the address the rank's Dask worker is reached at.

    Without it gloo binds to the address the machine's hostname resolves to, which on
    many Debian/Ubuntu hosts is 127.0.1.1 (``/etc/hosts``): each rank then tells its
    peers a loopback address, and a multi-host run fails in ``connectFullMesh``.

    1. A variable already set in ``environ`` (default ``os.environ``) by the operator wins
       and is left alone; the binding then reports ``GLOO_SOCKET_IFNAME``.
    2. Otherwise the interface carrying ``host`` (:func:`interface_for_address`) is
       written into both variables of ``environ`` (gloo and NCCL read them when a
       process group is created, so it must happen before ``init_process_group``).
    3. No interface carries ``host`` (a contact address that is not this machine's):
       ``ValueError``, one line, instead of a rendezvous that times out.
    Cost: one ``getifaddrs`` (microseconds); a host name adds one resolver call.
    """
    env = os.environ if environ is None else environ
    chosen = {var: env[var] for var in SOCKET_IFNAME_VARS
              if env.get(var) and env.get(var) != _BOUND_HERE.get(var)}
    if "GLOO_SOCKET_IFNAME" in chosen:
        return InterfaceBinding(chosen["GLOO_SOCKET_IFNAME"], "GLOO_SOCKET_IFNAME")
    interface = interface_for_address(host)
    if interface is None:
        names = ", ".join(sorted(psutil.net_if_addrs()))
        raise ValueError(f"worker address {host!r} is on no network interface of this host "
                         f"({names}): start the worker with --host set to one of its own "
                         "addresses, or set GLOO_SOCKET_IFNAME")
    for var in SOCKET_IFNAME_VARS:
        if var not in chosen:
            env[var] = interface
            if environ is None:
                _BOUND_HERE[var] = interface
    return InterfaceBinding(interface, f"worker address {host}")


def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, port: int,
               results: Any, args: tuple[Any, ...], timeout_s: float,
               state: dict[str, Any] | None = None) -> None:
    adopt_state(state)
    set_single_thread()
    tune_for_collectives()
    ifname = _loopback_ifname()
    if ifname is not None:  # gloo binds its sockets on loopback only
        os.environ.setdefault("GLOO_SOCKET_IFNAME", ifname)
    initialised = False
    try:
        store = dist.TCPStore(LOCALHOST, port, world_size, is_master=False,
                              timeout=timedelta(seconds=timeout_s))
        _join_process_group(store, rank, world_size, timedelta(seconds=timeout_s))
        initialised = True
        results.put((rank, None, b""))  # ready: the fn timeout starts when all ranks are
        value = fn(rank, world_size, *args)
        results.put((rank, True, pickle.dumps(value)))
    except BaseException:  # noqa: BLE001 - report everything, including SystemExit
        results.put((rank, False, traceback.format_exc()))
    finally:
        if initialised:
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - the group may be broken after a peer died
                pass


#: the join barrier's keys in the rendezvous store (init_process_group's own live under default_pg/)
_JOINED_KEY = "gtopk_lab/joined/"


def _join_process_group(store: dist.Store, rank: int, world_size: int, timeout: timedelta,
                        backend: str = "gloo") -> None:
    """``init_process_group`` on ``store``, returning only once every rank's call has returned.

    gloo connects each pair asymmetrically: one rank connects, writes the sequence number
    the other expects and counts the pair as connected at once; the other rank takes the
    connection later, on its own loop thread. A rank that returns early and closes its
    sockets (a function that does not communicate, a rank that stops at once) can make a
    slower peer's ``connectFullMesh`` fail with "Connection closed by peer": the peer was
    still connecting. That is the load flake of run_gloo (1 run in 30 of two ranks beside
    the other developers' jobs). A retry cannot mend it (the rank that closed has left),
    so no rank may leave before all have joined:

    1. ``init_process_group(backend, store=store, ...)``;
    2. set ``_JOINED_KEY + rank``, wait for every rank's key (``timeout``).

    Cost: one store write and one wait per rank. torch has the same barrier behind
    ``TORCH_DIST_INIT_BARRIER=1``.
    """
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    store.set(f"{_JOINED_KEY}{rank}", b"1")
    store.wait([f"{_JOINED_KEY}{r}" for r in range(world_size)], timeout)


def _stop(procs: list[Any]) -> None:
    # a process whose start() failed (e.g. spawn refused outside a __main__ guard) was
    # never started and cannot be joined: leave it out, so the original error surfaces
    procs = [p for p in procs if p.pid is not None]
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 3.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(2.0)


def run_gloo(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 60.0,
             startup_s: float = 60.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` real gloo ranks; return values in rank order.

    ``fn`` and ``args`` must be picklable (a module-level function). The ranks start from
    the preloaded forkserver of :mod:`gtopk_lab.comm.process_start` (spawn where the OS
    has none), with the caller's environment and working directory. Each
    rank uses one thread, binds gloo to loopback and initialises the default group with
    ``timeout=timeout_s``; the group is destroyed in ``finally``. If any rank raises (or dies),
    every rank is stopped and ``RuntimeError`` carries that rank's traceback. If the ranks
    have not all finished after ``timeout_s`` (+ start-up allowance), all are killed and a
    ``RuntimeError`` says which ranks were missing. Never hangs.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} is invalid: expected an integer >= 1")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r} is invalid: expected a number > 0")
    ctx = process_context()
    state = child_state()
    store = master_store(LOCALHOST, None, timedelta(seconds=timeout_s))
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, name=f"gloo-rank-{r}",
                         args=(fn, r, world_size, store.port, results, args, timeout_s, state),
                         daemon=True)
             for r in range(world_size)]
    values: dict[int, Any] = {}
    ready: set[int] = set()
    # A spawned child imports torch: allow for that on a loaded machine until all
    # ranks have joined the group; from then on fn gets timeout_s.
    deadline = time.monotonic() + timeout_s + startup_s
    try:
        for p in procs:
            p.start()
        while len(values) < world_size:
            try:
                rank, ok, payload = results.get(timeout=0.2)
            except queue_mod.Empty:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(values))
                    raise RuntimeError(f"run_gloo({getattr(fn, '__name__', fn)}, world_size={world_size}) "
                                       f"timed out after {timeout_s:.0f}s; ranks {missing} did not finish") from None
                for r, p in enumerate(procs):
                    if r not in values and not p.is_alive() and p.exitcode not in (0, None):
                        # give a dying rank's queued traceback a moment to arrive
                        try:
                            rank, ok, payload = results.get(timeout=1.0)
                            break
                        except queue_mod.Empty:
                            raise RuntimeError(f"rank {r} of {world_size} died with exit code "
                                               f"{p.exitcode} without reporting") from None
                else:
                    continue
            if ok is None:
                ready.add(rank)
                if len(ready) == world_size:
                    deadline = min(deadline, time.monotonic() + timeout_s)
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} of {world_size} failed:\n{payload}")
            values[rank] = pickle.loads(payload)
        for p in procs:
            p.join(5.0)
        return [values[r] for r in range(world_size)]
    finally:
        _stop(procs)
        results.close()
        results.join_thread()
        del store
