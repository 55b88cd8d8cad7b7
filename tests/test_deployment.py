"""A real deployment: `dask scheduler` + `dask worker` subprocesses on free 127.0.0.1 ports,
driven by `gtopk-lab run --scheduler` over tcp:// (tls:// with certificate files:
tests/test_tls_deployment.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gtopk_lab.comm.launch import free_port

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
TINY = ["--max-iterations", "3", "--train-samples", "256", "--test-samples", "64", "--batch-size", "16",
        "--epochs", "1", "--density", "0.05", "--no-progress"]


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()
    for proc in reversed(procs):
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextmanager
def deployment(tmp_path: Path, n_workers: int, tls: dict[str, str] | None = None) -> Iterator[str]:
    """Start a scheduler and ``n_workers`` one-thread workers; yield the scheduler address."""
    port = free_port()
    protocol = "tls" if tls else "tcp"
    address = f"{protocol}://127.0.0.1:{port}"
    tls_args = ["--tls-ca-file", tls["ca"], "--tls-cert", tls["cert"], "--tls-key", tls["key"]] if tls else []
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen(
            [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
             "--protocol", protocol, "--no-dashboard", *tls_args],
            stdout=subprocess.DEVNULL, stderr=open(logs / "scheduler.log", "w"), cwd=tmp_path))
        for i in range(n_workers):
            procs.append(subprocess.Popen(
                [str(BIN / "dask"), "worker", address, "--host", "127.0.0.1", "--nthreads", "1",
                 "--nworkers", "1", "--name", f"w{i}", "--resources", "CPU=1", "--no-dashboard",
                 "--protocol", protocol, *tls_args],
                stdout=subprocess.DEVNULL, stderr=open(logs / f"worker{i}.log", "w"), cwd=tmp_path))
        _wait_for_workers(address, n_workers, tls, timeout_s=90)
        yield address
    finally:
        _stop(procs)


def _wait_for_workers(address: str, n: int, tls: dict[str, str] | None, timeout_s: float) -> None:
    from distributed import Client
    from distributed.security import Security

    security = (Security(tls_ca_file=tls["ca"], tls_client_cert=tls["cert"], tls_client_key=tls["key"],
                         require_encryption=True) if tls else None)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with Client(address, security=security, timeout=5) as client:
                client.wait_for_workers(n, timeout=max(1.0, deadline - time.monotonic()))
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _cli(args: list[str], cwd: Path, timeout_s: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "gtopk-lab"), *args], capture_output=True, text=True,
                          timeout=timeout_s, cwd=cwd)


@pytest.mark.timeout(240)
def test_cli_run_against_dask_scheduler_and_worker_processes(tmp_path):
    out = tmp_path / "res"
    with deployment(tmp_path, 2) as address:
        proc = _cli(["run", "--scheduler", address, "--method", "gtopk", "--workers", "2", *TINY,
                     "--out", str(out), "--json"], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        assert summary["status"] == "completed"
        assert len(set(summary["dask_workers"])) == 2
        assert all(w.startswith("tcp://127.0.0.1:") for w in summary["dask_workers"])
        # too many ranks for this cluster: exit 2, one line, nothing written
        bad = _cli(["run", "--scheduler", address, "--workers", "3", *TINY, "--out", str(tmp_path / "bad")],
                   tmp_path)
        assert bad.returncode == 2
        assert "workers=3 is more than the 2" in bad.stderr and bad.stderr.count("\n") == 1
        assert not (tmp_path / "bad").exists()
    runs = _cli(["runs", "--out", str(out), "--json"], tmp_path)
    assert [r["status"] for r in json.loads(runs.stdout.strip().splitlines()[-1])] == ["completed"]


