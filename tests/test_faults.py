"""Faults outside a rank's code (issue 19 items 2, 4, 6), with a real deployment: a `dask
scheduler` and five `dask worker` subprocesses on 127.0.0.1
(gtopk_lab.orchestration.local_deployment), real gloo ranks
(tests/fault_ranks.toy_train: all-reduces, epoch checkpoints, faults on demand).

The tests share a deployment of five workers and run in file order, each using up part
of it: an out-of-memory rank (nothing lost), a worker stopped with SIGTERM and a restart
from the checkpoint (one worker gone), another without restarts (two gone), one retired
by the scheduler as an adaptive cluster would (three gone), then the scheduler SIGKILLed
under the last two, and the run resumed on a new scheduler.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration import results as store
from gtopk_lab.orchestration.lab import Lab
from gtopk_lab.orchestration.local_deployment import LocalDeployment
from gtopk_lab.training.checkpoint import read_latest
from gtopk_lab.worker.faults import PEER_LOST, failure_cause

import fault_ranks

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
N_WORKERS = 5
TIMEOUT_S = 20.0  # the Lab's collective / rendezvous timeout in these tests


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> Iterator[LocalDeployment]:
    # the workers and the scheduler (which unpickles task graphs) import fault_ranks by name
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")])}
    with LocalDeployment(tmp_path_factory.mktemp("deployment"), env=env) as dep:
        dep.start_scheduler()
        for i in range(N_WORKERS):
            dep.start_worker(f"w{i}", ["--nthreads", "1"])
        dep.wait_for_workers(N_WORKERS, timeout_s=90)
        yield dep


@pytest.fixture(scope="module")
def lab(deployment, tmp_path_factory) -> Iterator[Lab]:
    # connect_timeout_s is also how long the client tries to reconnect to a lost scheduler
    with Lab(deployment.address, out=str(tmp_path_factory.mktemp("runs")), timeout_s=TIMEOUT_S,
             connect_timeout_s=3, train_fn=fault_ranks.toy_train) as lab:
        yield lab


def _config(tmp_path: Path, **kw) -> RunConfig:
    custom = {"iters_per_epoch": 4, "sleep_s": 0.05, "marker_dir": str(tmp_path), **kw.pop("custom", {})}
    base = dict(method="dense", workers=2, epochs=6, sink_every=2, device="cpu", custom=custom)
    base.update(kw)
    return RunConfig(**base)


def _markers(folder: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in folder.glob("rank*-from*.json")}


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _wait_for_checkpoint(lab: Lab, handle, epoch: int = 1) -> None:
    folder = store.checkpoint_folder(lab.out, handle.run_id)
    _wait_for(lambda: (read_latest(folder) or {}).get("epoch", 0) >= epoch, 30, "a checkpoint")


def _worker_name(lab: Lab, address: str) -> str:
    return lab.worker_info()[address]["name"]


# ------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_out_of_memory_rank_fails_the_run_naming_rank_and_cause(lab, tmp_path):
    """Rank 1 allocates 1 GiB under RLIMIT_AS (torch: "can't allocate memory"); rank 0,
    blocked in the all-reduce, is freed at once, far inside the collective timeout."""
    handle = lab.submit(_config(tmp_path, custom={"oom_rank": 1, "oom_at": 3}))
    _, summary = handle.result(timeout_s=45)
    assert summary["status"] == "failed"
    first = summary["error"].splitlines()[0]
    assert first.startswith("rank 1 on tcp://127.0.0.1:") and "failed (out of memory)" in first
    assert "can't allocate memory" in first
    assert summary["failure"] == {"rank": 1, "worker": handle.workers[1], "cause": "out of memory"}
    assert "rank 0 on" in summary["error"] and "then failed" in summary["error"]
    ended = _markers(tmp_path)
    freed_after_s = ended["rank0-from0"]["at"] - ended["rank1-from0"]["at"]
    print(f"\nout of memory: rank 0 freed {freed_after_s:.2f} s after rank 1 failed")
    assert 0 <= freed_after_s < 5 < TIMEOUT_S
    stored = store.RunStore(lab.out, handle.run_id).read_summary()
    assert stored["failure"]["cause"] == "out of memory"


@pytest.mark.timeout(90)
def test_worker_stopped_with_sigterm_restarts_the_run_from_its_checkpoint(lab, deployment, tmp_path):
    config = _config(tmp_path, epochs=10, checkpoint=True, max_restarts=1)
    handle = lab.submit(config)
    _wait_for_checkpoint(lab, handle)
    victim = handle.workers[1]
    deployment.workers[_worker_name(lab, victim)].send_signal(signal.SIGTERM)  # `dask worker` stops
    _, summary = handle.result(timeout_s=70)
    assert summary["status"] == "completed", summary["error"]
    assert summary["restarts"] == 1
    reason = summary["restart_reasons"][0]
    assert reason.startswith(f"rank 1 lost: Dask worker {victim} left the cluster")
    assert "SIGTERM" in reason
    assert victim not in summary["dask_workers"]
    # same weights as an uninterrupted run, and every iteration's row exactly once per rank
    assert summary["final_train_loss"] == float(fault_ranks.expected_weights(config).sum())
    metrics = store.RunStore(lab.out, handle.run_id).read_metrics()
    total = fault_ranks.total_iterations(config)
    for rank in (0, 1):
        assert sorted(metrics[metrics["rank"] == rank]["iteration"]) == list(range(total))
    # the second start began at the checkpoint, not at iteration 0
    restarted = [m for m in _markers(tmp_path).values() if m["start"] > 0]
    assert {m["rank"] for m in restarted} == {0, 1}
    assert all(m["start"] % 4 == 0 and m["ended"] == "returned" for m in restarted)
    assert summary["restart_iterations"] == [restarted[0]["start"]]


@pytest.mark.timeout(60)
def test_worker_stopped_with_sigterm_fails_the_run_without_restarts(lab, deployment, tmp_path):
    handle = lab.submit(_config(tmp_path, epochs=50))
    _wait_for(lambda: len(handle.metrics) >= 4, 30, "rows")
    victim = handle.workers[1]
    deployment.workers[_worker_name(lab, victim)].send_signal(signal.SIGTERM)
    t_stop = time.monotonic()
    _, summary = handle.result(timeout_s=TIMEOUT_S + 10)
    detected_s = time.monotonic() - t_stop
    print(f"\nSIGTERM, max_restarts=0: run failed {detected_s:.1f} s after the signal")
    assert summary["status"] == "failed" and detected_s < TIMEOUT_S
    assert summary["error"].startswith(f"rank 1 lost: Dask worker {victim} left the cluster: "
                                       "it closed itself, reason signal-15 (SIGTERM)")
    assert summary["failure"] == {"rank": 1, "worker": victim, "cause": "worker left"}
    assert "restarts" not in summary


@pytest.mark.timeout(60)
def test_worker_retired_by_the_scheduler_fails_the_run_without_restarts(lab, tmp_path):
    handle = lab.submit(_config(tmp_path, epochs=50))
    _wait_for(lambda: len(handle.metrics) >= 4, 30, "rows")
    victim = handle.workers[1]
    t_retire = time.monotonic()
    lab.client.retire_workers([victim], close_workers=True, remove=True)
    _, summary = handle.result(timeout_s=TIMEOUT_S + 10)
    detected_s = time.monotonic() - t_retire
    print(f"\nretire_workers: run failed {detected_s:.1f} s after the call")
    assert summary["status"] == "failed" and detected_s < TIMEOUT_S
    assert summary["error"].startswith(f"rank 1 lost: Dask worker {victim} left the cluster")
    assert summary["failure"]["cause"] == "worker left"


@pytest.mark.timeout(90)
def test_scheduler_killed_mid_run_ends_run_and_ranks_then_resumes_on_a_new_scheduler(
        lab, deployment, tmp_path):
    config = _config(tmp_path, epochs=20, checkpoint=True)
    handle = lab.submit(config)
    _wait_for_checkpoint(lab, handle)
    workers = [deployment.workers[_worker_name(lab, a)] for a in handle.workers]
    os.kill(deployment.scheduler.pid, signal.SIGKILL)
    t_kill = time.time()
    _, summary = handle.result(timeout_s=60)
    detected_s = time.time() - t_kill
    error = summary["error"]
    assert summary["status"] == "failed"
    assert error.startswith(f"scheduler {deployment.address} unreachable ("), error
    assert "AttributeError" not in error and f"--resume {handle.run_id}" in error
    assert summary["failure"]["cause"] == "scheduler unreachable"
    # the ranks stopped on their own: their workers began closing when the scheduler went,
    # and the watchdog made the ranks' next sink calls raise; then the processes exited. The
    # first rank to stop did so by the watchdog; the other too, or (a loaded box: it was in
    # its all_reduce when the first one's process left) by gloo's peer-lost error
    _wait_for(lambda: len(_markers(tmp_path)) == 2, 20, "both ranks to stop")
    ranks = _markers(tmp_path)
    stopped_s = max(m["at"] for m in ranks.values()) - t_kill
    first, second = sorted(ranks.values(), key=lambda m: m["at"])
    assert first["ended"] in {"WorkerClosing", "SchedulerLost"}, ranks
    assert second["ended"] in {"WorkerClosing", "SchedulerLost"} or (
        second["ended"] == "RuntimeError" and failure_cause(RuntimeError(second["detail"])) == PEER_LOST), ranks
    for proc in workers:
        proc.wait(timeout=30)
    exited_s = time.time() - t_kill
    print(f"\nscheduler SIGKILL: client error after {detected_s:.1f} s, ranks stopped after "
          f"{stopped_s:.1f} s, worker processes gone after {exited_s:.1f} s")
    # within 60 s (the client's reconnect try, connect_timeout_s=3, here); the ranks at once,
    # not after scheduler_timeout_s (10 s): their workers began to close when the scheduler went
    assert detected_s < 60 and stopped_s < 5 < config.scheduler_timeout_s
    # resume on a new scheduler (an embedded cluster): from the newest checkpoint to the
    # weights of an uninterrupted run
    latest = read_latest(store.checkpoint_folder(lab.out, handle.run_id))
    assert latest is not None and latest["epoch"] >= 1
    with Lab(n_workers=2, out=lab.out, timeout_s=TIMEOUT_S, train_fn=fault_ranks.toy_train) as fresh:
        fast = handle.config.replace(custom={**handle.config.custom, "sleep_s": 0.0})
        _, done = fresh.submit(fast, resume=True).result(timeout_s=60)
    assert done["status"] == "completed", done["error"]
    assert done["final_train_loss"] == float(fault_ranks.expected_weights(handle.config).sum())
    metrics = store.RunStore(lab.out, handle.run_id).read_metrics()
    total = fault_ranks.total_iterations(handle.config)
    for rank in (0, 1):
        # every row once; from the checkpoint on all of them. Before it, the rows that were
        # on their way when the scheduler died may be missing: one batch (sink_every rows)
        # on a quiet box, two when the worker's stream had not flushed the one before
        # (seen with a busy loop beside the suite): within the epoch before the checkpoint,
        # whose rows the resumed run does not make again
        its = list(metrics[metrics["rank"] == rank]["iteration"])
        assert len(its) == len(set(its)) and set(range(latest["iteration"], total)) <= set(its)
        missing = set(range(total)) - set(its)
        assert all(latest["iteration"] - config.custom["iters_per_epoch"] <= i < latest["iteration"]
                   for i in missing), (missing, latest)
