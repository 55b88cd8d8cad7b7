"""Network faults on the multi-host testbed (issue 30 item 4): a host's link pulled mid-run,
and a link slowed mid-run, with real ``dask scheduler`` / ``dask worker`` processes in
network namespaces (gtopk_lab/testbed) and the client ``gtopk-lab run`` inside host 0.

The testbed tests need root, namespaces and ``tc``: they are skipped with the one-line
reason ``testbed_problem()`` gives where those are missing (CI runs as root with iproute2).
What is checked against what:

- link down: the address of the host whose switch port the test took down (the testbed's
  own ``address(2)``) must be the host the run's one-line error names, within the
  collective timeout the test set (``--timeout``) plus a margin; the rows the test read
  from the run folder before pulling the cable must all be there, unchanged, after the
  failure and after the resume (kept before the checkpoint, recomputed bit for bit after
  it: one thread per rank on the CPU); the resume after the link is back completes every
  iteration on both ranks;
- slow link: per iteration, communication time (``comm_s``, the smaller of the two ranks':
  the other's also holds its wait) of iterations that were on disk before the rate change
  (so surely ran at full rate) against iterations that surely ran at the low rate (after
  every row of the time of the change had reached disk, and before the rate was raised
  again); the low rate is also a floor: bytes per iteration over 5 Mbit/s;
- nothing left: the machine's namespaces, links and the testbed's routes read with ``ip``
  before and after, and every process that ran in the namespaces gone.

The unit tests at the end (no root) check the wording and the heartbeat rule on fakes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from gtopk_lab import testbed as testbed_pkg
from gtopk_lab.orchestration import faults
from gtopk_lab.orchestration import results as store
from gtopk_lab.orchestration.run_stream import part_files
from gtopk_lab.testbed.links import namespace_pids
from gtopk_lab.worker.faults import PEER_TIMEOUT, failure_cause
from testbed_support import alive as _alive, root_view as _root_view, run_env as _env, wait_for as _wait

PY = sys.executable
CLI = [PY, "-m", "gtopk_lab.cli"]
REPO = Path(__file__).resolve().parents[1]
#: the collective timeout of the down-link run (``--timeout``): small, so the test is quick
TIMEOUT_S = 10.0


@pytest.fixture()
def testbed_here() -> None:
    problem = testbed_pkg.testbed_problem()
    if problem is not None:
        pytest.skip(problem)


def _rows(out: Path, run_id: str) -> pd.DataFrame:
    """The run's rows on disk now (metrics.parquet overlaid by its parts); read again when
    the journal folded a part away in between."""
    for _ in range(20):
        try:
            return store.RunStore(out, run_id).read_metrics()
        except Exception:  # a part folded into metrics.parquet while it was read
            time.sleep(0.1)
    return store.RunStore(out, run_id).read_metrics()


def _done_by_both(out: Path, run_id: str) -> int:
    """The last iteration both ranks' rows on disk reach (-1: none yet)."""
    rows = _rows(out, run_id)
    if len(rows) == 0:
        return -1
    last = rows[rows["kind"] == "iter"].groupby("rank")["iteration"].max()
    return int(last.min()) if len(last) == 2 else -1


def _done_by_any(out: Path, run_id: str) -> int:
    rows = _rows(out, run_id)
    iters = rows[rows["kind"] == "iter"] if len(rows) else rows
    return int(iters["iteration"].max()) if len(iters) else -1


def _comm_per_iteration(rows: pd.DataFrame) -> pd.Series:
    iters = rows[rows["kind"] == "iter"]
    return iters.pivot(index="iteration", columns="rank", values="comm_s").min(axis=1)


def _client(tb: testbed_pkg.Testbed, argv: list[str]) -> subprocess.Popen[str]:
    return tb.popen(0, [*CLI, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stop(proc: subprocess.Popen[str] | None) -> None:
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


# --- a host's link goes down mid-run ---------------------------------------------------------
#: paced to at least 20 ms an iteration (``--latency 20ms --throttle``): the run lasts 10 s
#: or more whatever the CPU, and reaches half of it no sooner than 5 s after the start, so
#: the cable is pulled mid-run (after epoch 1, at most ~3 s in: the journal's 2 s flush and
#: this process's poll; before half) even when this process is slow to poll on a loaded
#: box; the resume then has only the rest of 512 iterations to do (each paced: the resume
#: is most of this test's time)
EPOCHS = 32
ITERATIONS = EPOCHS * 16  # epochs of 512 samples in batches of 2 x 16
DOWN_RUN = ["--method", "gtopk", "--workers", "2", "--density", "0.05", "--model", "mlp", "--dataset",
            "synthetic", "--train-samples", "512", "--test-samples", "64", "--batch-size", "16",
            "--epochs", str(EPOCHS), "--latency", "20ms", "--throttle", "--sink-every", "5", "--checkpoint",
            "--timeout", f"{TIMEOUT_S:g}", "--no-progress", "--json"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_host_whose_link_goes_down_fails_the_run_in_one_line_naming_it_and_a_resume_completes(
        tmp_path: Path, testbed_here: None) -> None:
    before = _root_view()
    out = tmp_path / "out"
    folder = out / "victim"
    proc = None
    with testbed_pkg.Testbed(hosts=3, rate="1gbit", name="tfdown", worker_args=["--no-nanny"],
                             folder=tmp_path / "tb", env=_env()) as tb:
        pids = [pid for link in tb.links for pid in namespace_pids(link.namespace)]
        try:
            proc = _client(tb, ["run", "--scheduler", tb.scheduler_address, *DOWN_RUN, "--out", str(out),
                                "--run-id", "victim"])
            # mid-run: an epoch checkpoint written and rows streamed into a part
            _wait(lambda: proc.poll() is not None or ((folder / "checkpoints" / "latest.json").exists()
                                                      and part_files(folder)), 240, "no checkpoint and part")
            streamed = _rows(out, "victim")
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert 0 < _done_by_any(out, "victim") < ITERATIONS // 2
            tb.set_link(2, False)  # host 2's cable pulled: its worker and rank go silent
            down_at = time.monotonic()
            stdout, stderr = proc.communicate(timeout=TIMEOUT_S + 120)
            failed_after_s = time.monotonic() - down_at
            print(f"\nlink down: the run failed {failed_after_s:.1f} s after the cable was pulled "
                  f"(collective timeout {TIMEOUT_S:g} s); {len(streamed)} rows on disk before it")
            assert proc.returncode == 1, stderr[-3000:]
            summary = json.loads(stdout.strip().splitlines()[-1])
            assert summary["status"] == "failed"
            first = summary["error"].splitlines()[0]
            print(f"link down: {first}")
            silent_host = tb.address(2)
            assert first.startswith(f"host {silent_host} stopped answering ("), first
            assert f"timed out after {TIMEOUT_S:g} s" in first and "Timed out waiting" in first
            assert summary["failure"]["cause"] == "stopped answering"
            assert summary["failure"]["worker"].startswith(f"tcp://{silent_host}:")
            # the gloo timeout, then at most a settle and a monitor tick: well within a margin
            assert TIMEOUT_S / 2 <= failed_after_s <= TIMEOUT_S + 30, failed_after_s
            kept = store.read_run(folder).metrics
            _same_rows(streamed, kept)

            tb.set_link(2, True)
            resumed = tb.run(0, [*CLI, "run", "--resume", "victim", "--out", str(out), "--scheduler",
                                 tb.scheduler_address, "--timeout", f"{TIMEOUT_S:g}", "--no-progress", "--json"],
                             timeout_s=360)
            assert resumed.returncode == 0, resumed.stderr[-3000:] + tb.logs()
            assert "resuming victim from epoch" in resumed.stderr
            done = json.loads(resumed.stdout.strip().splitlines()[-1])
            assert done["status"] == "completed" and done["iterations"] == ITERATIONS
        finally:
            _stop(proc)
        pids += [pid for link in tb.links for pid in namespace_pids(link.namespace)]
    final = store.RunStore(out, "victim").read_metrics()
    iters = final[final["kind"] == "iter"]
    for rank in (0, 1):
        assert sorted(iters[iters["rank"] == rank]["iteration"]) == list(range(ITERATIONS))
    _same_rows(streamed, final)
    assert _root_view() == before
    assert not any(_alive(pid) for pid in pids)
    assert "tfdown" not in testbed_pkg.testbed_names()


def _same_rows(streamed: pd.DataFrame, now: pd.DataFrame) -> None:
    """Every row read before the fault is in ``now`` with the same loss."""
    both = streamed.merge(now, on=["kind", "rank", "iteration"], suffixes=("_then", "_now"))
    assert len(streamed) > 0 and len(both) == len(streamed)
    assert (both["train_loss_then"] == both["train_loss_now"]).all()


# --- a link slowed mid-run -------------------------------------------------------------------
FAST, SLOW, SLOW_BPS = "1gbit", "5mbit", 5e6
#: enough that the run outlasts its slow phase (20 fast iterations, the settle, 20 slow
#: ones of ~0.1 s each: some 150-250 iterations in all) with a margin, and that the fast
#: phase stays below half of it while this process polls slowly on a loaded box (unpaced
#: fast iterations take a few ms; suites of 2026-12-06 changed the rate after 74 and 154);
#: more only lengthens the test after the rate goes up again (~10 ms an iteration)
SLOW_ITERATIONS = 1000
SLOW_RUN = ["--method", "dense", "--workers", "2", "--model", "mlp", "--dataset", "synthetic",
            "--train-samples", "8192", "--test-samples", "64", "--batch-size", "16", "--epochs", "12",
            "--max-iterations", str(SLOW_ITERATIONS), "--sink-every", "5", "--timeout", "30",
            "--no-progress", "--json"]
#: twice the journal's flush (2 s) plus a sink batch at the low rate (5 x ~0.1 s) and the
#: events' way to the client: every iteration done before the change is on disk by then (a
#: few late ones counted slow would not move the median of the 20 or more slow ones)
SETTLE_S = 5.0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_link_slowed_mid_run_shows_in_its_communication_times_and_the_run_finishes(
        tmp_path: Path, testbed_here: None) -> None:
    before = _root_view()
    out = tmp_path / "out"
    proc = None
    with testbed_pkg.Testbed(hosts=3, rate=FAST, name="tfslow", worker_args=["--no-nanny"],
                             folder=tmp_path / "tb", env=_env()) as tb:
        pids = [pid for link in tb.links for pid in namespace_pids(link.namespace)]
        try:
            proc = _client(tb, ["run", "--scheduler", tb.scheduler_address, *SLOW_RUN, "--out", str(out),
                                "--run-id", "slowed"])
            _wait(lambda: proc.poll() is not None or _done_by_both(out, "slowed") >= 20, 240, "no rows")
            fast_last = _done_by_both(out, "slowed")  # these ran at the full rate
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            tb.set_rate(2, SLOW)
            assert fast_last < SLOW_ITERATIONS // 2, fast_last
            time.sleep(SETTLE_S)
            slow_first = _done_by_any(out, "slowed") + 1  # started after the change
            _wait(lambda: proc.poll() is not None or _done_by_both(out, "slowed") >= slow_first + 20, 240,
                  "no iterations at the low rate")
            slow_last = _done_by_both(out, "slowed")  # done before the rate goes up again
            tb.set_rate(2, FAST)
            stdout, stderr = proc.communicate(timeout=400)
            assert proc.returncode == 0, stderr[-3000:] + tb.logs()
            summary = json.loads(stdout.strip().splitlines()[-1])
            assert summary["status"] == "completed" and summary["iterations"] == SLOW_ITERATIONS
        finally:
            _stop(proc)
        pids += [pid for link in tb.links for pid in namespace_pids(link.namespace)]
    rows = store.RunStore(out, "slowed").read_metrics()
    comm = _comm_per_iteration(rows)
    fast = comm.loc[1:fast_last]  # iteration 0 sets up gloo's pairs
    slow = comm.loc[slow_first:slow_last]
    wire_s = float(rows.loc[rows["kind"] == "iter", "bytes_sent"].median()) * 8 / SLOW_BPS
    print(f"\nslow link: comm per iteration {fast.median() * 1e3:.1f} ms at {FAST} ({len(fast)} iterations), "
          f"{slow.median() * 1e3:.1f} ms at {SLOW} ({len(slow)} iterations; the bytes alone take "
          f"{wire_s * 1e3:.1f} ms there), ratio {slow.median() / fast.median():.1f}")
    assert len(fast) >= 10 and len(slow) >= 10, (fast_last, slow_first, slow_last)
    assert slow.median() > 2 * fast.median(), (fast.median(), slow.median())
    assert slow.median() >= 0.5 * wire_s, (slow.median(), wire_s)
    assert _root_view() == before
    assert not any(_alive(pid) for pid in pids)
    assert "tfslow" not in testbed_pkg.testbed_names()


# --- without root: the wording and the heartbeat rule ----------------------------------------
def test_a_gloo_timeout_is_a_peer_timeout() -> None:
    gloo = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
            "Timed out waiting 10000ms for recv operation to complete")
    assert failure_cause(RuntimeError(gloo)) == PEER_TIMEOUT
    assert failure_cause(RuntimeError("[pair.cc:590] Read error [10.77.0.3]:4242: Connection timed out")) \
        == PEER_TIMEOUT
    assert failure_cause(RuntimeError("Connection closed by peer [10.77.0.3]:4242")) == "peer lost"
    assert failure_cause(ValueError("Timed out waiting for nothing")) == "error"


def test_the_silent_worker_is_the_one_whose_heartbeats_stopped() -> None:
    workers = ["tcp://10.77.0.2:4000", "tcp://10.77.0.3:4000", "tcp://10.77.0.4:4000"]
    seen = {workers[0]: {"last_seen": 1000.0}, workers[1]: {"last_seen": 988.5},
            workers[2]: {"last_seen": 999.2}}
    threshold = faults.silence_threshold_s(10.0)
    assert threshold == 5.0 and faults.silence_threshold_s(600) == 10.0 and faults.silence_threshold_s(1) == 2.0
    silent = faults.silent_workers(workers, seen, newest_s=1000.4, min_silence_s=threshold)
    assert silent == {1: (workers[1], pytest.approx(11.9))}
    assert faults.silent_workers(workers, seen, newest_s=None, min_silence_s=threshold) == {}
    assert faults.silent_workers(workers, {}, newest_s=1000.0, min_silence_s=threshold) == {}
    line = faults.stopped_answering_line(silent, 0, workers[0], 10.0, "RuntimeError: Timed out waiting 10000ms")
    assert "\n" not in line
    assert line.startswith("host 10.77.0.3 stopped answering (rank 1, Dask worker tcp://10.77.0.3:4000, "
                           "no heartbeat for 12 s): rank 0 on tcp://10.77.0.2:4000 timed out after 10 s")
    two = faults.stopped_answering_line({1: (workers[1], 12.0), 2: (workers[2], 11.0)}, 0, workers[0], 10.0, "x")
    assert two.startswith("hosts 10.77.0.3, 10.77.0.4 stopped answering (rank 1, ")


class _NoEvents:
    """A Dask client whose scheduler logged nothing about the worker (no closing, no retirement)."""

    def get_events(self, topic: str) -> list:
        return []


def test_a_worker_dropped_after_a_long_silence_stopped_answering_one_dropped_at_once_was_killed() -> None:
    """The default collective timeout (60 s) outlasts Dask's TCP keepalive (30 s): the
    scheduler drops a host that fell off the network first. Its last heartbeat is then
    about 30 s old; a SIGKILLed worker's (sockets closed by the kernel) is within one."""
    addr = "tcp://10.77.0.3:4000"
    cause, detail = faults.lost_worker_cause(_NoEvents(), addr, {"last_seen": 970.0}, silent_for_s=30.4,
                                             min_silence_s=faults.silence_threshold_s(60))
    assert cause == "stopped answering"
    assert detail.startswith("sent no heartbeat for 30 s, then the scheduler dropped it")
    cause, detail = faults.lost_worker_cause(_NoEvents(), addr, {"last_seen": 999.6}, silent_for_s=0.6,
                                             min_silence_s=faults.silence_threshold_s(60))
    assert cause == "killed" and detail.startswith("left the cluster without closing: killed")
    assert faults.lost_worker_cause(_NoEvents(), addr, None)[0] == "killed"  # nothing known: as before
