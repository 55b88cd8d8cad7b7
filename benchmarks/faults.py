"""Reliability: inject faults into real training runs and time what the user sees.

A real deployment on 127.0.0.1 (``dask scheduler`` + four one-thread ``dask worker``
processes), the real ``train_rank`` (gTop-k, MLP on the synthetic dataset, P = 2,
throttled to an emulated 20 Mbit/s so that a run lasts long enough to be hit), and the
Lab's defaults (``timeout_s=60``, ``connect_timeout_s=10``, ``scheduler_timeout_s=10``):

1. SIGKILL of a rank's worker process (what the kernel's OOM killer does);
2. SIGTERM of a rank's ``dask worker`` with ``max_restarts=0``;
3. the same with ``max_restarts=1`` and checkpoints: the run restarts from its newest
   checkpoint and completes;
4. SIGKILL of the scheduler mid-run: the client's error, the ranks' end and the worker
   processes' exit.

It prints one row per fault: outcome, seconds from the fault to the run's end (to the
second start's submission for the restart), and the first line of the error. An out-of-memory *exception* in a rank is timed
by tests/test_faults.py (it needs an injected train function).

Usage::

    PYTHONPATH=. .venv/bin/python benchmarks/faults.py [--out /tmp/gtopk-faults]

About 2 minutes on the 2-core box; nothing is left running.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from pathlib import Path

from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration import results as store
from gtopk_lab.orchestration.lab import Lab
from gtopk_lab.orchestration.local_deployment import LocalDeployment
from gtopk_lab.training.checkpoint import read_latest



def config(**kw) -> RunConfig:
    base = dict(method="gtopk", workers=2, model="mlp", dataset="synthetic", train_samples=2048,
                test_samples=256, batch_size=32, epochs=40, density=0.01, device="cpu",
                bandwidth="20Mbps", throttle=True, sink_every=5)
    base.update(kw)
    return RunConfig(**base)


def wait_rows(handle, n: int = 20, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while len(handle.metrics) < n:
        if time.monotonic() > deadline or handle.done():
            raise RuntimeError(f"run {handle.run_id} produced no rows: {handle.status} {handle.error}")
        time.sleep(0.1)


def row(fault: str, summary: dict, seconds: float, note: str = "") -> None:
    first = (summary.get("error") or "").splitlines()[0] if summary.get("error") else ""
    if len(first) > 150:
        first = first[:147] + "..."
    print(f"| {fault} | {summary['status']}{note} | {seconds:.1f} | {first} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="results and logs folder (default: a temp folder)")
    args = parser.parse_args()
    folder = Path(args.out or tempfile.mkdtemp(prefix="gtopk-faults-"))
    folder.mkdir(parents=True, exist_ok=True)
    with LocalDeployment(folder / "logs") as dep:
        address = dep.start_scheduler()
        for i in range(4):
            dep.start_worker(f"w{i}", ["--nthreads", "1"])
        dep.wait_for_workers(4, timeout_s=120)
        workers, scheduler = dep.workers, dep.scheduler
        with Lab(address, out=str(folder / "runs")) as lab:  # the Lab's defaults
            name = lambda addr: lab.worker_info()[addr]["name"]  # noqa: E731
            print("| fault | outcome | s to detect | first line of the error |")
            print("|---|---|---|---|")

            handle = lab.submit(config())
            wait_rows(handle)
            victim = handle.workers[1]
            pid = lab.client.run(os.getpid, workers=[victim])[victim]
            os.kill(pid, signal.SIGKILL)  # the nanny restarts it: capacity is kept
            t0 = time.monotonic()
            _, summary = handle.result()
            row("SIGKILL of rank 1's worker process", summary, time.monotonic() - t0)

            lab.client.wait_for_workers(4, timeout=120)
            handle = lab.submit(config())
            wait_rows(handle)
            workers[name(handle.workers[1])].send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            _, summary = handle.result()
            row("SIGTERM of rank 1's `dask worker`, max_restarts=0", summary, time.monotonic() - t0)

            handle = lab.submit(config(checkpoint=True, max_restarts=1, epochs=6))
            folder_ck = store.checkpoint_folder(lab.out, handle.run_id)
            while (read_latest(folder_ck) or {}).get("epoch", 0) < 1:
                time.sleep(0.1)
            first_key = handle.rendezvous_key
            workers[name(handle.workers[1])].send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            while handle.rendezvous_key == first_key and not handle.done():
                time.sleep(0.05)
            restarted = time.monotonic() - t0  # the second start's tasks are submitted
            _, summary = handle.result()
            row("SIGTERM, max_restarts=1, checkpoints", summary, restarted,
                f" after {summary.get('restarts', 0)} restart from iteration {summary.get('restart_iterations')}, "
                f"{time.monotonic() - t0:.1f} s after the signal")

            handle = lab.submit(config())
            wait_rows(handle)
            ranks = [workers[name(a)] for a in handle.workers]
            os.kill(scheduler.pid, signal.SIGKILL)
            t0 = time.monotonic()
            _, summary = handle.result()
            detected = time.monotonic() - t0
            for proc in ranks:
                proc.wait(timeout=120)
            row("SIGKILL of the scheduler", summary, detected,
                f"; `dask worker` processes gone {time.monotonic() - t0:.1f} s after the kill")


if __name__ == "__main__":
    main()
