"""A real Dask deployment on this machine: ``dask scheduler`` and ``dask worker`` subprocesses
on 127.0.0.1, as an operator starts them on a cluster (docs/deployment.md).

Tests, fault benchmarks and anyone trying the multi-machine path on a laptop start one
with :class:`LocalDeployment` instead of an embedded ``LocalCluster``, so that the client
talks to separate processes over tcp:// or tls:// exactly as it would to remote machines,
and a test can kill a worker or the scheduler with a signal.

1. :meth:`~LocalDeployment.start_scheduler` runs ``dask scheduler --host 127.0.0.1 --port 0
   --scheduler-file F`` and reads its address from F once written (no port race);
2. :meth:`~LocalDeployment.start_worker` runs ``dask worker ADDRESS --host 127.0.0.1
   --name NAME`` with the caller's extra flags;
3. :meth:`~LocalDeployment.wait_for_workers` connects a ``Client`` until n workers joined;
4. :meth:`~LocalDeployment.stop` sends SIGTERM to every process group at once (they shut
   down in parallel), then SIGKILL to whatever is left after ``grace_s``.

Every process runs in its own session, so a signal to its group reaches a nanny and its
worker process together. Logs go to ``folder/<name>.log``. Client side only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["LocalDeployment", "dask_command", "stop_process"]


def dask_command() -> list[str]:
    """The ``dask`` CLI next to this Python (a venv's), else the one on PATH."""
    exe = Path(sys.executable).with_name("dask")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("dask")
    if found is None:
        raise FileNotFoundError("the `dask` command is not installed next to this Python nor on PATH")
    return [found]


class LocalDeployment:
    """A scheduler and named workers, each a subprocess in its own session (module docstring).

    ``env``: the environment of every process (default: this one's); per-role
    environments go to :meth:`start_scheduler` / :meth:`start_worker`. Use as a context
    manager, or call :meth:`stop`.
    """

    def __init__(self, folder: str | Path, env: dict[str, str] | None = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ if env is None else env)
        self.address: str | None = None
        self.scheduler: subprocess.Popen[bytes] | None = None
        self.workers: dict[str, subprocess.Popen[bytes]] = {}

    # --- processes ------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None) -> subprocess.Popen[bytes]:
        with open(self.folder / f"{name}.log", "wb") as log:  # the child keeps its own handle
            return subprocess.Popen([*dask_command(), *args], stdout=log, stderr=subprocess.STDOUT,
                                    cwd=self.folder, env=self.env if env is None else env,
                                    start_new_session=True)

    def start_scheduler(self, args: list[str] = (), *, env: dict[str, str] | None = None,
                        timeout_s: float = 60) -> str:
        """Start ``dask scheduler`` (extra ``args``, e.g. ``["--protocol", "tls"]``) and return
        its address once it is listening. RuntimeError with its log if it exits or is late."""
        scheduler_file = self.folder / "scheduler.json"
        scheduler_file.unlink(missing_ok=True)
        self.scheduler = self._spawn("scheduler", ["scheduler", "--host", "127.0.0.1", "--port", "0",
                                                   "--no-dashboard", "--scheduler-file",
                                                   str(scheduler_file), *args], env)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.address = str(json.loads(scheduler_file.read_text())["address"])
                return self.address
            except (OSError, ValueError, KeyError):  # not written yet, or half written
                if self.scheduler.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"dask scheduler did not start\n{self.logs()}") from None
                time.sleep(0.1)

    def start_worker(self, name: str, args: list[str] = (), *,
                     env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``dask worker`` named ``name`` against the scheduler (extra ``args``, e.g.
        ``["--nthreads", "1", "--resources", "CPU=1"]``)."""
        if self.address is None:
            raise RuntimeError("start_scheduler() first: a worker needs the scheduler's address")
        if name in self.workers:
            raise ValueError(f"name={name!r} is invalid: a worker of that name was started already")
        self.workers[name] = self._spawn(name, ["worker", self.address, "--host", "127.0.0.1",
                                                "--name", name, "--no-dashboard", *args], env)
        return self.workers[name]

    def wait_for_workers(self, n: int, timeout_s: float = 90, security: Any = None) -> dict[str, Any]:
        """Block until ``n`` workers joined; returns the scheduler's worker info (address ->
        info). RuntimeError with the logs on time-out."""
        from distributed import Client

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with Client(self.address, security=security, timeout=5) as client:
                    client.wait_for_workers(n, timeout=max(1.0, deadline - time.monotonic()))
                    return dict(client.scheduler_info(n_workers=-1)["workers"])
            except (OSError, TimeoutError) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{n} workers did not join {self.address} within {timeout_s:g} s "
                                       f"({exc})\n{self.logs()}") from None
                time.sleep(0.5)

    def logs(self, tail_chars: int = 3000) -> str:
        """The end of every process's log, one section each."""
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-tail_chars:]}"
                         for p in sorted(self.folder.glob("*.log")))

    # --- ending ---------------------------------------------------------------------------
    def processes(self) -> list[subprocess.Popen[bytes]]:
        return [*self.workers.values(), *([self.scheduler] if self.scheduler is not None else [])]

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every process group, then SIGKILL what is still there after ``grace_s``."""
        procs = self.processes()
        for proc in procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in procs:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=10)

    def __enter__(self) -> LocalDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    """SIGTERM the process group of ``proc`` (started with ``start_new_session=True``), then
    SIGKILL it if it is still there after ``grace_s``."""
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait(timeout=10)


def _signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
