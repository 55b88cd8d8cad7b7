"""Provenance recorded with every stored run (issue 15 item 6)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import gtopk_lab
from gtopk_lab import provenance as prov
from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration import results as store

REPO = Path(__file__).resolve().parent.parent


def _stored(tmp_path: Path, config: RunConfig, device: str | None = "cpu") -> dict:
    summary = store.run_summary(config, {"iterations": 1}, status="completed",
                                  extra={"device": device} if device else None)
    path = store.write_run(tmp_path, config, store.rows_to_frame([]), summary)
    return json.loads((path / "summary.json").read_text())["provenance"]


@pytest.mark.timeout(30)
def test_a_stored_run_records_versions_commit_host_device_and_network(tmp_path):
    config = RunConfig(method="gtopk", workers=2, bandwidth="1Gbps", latency="50us", run_id="r1")
    p = _stored(tmp_path, config)
    assert set(p) >= {"gtopk_lab_version", "git_commit", "versions", "host", "device", "network"}
    assert p["gtopk_lab_version"] == gtopk_lab.__version__
    if (REPO / ".git").exists():  # running from a checkout (this worktree)
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        assert re.fullmatch(r"[0-9a-f]{40}", p["git_commit"]) and p["git_commit"] == head
    versions = p["versions"]
    assert versions["python"] == platform.python_version()
    for name in ("torch", "dask", "distributed"):
        assert versions[name] == importlib.metadata.version(name)
    assert p["host"] == socket.gethostname() and p["device"] == "cpu"
    net = p["network"]
    assert net["bandwidth"] == "1Gbps" and net["latency"] == "50us" and net["calibration_file"] is None
    assert net["model"]["beta_s_per_byte"] == pytest.approx(8e-9)
    assert net["model"]["alpha_s"] == pytest.approx(50e-6)
    # the queued/running summaries (no device known yet) say what was asked for
    assert store.run_summary(config, None, status="queued")["provenance"]["device"] == "auto"


@pytest.mark.timeout(30)
def test_a_calibration_file_is_recorded_with_its_fitted_constants(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"model": {"alpha_s": 1.5e-4, "beta_s_per_byte": 1e-9, "name": "lab-net"}}))
    config = RunConfig(method="topk", workers=2, bandwidth=str(cal), run_id="r1")
    net = _stored(tmp_path / "out", config)["network"]
    assert net["calibration_file"] == str(cal.resolve()) and net["bandwidth"] == str(cal)
    assert net["model"]["name"] == "lab-net"
    assert net["model"]["alpha_s"] == pytest.approx(1.5e-4)
    assert net["model"]["beta_s_per_byte"] == pytest.approx(1e-9)
    cal.unlink()  # a file gone by the time the summary is written does not fail the run
    assert "no such calibration file" in prov.network(str(cal), None)["error"]


@pytest.mark.timeout(30)
def test_git_commit_is_none_outside_a_checkout_and_cached(tmp_path, monkeypatch):
    prov.git_commit.cache_clear()
    monkeypatch.setattr(prov, "__file__", str(tmp_path / "gtopk_lab" / "provenance.py"))
    try:
        assert prov.git_commit() is None
    finally:
        prov.git_commit.cache_clear()
    monkeypatch.undo()
    first = prov.git_commit()
    assert prov.git_commit.cache_info().hits == 0 and prov.git_commit() == first
    assert prov.git_commit.cache_info().hits == 1


@pytest.mark.timeout(150)
def test_provenance_imports_no_heavy_module():
    """(RunConfig validates methods through the registry, which imports torch: torch is expected.)"""
    code = ("import sys; from gtopk_lab.provenance import provenance; from gtopk_lab.config import RunConfig;"
            "provenance(RunConfig(bandwidth='1GbE'));"
            "print([m for m in ('dask', 'distributed', 'pandas', 'plotly', 'gtopk_lab.orchestration')"
            " if m in sys.modules])")
    # generous: importing torch alone took 40 s beside two busy loops (make test-stress)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
