"""A multi-host network on one machine with a real Dask deployment on it.

:class:`Testbed` (a context manager) builds, in order:

1. the network of :mod:`gtopk_lab.testbed.links`: N namespaces as hosts on one bridge,
   host i at ``10.77.0.(i+1)``, each link shaped to its rate both ways;
2. ``dask scheduler --host 10.77.0.1 --port 8786`` in host 0 (a fixed port is safe: the
   namespace is the testbed's own) and ``dask worker tcp://10.77.0.1:8786 --host
   10.77.0.(i+1) --nthreads 1`` in every other host, as an operator starts them;
3. waits until the N - 1 workers joined (a client inside host 0).

and removes it all on exit, on an exception and on Ctrl-C: every process inside the
namespaces is stopped and the namespaces deleted. A testbed left by a killed process is
stale: its state file names an owner that is gone, and the next :meth:`Testbed.up` of
that name (or ``gtopk-lab testbed down``) removes it first.

The client of a run lives inside a host too (:meth:`Testbed.run` / :meth:`Testbed.popen`
run a command in host i's namespace, typically ``gtopk-lab run --scheduler
tcp://10.77.0.1:8786`` in host 0), since the subnet exists only inside the testbed.
The processes get the caller's environment without ``GLOO_SOCKET_IFNAME`` /
``NCCL_SOCKET_IFNAME`` (the host's interface names mean nothing inside a namespace; the
ranks bind to their worker's interface), plus ``env``.

Faults for tests: :meth:`Testbed.set_link` takes a host off the switch and back,
:meth:`Testbed.set_rate` changes a host's rate while a run goes; :func:`change_host`
(``gtopk-lab testbed set``) does the same from another process.

Example::

    with Testbed(hosts=3, rate="200mbit") as tb:
        proc = tb.run(0, ["gtopk-lab", "run", "--scheduler", tb.scheduler_address,
                          "--workers", "2", "--method", "gtopk"])

Client side; needs root (:func:`~gtopk_lab.testbed.links.testbed_problem` says why not).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gtopk_lab.orchestration.local_deployment import dask_command
from gtopk_lab.testbed.links import (
    DEFAULT_BURST_S, DEFAULT_QUEUE_S, Link, TestbedError, check_name, create_network, destroy_network,
    host_links, namespace_pids, parse_rate_bps, process_alive, set_link_up, shape, testbed_names, testbed_problem,
)

__all__ = ["SCHEDULER_PORT", "Testbed", "change_host", "remove_testbed", "state_path", "testbed_status"]

SCHEDULER_PORT = 8786
#: where each testbed's state file lives (the owner pid, links, process ids, logs)
STATE_DIR = Path(os.environ.get("GTOPK_LAB_TESTBED_STATE", "/run/gtopk-lab"))
_UNBOUND_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def state_path(name: str) -> Path:
    return STATE_DIR / f"testbed-{check_name(name)}.json"


class Testbed:
    """N hosts on one shaped switch with a Dask scheduler and workers (module docstring).

    ``rate``: every host's rate each way ("200mbit", "1gbit", "1Gbps", "none");
    ``rate_per_host``: one rate per host overriding ``rate`` (a slower straggler);
    ``dask=False`` builds only the network; ``detached=True`` marks it as outliving this
    process (``gtopk-lab testbed up --detach``: only ``down`` removes it). ``worker_args`` are extra ``dask worker`` flags
    (``--no-nanny``, ``--resources ...``); ``folder`` keeps the logs (default: a temporary
    folder). ``shaper``: ``tbf`` or ``htb``; ``queue_s``: queue length in seconds of rate.
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, hosts: int, rate: str = "1gbit", rate_per_host: Sequence[str] | None = None, *,
                 name: str = "tb", subnet: str = "10.77.0.0/24", shaper: str = "tbf",
                 queue_s: float = DEFAULT_QUEUE_S, burst_s: float = DEFAULT_BURST_S, dask: bool = True,
                 worker_args: Sequence[str] = (),
                 folder: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None,
                 start_timeout_s: float = 120.0, detached: bool = False) -> None:
        if isinstance(hosts, bool) or not isinstance(hosts, int) or not (1 <= hosts <= 250):
            raise ValueError(f"hosts={hosts!r} is invalid: expected an integer in [1, 250]")
        if dask and hosts < 2:
            raise ValueError(f"hosts={hosts} is invalid: a Dask testbed needs host 0 for the "
                             "scheduler and at least one worker host")
        self.name = check_name(name)
        base = parse_rate_bps(rate, "rate")
        if rate_per_host is not None:
            if isinstance(rate_per_host, str):
                rate_per_host = [r for r in rate_per_host.split(",")]
            if len(rate_per_host) != hosts:
                raise ValueError(f"rate_per_host={list(rate_per_host)!r} is invalid: expected "
                                 f"{hosts} rates, one per host")
            rates = [parse_rate_bps(r, f"rate_per_host[{i}]") for i, r in enumerate(rate_per_host)]
        else:
            rates = [base] * hosts
        if shaper not in ("tbf", "htb"):
            raise ValueError(f"shaper={shaper!r} is invalid: expected tbf or htb")
        if not (0.001 <= float(queue_s) <= 10.0):
            raise ValueError(f"queue_s={queue_s!r} is invalid: expected seconds in [0.001, 10]")
        self.links: list[Link] = host_links(self.name, rates, subnet)
        if not (1e-6 <= float(burst_s) <= 1.0):
            raise ValueError(f"burst_s={burst_s!r} is invalid: expected seconds in [1e-6, 1]")
        self.subnet, self.shaper, self.queue_s = subnet, shaper, float(queue_s)
        self.burst_s = float(burst_s)
        self.dask, self.worker_args = dask, list(worker_args)
        self.start_timeout_s = float(start_timeout_s)
        self._tmp = None if folder is not None else tempfile.TemporaryDirectory(prefix=_temporary_prefix(name))
        self.folder = Path(folder if folder is not None else self._tmp.name)  # type: ignore[union-attr]
        base_env = {k: v for k, v in os.environ.items() if k not in _UNBOUND_ENV}
        self.env = {**base_env, **(env or {})}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.detached = bool(detached)
        self._up = False

    # --- addresses ------------------------------------------------------------------------
    @property
    def scheduler_address(self) -> str:
        return f"tcp://{self.links[0].address}:{SCHEDULER_PORT}"

    def address(self, host: int) -> str:
        return self.links[self._index(host)].address

    def _index(self, host: int) -> int:
        if isinstance(host, bool) or not isinstance(host, int) or not (0 <= host < len(self.links)):
            raise ValueError(f"host={host!r} is invalid: expected a host index in [0, {len(self.links) - 1}]")
        return host

    # --- life -----------------------------------------------------------------------------
    def up(self) -> Testbed:
        """Build the network and start the Dask processes; on failure remove everything."""
        problem = testbed_problem()
        if problem is not None:
            raise TestbedError(problem)
        if self.name in testbed_names():
            if not _is_stale(_read_state(self.name)):
                raise TestbedError(f"testbed {self.name!r} is up already: "
                                   f"`gtopk-lab testbed down --name {self.name}` removes it")
            destroy_network(self.name)  # stale: its owner is gone
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            create_network(self.name, self.links, self.shaper, self.queue_s, self.burst_s)
            self._up = True
            self._write_state()
            if self.dask:
                self._start_dask()
            self._write_state()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Stop every process in the testbed and delete its namespaces (idempotent)."""
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        destroy_network(self.name)  # stops whatever else runs inside, then deletes
        for proc in self.processes.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - destroy_network killed it
                proc.kill()
                proc.wait(timeout=5)
        self.processes.clear()
        state_path(self.name).unlink(missing_ok=True)
        self._up = False
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Testbed:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # --- processes ------------------------------------------------------------------------
    def popen(self, host: int, argv: Sequence[str], *, env: dict[str, str] | None = None,
              log: str | None = None, **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside host ``host`` (its own session, so a signal to its group
        reaches its children). ``log``: a file name under the testbed's folder for its
        output (else ``kwargs`` such as ``stdout=PIPE`` apply)."""
        link = self.links[self._index(host)]
        if log is not None:
            with open(self.folder / log, "wb") as fh:  # the child keeps its own handle
                kwargs.update(stdout=fh, stderr=subprocess.STDOUT)
                return self._spawn(link, argv, env, kwargs)
        return self._spawn(link, argv, env, kwargs)

    def _spawn(self, link: Link, argv: Sequence[str], env: dict[str, str] | None,
               kwargs: dict[str, Any]) -> subprocess.Popen[Any]:
        kwargs.setdefault("cwd", self.folder)
        return subprocess.Popen(["ip", "netns", "exec", link.namespace, *argv],
                                env={**self.env, **(env or {})}, start_new_session=True, **kwargs)

    def run(self, host: int, argv: Sequence[str], *, timeout_s: float = 120.0,
            env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in host ``host`` to its end and return its output (text); killed with
        its process group after ``timeout_s`` (``subprocess.TimeoutExpired`` then)."""
        extra = {"cwd": cwd} if cwd is not None else {}
        proc = self.popen(host, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **extra)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def _start_dask(self) -> None:
        dask = dask_command()
        scheduler_file = self.folder / "scheduler.json"
        scheduler_file.unlink(missing_ok=True)
        self.processes["scheduler"] = self.popen(
            0, [*dask, "scheduler", "--host", self.links[0].address, "--port", str(SCHEDULER_PORT),
                "--no-dashboard", "--scheduler-file", str(scheduler_file)], log="scheduler.log")
        for link in self.links[1:]:
            name = f"h{link.index}"
            self.processes[name] = self.popen(
                link.index, [*dask, "worker", self.scheduler_address, "--host", link.address,
                             "--name", name, "--nthreads", "1", "--nworkers", "1", "--no-dashboard",
                             *self.worker_args], log=f"{name}.log")
        self._wait_for_workers(len(self.links) - 1)

    def _wait_for_workers(self, n: int) -> None:
        """A client in host 0 waits until ``n`` workers joined (same code as a user's)."""
        probe = ("import sys; from distributed import Client\n"
                 f"with Client({self.scheduler_address!r}, timeout={self.start_timeout_s:g}) as c:\n"
                 f"    c.wait_for_workers({n}, timeout={self.start_timeout_s:g})\n")
        try:
            proc = self.run(0, [sys.executable, "-c", probe], timeout_s=self.start_timeout_s + 15)
        except subprocess.TimeoutExpired:
            raise TestbedError(f"{n} Dask workers did not join {self.scheduler_address} within "
                               f"{self.start_timeout_s:g} s\n{self.logs()}") from None
        if proc.returncode != 0:
            dead = [k for k, p in self.processes.items() if p.poll() is not None]
            raise TestbedError(f"the Dask deployment did not start ({', '.join(dead) or 'all alive'} "
                               f"exited): {proc.stderr.strip().splitlines()[-1:]}\n{self.logs()}")

    def logs(self, tail_chars: int = 2000) -> str:
        """The end of every process log, one section each."""
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-tail_chars:]}"
                         for p in sorted(self.folder.glob("*.log")))

    # --- faults ---------------------------------------------------------------------------
    def set_link(self, host: int, up: bool) -> None:
        """Pull host ``host``'s cable (``up=False``) or plug it back (``up=True``)."""
        set_link_up(self.links[self._index(host)], up)

    def set_rate(self, host: int, rate: str) -> None:
        """Change host ``host``'s rate each way now ("50mbit"; "none" removes the limit)."""
        i = self._index(host)
        bps = parse_rate_bps(rate, "rate")
        shape(self.links[i], bps, self.shaper, self.queue_s, burst_s=self.burst_s)
        self.links[i] = Link(**{**self.links[i].__dict__, "rate_bps": bps})
        self._write_state()

    # --- state ----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {"name": self.name, "owner_pid": None if self.detached else os.getpid(),
                "detached": self.detached, "subnet": self.subnet, "shaper": self.shaper,
                "queue_s": self.queue_s, "burst_s": self.burst_s, "folder": str(self.folder),
                "folder_is_temporary": self._tmp is not None,
                "scheduler": self.scheduler_address if self.dask else None,
                "hosts": [_link_to_dict(ln) for ln in self.links],
                "processes": {k: p.pid for k, p in self.processes.items()}}

    def _write_state(self) -> None:
        path = state_path(self.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.status(), indent=2))
        os.replace(tmp, path)


def _temporary_prefix(name: str) -> str:
    """The name start of the logs folder a testbed makes itself (no ``folder`` given)."""
    return f"gtopk-testbed-{name}-"


def _link_to_dict(link: Link) -> dict[str, Any]:
    return {"index": link.index, "namespace": link.namespace, "interface": link.ifname, "port": link.port,
            "address": link.address, "prefixlen": link.prefixlen, "rate_bps": link.rate_bps,
            "gso_max_bytes": link.gso_max_bytes}


def _link_from_dict(d: dict[str, Any]) -> Link:
    return Link(int(d["index"]), d["namespace"], d["interface"], d["port"], d["address"],
                int(d["prefixlen"]), d["rate_bps"], int(d["gso_max_bytes"]))


def change_host(name: str, host: int, *, up: bool | None = None, rate: str | None = None) -> dict[str, Any]:
    """From any process: take host ``host`` of testbed ``name`` off the switch or back
    (``up``), or change its rate each way (``rate``), as :meth:`Testbed.set_link` /
    :meth:`Testbed.set_rate` do. Returns the host's entry of the state file (updated)."""
    state = _read_state(check_name(name))
    if state is None or name not in testbed_names():
        raise TestbedError(f"no testbed {name}: `gtopk-lab testbed up --name {name} ...` builds one")
    hosts = state.get("hosts", [])
    if isinstance(host, bool) or not isinstance(host, int) or not (0 <= host < len(hosts)):
        raise ValueError(f"host={host!r} is invalid: testbed {name} has hosts 0..{len(hosts) - 1}")
    link = _link_from_dict(hosts[host])
    if up is not None:
        set_link_up(link, up)
    if rate is not None:
        bps = parse_rate_bps(rate, "rate")
        shape(link, bps, state["shaper"], state["queue_s"], burst_s=state["burst_s"])
        hosts[host]["rate_bps"] = bps
        path = state_path(name)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, path)
    return hosts[host]


def _read_state(name: str) -> dict[str, Any] | None:
    try:
        state = json.loads(state_path(name).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _is_stale(state: dict[str, Any] | None) -> bool:
    """No state file, or an owner process that is gone (a detached testbed has none)."""
    if state is None:
        return True
    if state.get("detached"):
        return False
    owner = state.get("owner_pid")
    return not (isinstance(owner, int) and process_alive(owner))


def testbed_status(name: str) -> dict[str, Any] | None:
    """What is known of testbed ``name``: its state file, whether its owner lives, and the
    processes running in each namespace; None when it does not exist."""
    if name not in testbed_names():
        return None
    found = _read_state(name)
    state = found if found is not None else {"name": name, "hosts": []}
    state["stale"] = _is_stale(found)
    for host in state.get("hosts", []):
        host["pids"] = namespace_pids(host["namespace"])
    return state


def remove_testbed(name: str) -> list[str]:
    """Remove testbed ``name`` whoever owns it, live or stale (``gtopk-lab testbed down``):
    its processes, namespaces and state file, and its log folder when the testbed made it
    (a killed owner could not). Returns the namespaces removed."""
    state = _read_state(name)
    removed = destroy_network(name)
    state_path(name).unlink(missing_ok=True)
    # only a folder of our own making: never a user's --folder
    if state and state.get("folder_is_temporary"):
        folder = Path(str(state.get("folder", "")))
        if folder.name.startswith(_temporary_prefix(name)) and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
    return removed

