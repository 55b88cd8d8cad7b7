"""Failure handling of Lab runs with real Dask worker processes and real gloo groups.

The rank functions here have train_rank's signature but fail on purpose; they do
real gloo all-reduces so that surviving ranks are blocked in a collective when a
peer dies, as in a real run. They are shipped to the workers by value.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from types import SimpleNamespace

import cloudpickle
import pytest

from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration.lab import Lab
from gtopk_lab.orchestration.results import load_runs

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.slow


def _row(config: RunConfig, rank: int, it: int, world: int) -> dict:
    return {"kind": "iter", "rank": rank, "iteration": it, "epoch": it / 100.0, "method": config.method,
            "workers": world, "density": config.density, "k": 1, "train_loss": 1.0 / (it + 1),
            "lr": config.lr, "compute_s": 0.0, "selection_s": 0.0, "comm_s": 0.0, "update_s": 0.0,
            "comm_model_s": 0.0, "bytes_sent": 16, "bytes_recv": 16, "wall_time_s": 0.0,
            "virtual_time_s": 0.0}


def allreduce_train(config: RunConfig, sink=None, device=None):
    """All-reduce loop; ``config.custom`` may ask a rank to raise at an iteration."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    rows, buf = [], []
    fail_rank = config.custom.get("fail_rank")
    fail_at = config.custom.get("fail_at", -1)
    for it in range(config.max_iterations or 10):
        if rank == fail_rank and it == fail_at:
            raise FloatingPointError(f"injected failure at iteration {it}")
        t = torch.ones(8)
        dist.all_reduce(t)
        row = _row(config, rank, it, world)
        rows.append(row)
        buf.append(row)
        if len(buf) >= config.sink_every and sink is not None:
            sink(buf)
            buf = []
        time.sleep(config.custom.get("sleep_s", 0.01))
    if buf and sink is not None:
        sink(buf)
    return SimpleNamespace(rows=rows, summary={"iterations": len(rows) // 1,
                                               "final_train_loss": rows[-1]["train_loss"]})


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    with Lab(n_workers=2, out=str(out), timeout_s=20, train_fn=allreduce_train) as lab:
        yield lab


@pytest.mark.timeout(90)
def test_rank_exception_fails_run_with_traceback_and_releases_workers(lab):
    cfg = RunConfig(method="dense", workers=2, max_iterations=30, sink_every=2,
                    custom={"fail_rank": 1, "fail_at": 5})
    t0 = time.monotonic()
    metrics, summary = lab.submit(cfg).result(timeout_s=60)
    assert summary["status"] == "failed"
    assert time.monotonic() - t0 < 30
    assert "rank 1" in summary["error"].splitlines()[0]
    assert "FloatingPointError: injected failure at iteration 5" in summary["error"]
    assert "Traceback" in summary["error"]  # the rank's own traceback travels along
    # the stored summary says the same, and the rows streamed before the failure are kept
    summaries, stored = load_runs(lab.out)
    row = summaries.set_index("run_id").loc[summary["run_id"]]
    assert row["status"] == "failed" and "injected failure" in row["error"]
    # the cluster takes the next run on the same workers
    ok = RunConfig(method="dense", workers=2, max_iterations=4, sink_every=2)
    _, summary2 = lab.submit(ok).result(timeout_s=60)
    assert summary2["status"] == "completed", summary2["error"]


@pytest.mark.timeout(120)
def test_killed_worker_fails_run_naming_lost_rank_then_next_run_succeeds(lab):
    cfg = RunConfig(method="dense", workers=2, max_iterations=2000, sink_every=5,
                    custom={"sleep_s": 0.02})
    handle = lab.submit(cfg)
    deadline = time.monotonic() + 30
    while len(handle.metrics) < 10 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert handle.status == "running" and len(handle.metrics) >= 10
    victim = handle.workers[1]
    pid = lab.client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGKILL)
    t_kill = time.monotonic()
    metrics, summary = handle.result(timeout_s=lab.timeout_s + 10)
    assert time.monotonic() - t_kill <= lab.timeout_s
    assert summary["status"] == "failed"
    assert "rank 1 lost" in summary["error"] and victim in summary["error"]
    # no goodbye from a SIGKILLed worker: the summary says so (the OOM killer's signal)
    assert "killed (SIGKILL, e.g. by the kernel's OOM killer) or crashed" in summary["error"]
    assert summary["failure"] == {"rank": 1, "worker": victim, "cause": "killed"}
    _, stored_metrics = load_runs(lab.out)
    assert (stored_metrics["run_id"] == handle.run_id).sum() >= 10  # rows so far were saved
    # the nanny restarts the worker on a new port; the next run uses the new worker
    ok = RunConfig(method="dense", workers=2, max_iterations=4, sink_every=2)
    _, summary2 = lab.submit(ok, wait_for_workers=True, timeout_s=30).result(timeout_s=60)
    assert summary2["status"] == "completed", summary2["error"]


@pytest.mark.timeout(60)
def test_cancel_running_and_queued_runs(lab):
    long = RunConfig(method="dense", workers=2, max_iterations=5000, sink_every=2,
                     custom={"sleep_s": 0.02})
    running = lab.submit(long)
    queued = lab.submit(long)  # both workers are busy: it waits in the queue
    time.sleep(0.5)
    assert queued.status == "queued"
    queued.cancel()
    assert queued.result(timeout_s=5)[1]["status"] == "cancelled"
    deadline = time.monotonic() + 20
    while running.status != "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    running.cancel()
    _, summary = running.result(timeout_s=30)
    assert summary["status"] == "cancelled"
    ok = RunConfig(method="dense", workers=2, max_iterations=3, sink_every=1)
    assert lab.submit(ok).result(timeout_s=60)[1]["status"] == "completed"


@pytest.mark.timeout(30)
def test_too_few_workers_fails_at_once(lab):
    with pytest.raises(ValueError, match=r"workers=3 is more than the 2"):
        lab.submit(RunConfig(method="dense", workers=3, max_iterations=2))
    with pytest.raises(TimeoutError):
        lab.submit(RunConfig(method="dense", workers=3, max_iterations=2), wait_for_workers=True,
                   timeout_s=1.0)
