"""Many runs on one cluster leave nothing behind (issue 30 item 3): a short version of
benchmarks/soak.py (its 200-run figures are in benchmarks/RESULTS.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"
_spec = importlib.util.spec_from_file_location("soak_benchmark", _PATH)
soak = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(soak)


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_twenty_runs_on_a_local_cluster_leave_no_process_descriptor_thread_task_or_topic(tmp_path):
    result = soak.local_soak(str(tmp_path / "results"), runs=20, warmup=3)
    print("\n" + soak.table("local", result))
    assert soak.violations(result["before"], result["after"]) == []
    # the runs' folders hold every run, and no live-run file is left
    runs = [p for p in (tmp_path / "results").iterdir() if not p.name.startswith(".")]
    assert len(runs) == 23
    assert not any((p / "parts").exists() or (p / "heartbeat.json").exists() for p in runs)
