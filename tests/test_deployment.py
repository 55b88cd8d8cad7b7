"""A real deployment: `dask scheduler` + `dask worker` subprocesses on free 127.0.0.1 ports,
driven by `gtopk-lab run --scheduler` over tcp:// (tls:// with certificate files:
tests/test_tls_deployment.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gtopk_lab.orchestration.local_deployment import LocalDeployment

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
TINY = ["--max-iterations", "3", "--train-samples", "256", "--test-samples", "64", "--batch-size", "16",
        "--epochs", "1", "--density", "0.05", "--no-progress"]


@contextmanager
def deployment(tmp_path: Path, n_workers: int) -> Iterator[str]:
    """A scheduler and ``n_workers`` one-thread workers; yields the scheduler address."""
    with LocalDeployment(tmp_path / "logs") as dep:
        address = dep.start_scheduler()
        for i in range(n_workers):
            dep.start_worker(f"w{i}", ["--nthreads", "1", "--nworkers", "1", "--resources", "CPU=1"])
        dep.wait_for_workers(n_workers, timeout_s=90)
        yield address


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


