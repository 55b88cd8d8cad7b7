"""Soak: many runs back to back on one cluster; what they leave behind in every process.

A day of studies is hundreds of runs on one cluster. This runs ``--runs`` small real runs
(gTop-k, P = 2 gloo ranks, the MLP on synthetic data, a few iterations, rows streamed,
summaries and parts written) one after the other on one cluster and counts, for the
client, the scheduler and the workers (each role's process tree), before and after:
processes, open file descriptors, threads and resident memory, plus the scheduler's state
(tasks, event topics, Variables) and the client's (futures, tracked runs). Two clusters:

* ``local``: ``Lab(n_workers=2)``, an embedded LocalCluster (the scheduler lives in the
  client's process, so "client" counts both);
* ``deployment``: ``dask scheduler`` + 2 ``dask worker`` subprocesses on 127.0.0.1
  (:class:`~gtopk_lab.orchestration.local_deployment.LocalDeployment`) and a Lab that
  connects to them.

The first ``--warmup`` runs are not counted (lazy imports, thread pools, allocator arenas
filling up); "before" is taken after them, "after" once the last run ended and the
processes had 2 s to free what they free; each is the smallest of three counts 0.5 s
apart (a socket being opened or closed is no leak). :func:`growth` is after minus
before; :data:`BOUNDS` is what the soak accepts (tests/test_soak.py runs a short one).

Usage::

    PYTHONPATH=. .venv/bin/python benchmarks/soak.py [--runs 200] [--warmup 5]
        [--clusters local,deployment] [--every 50]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration.lab import Lab
from gtopk_lab.orchestration.local_deployment import LocalDeployment

#: Growth after minus before (per role) that the soak accepts: no process more, at most a
#: few descriptors and threads (a pool that grew by one), and resident memory within
#: ``rss_mib`` + ``rss_fraction`` of what the role held before (allocator noise).
BOUNDS: dict[str, float] = {"processes": 0, "fds": 4, "threads": 4, "rss_mib": 48.0, "rss_fraction": 0.10}
#: Scheduler and client state that must not grow with the number of runs (counted after
#: the settle): a finished run leaves no task, topic, Variable, future nor tracked run.
STATE_BOUNDS: dict[str, int] = {"scheduler_tasks": 0, "scheduler_topics": 2, "scheduler_variables": 0,
                                "client_futures": 0, "client_event_handlers": 0, "journal_runs": 0}


def soak_config(run: int) -> RunConfig:
    """Run number ``run``: a distinct seed, so that every run is its own point and folder."""
    return RunConfig(method="gtopk", workers=2, density=0.05, model="mlp", dataset="synthetic",
                     train_samples=256, test_samples=32, batch_size=16, epochs=1, max_iterations=6,
                     sink_every=2, seed=run)


# --- counting -------------------------------------------------------------------------------
def tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def census(processes: list[psutil.Process]) -> dict[str, float]:
    """Processes, open descriptors, threads and resident MiB of ``processes`` together."""
    counts = {"processes": 0, "fds": 0, "threads": 0, "rss_mib": 0.0}
    for proc in processes:
        try:
            with proc.oneshot():
                fds, threads, rss = proc.num_fds(), proc.num_threads(), proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        counts["processes"] += 1
        counts["fds"] += fds
        counts["threads"] += threads
        counts["rss_mib"] += rss / 2**20
    return counts


def _scheduler_state(dask_scheduler: Any) -> dict[str, int]:  # runs on the scheduler
    broker = getattr(dask_scheduler, "_broker", None)
    topics = getattr(broker, "_topics", {})
    variables = dask_scheduler.extensions.get("variables")
    return {"scheduler_tasks": len(dask_scheduler.tasks),
            "scheduler_topics": sum(1 for name in topics if "gtopk-" in str(name)),
            "scheduler_variables": len(getattr(variables, "variables", {}) or {})}


def snapshot(lab: Lab, roles: dict[str, list[int]], samples: int = 3, gap_s: float = 0.5) -> dict[str, Any]:
    """Every role's census (its processes' trees; the client's own process alone, its
    children are the workers of an embedded cluster), the smallest of ``samples`` counts
    ``gap_s`` apart (a connection being opened or closed is not a leak; what leaks stays),
    and the scheduler's and client's state."""
    def one() -> dict[str, dict[str, float]]:
        return {role: census([p for pid in pids
                              for p in (tree(pid) if pid != os.getpid() else [psutil.Process()])])
                for role, pids in roles.items()}

    shots = []
    for i in range(samples):
        if i:
            time.sleep(gap_s)
        shots.append(one())
    shot: dict[str, Any] = {role: {k: min(s[role][k] for s in shots) for k in shots[0][role]}
                            for role in roles}
    shot["state"] = {**lab.client.run_on_scheduler(_scheduler_state),
                     "client_futures": len(lab.client.futures),
                     "client_event_handlers": sum(1 for t in getattr(lab.client, "_event_handlers", {})
                                                  if "gtopk-" in str(t)),
                     "journal_runs": lab._monitor.journal.tracked()}
    return shot


def growth(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``after - before`` per role and count."""
    return {role: {k: after[role][k] - before[role][k] for k in before[role]} for role in before
            if role != "state"}


def violations(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What grew past :data:`BOUNDS` / :data:`STATE_BOUNDS`, one line each (empty: none)."""
    lines = []
    for role, delta in growth(before, after).items():
        for key in ("processes", "fds", "threads"):
            if delta[key] > BOUNDS[key]:
                lines.append(f"{role}: {key} grew by {delta[key]:g} ({before[role][key]:g} -> "
                             f"{after[role][key]:g}; bound {BOUNDS[key]:g})")
        allowed = BOUNDS["rss_mib"] + BOUNDS["rss_fraction"] * before[role]["rss_mib"]
        if delta["rss_mib"] > allowed:
            lines.append(f"{role}: resident memory grew by {delta['rss_mib']:.0f} MiB "
                         f"({before[role]['rss_mib']:.0f} -> {after[role]['rss_mib']:.0f}; bound {allowed:.0f})")
    for key, bound in STATE_BOUNDS.items():
        if after["state"][key] > bound:
            lines.append(f"{key} is {after['state'][key]} after the runs (bound {bound})")
    return lines


# --- the soak -------------------------------------------------------------------------------
def run_soak(lab: Lab, roles: dict[str, list[int]], runs: int, warmup: int, every: int = 0,
             settle_s: float = 2.0, log: Any = None) -> dict[str, Any]:
    """``warmup`` + ``runs`` runs back to back on ``lab``; snapshots before, every ``every``
    runs and after. Each run must complete."""
    for i in range(warmup):
        _run(lab, 10**6 + i)  # seeds apart from the counted runs
    time.sleep(settle_s)
    before = snapshot(lab, roles)
    marks = []
    started = time.monotonic()
    for i in range(runs):
        _run(lab, i)
        if every and (i + 1) % every == 0 and i + 1 < runs:
            marks.append((i + 1, snapshot(lab, roles)))
            if log:
                log(f"  {i + 1} runs, {time.monotonic() - started:.0f} s")
    elapsed = time.monotonic() - started
    time.sleep(settle_s)
    after = snapshot(lab, roles)
    return {"before": before, "after": after, "marks": marks, "runs": runs, "elapsed_s": elapsed}


def _run(lab: Lab, i: int) -> None:
    _, summary = lab.submit(soak_config(i)).result(timeout_s=300)
    if summary["status"] != "completed":
        raise RuntimeError(f"soak run {i} {summary['status']}: {summary.get('error')}")


def local_soak(out: str, runs: int, warmup: int, every: int = 0, log: Any = None) -> dict[str, Any]:
    """The soak on an embedded LocalCluster of two workers."""
    with Lab(n_workers=2, out=out, timeout_s=60) as lab:
        me = os.getpid()
        workers = [p.pid for p in psutil.Process(me).children()]  # nannies, forkserver, tracker
        return run_soak(lab, {"client+scheduler": [me], "workers": workers}, runs, warmup, every, log=log)


def deployment_soak(folder: str, runs: int, warmup: int, every: int = 0, log: Any = None) -> dict[str, Any]:
    """The soak on ``dask scheduler`` + two ``dask worker`` subprocesses."""
    with LocalDeployment(Path(folder) / "deployment") as deployment:
        address = deployment.start_scheduler()
        for name in ("w0", "w1"):
            deployment.start_worker(name, ["--nthreads", "1"])
        deployment.wait_for_workers(2)
        with Lab(address, out=str(Path(folder) / "results"), timeout_s=60) as lab:
            roles = {"client": [os.getpid()], "scheduler": [deployment.scheduler.pid],
                     "workers": [p.pid for p in deployment.workers.values()]}
            return run_soak(lab, roles, runs, warmup, every, log=log)


# --- the table ------------------------------------------------------------------------------
def table(name: str, result: dict[str, Any]) -> str:
    """One markdown table: every role's counts before and after, and the state after."""
    before, after = result["before"], result["after"]
    lines = [f"{name}: {result['runs']} runs in {result['elapsed_s']:.0f} s "
             f"({result['elapsed_s'] / max(result['runs'], 1):.2f} s per run)", "",
             "| role | processes | open fds | threads | RSS MiB |", "|---|---|---|---|---|"]
    for role in (r for r in before if r != "state"):
        b, a = before[role], after[role]
        lines.append(f"| {role} | {b['processes']:g} -> {a['processes']:g} | {b['fds']:g} -> {a['fds']:g} | "
                     f"{b['threads']:g} -> {a['threads']:g} | {b['rss_mib']:.0f} -> {a['rss_mib']:.0f} |")
    for runs_done, shot in result["marks"]:
        cells = ", ".join(f"{role} {shot[role]['fds']:g} fds / {shot[role]['threads']:g} thr / "
                          f"{shot[role]['rss_mib']:.0f} MiB" for role in shot if role != "state")
        lines.append(f"| (after {runs_done}) | {cells} | | | |")
    state = ", ".join(f"{k} {before['state'][k]} -> {after['state'][k]}" for k in after["state"])
    lines += ["", f"state: {state}"]
    bad = violations(before, after)
    lines.append("within bounds" if not bad else "OUT OF BOUNDS: " + "; ".join(bad))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--every", type=int, default=50, help="a snapshot every N runs (0: none)")
    parser.add_argument("--clusters", default="local,deployment")
    args = parser.parse_args()
    for kind in args.clusters.split(","):
        with tempfile.TemporaryDirectory(prefix=f"soak-{kind}-") as folder:
            print(f"{kind}: {args.warmup} warm-up + {args.runs} runs ...", flush=True)
            if kind == "local":
                result = local_soak(str(Path(folder) / "results"), args.runs, args.warmup, args.every, log=print)
            elif kind == "deployment":
                result = deployment_soak(folder, args.runs, args.warmup, args.every, log=print)
            else:
                raise SystemExit(f"--clusters={kind!r} is invalid: expected local or deployment")
            print(table(kind, result), flush=True)


if __name__ == "__main__":
    main()
