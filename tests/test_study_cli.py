"""``gtopk-lab study`` end to end in a subprocess: the table with mean +- std, and Ctrl-C
(SIGINT) that cancels the running runs within 10 s, keeps the completed points, and a
second run of the same command that runs only what is missing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from child_signals import interruptible

pytestmark = pytest.mark.slow

GTOPK_LAB = str(Path(sys.executable).with_name("gtopk-lab"))
TINY = ["--model", "mlp", "--train-samples", "512", "--test-samples", "64", "--batch-size", "16",
        "--density", "0.05", "--no-progress"]


def _completed(out: Path) -> dict[tuple[str, int], str]:
    done = {}
    for summary in out.glob("*/summary.json"):
        data = json.loads(summary.read_text())
        if data.get("status") == "completed":
            done[(data["method"], data["workers"])] = data["run_id"]
    return done


@pytest.mark.timeout(180)
def test_study_cli_prints_mean_and_std_and_runs_beyond_the_cluster(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [GTOPK_LAB, "study", "--methods", "dense,gtopk", "--workers", "1,4", "--seeds", "2",
           "--n-workers", "2", "--max-iterations", "6", "--epochs", "4", *TINY, "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "+-" in done.stdout and "(n=2)" in done.stdout and "simulated" in done.stdout
    assert "check:" in done.stdout


@pytest.mark.timeout(180)
def test_sigint_cancels_within_10_s_keeps_completed_points_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # P=1 has no communication and ends at once; P=2 is paced to a 20 ms-latency link
    cmd = [GTOPK_LAB, "study", "--methods", "dense", "--workers", "1,2", "--n-workers", "2",
           "--max-iterations", "150", "--epochs", "50", "--latency", "20ms", "--throttle",
           "--sink-every", "1", *TINY, "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and ("dense", 1) not in _completed(out):
            time.sleep(0.2)
        assert ("dense", 1) in _completed(out), "the P=1 point did not complete"
        time.sleep(1.0)  # P=2 is training now
        lines: list[tuple[float, str]] = []
        reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in proc.stderr),
                                  daemon=True)
        reader.start()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = "".join(line for _, line in lines)
    assert proc.returncode == 130 and "interrupted" in err, err[-2000:]
    # the line comes once every run's ranks have stopped; closing the cluster follows
    said = next(t for t, line in lines if "interrupted" in line)
    assert said - t0 <= 10.0, f"the ranks stopped after {said - t0:.1f} s"
    first = _completed(out)
    assert set(first) == {("dense", 1)}
    again = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=150)
    assert again.returncode == 0, again.stderr[-3000:]
    second = _completed(out)
    assert second[("dense", 1)] == first[("dense", 1)]  # not run again
    assert ("dense", 2) in second
