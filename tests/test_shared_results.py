"""One results folder, many clients (issue 30 item 2): a run folder is written by one client
at a time, and two clients' overlapping studies run each point once between them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from gtopk_lab.orchestration import locks
from gtopk_lab.orchestration import results as store
from gtopk_lab.orchestration.run_stream import write_heartbeat

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(30)
def test_a_run_folder_has_one_writer_and_a_dead_writers_lock_is_free(tmp_path):
    folder = tmp_path / "run-a"
    held = locks.lock_run(folder)
    write_heartbeat(folder, 10.0)
    with pytest.raises(ValueError, match=r"run_id='run-a' is invalid: another client writes .*\(pid \d+ on "):
        locks.lock_run(folder)  # another FileLock, as another process would take it
    held.release()
    held.release()  # once is enough
    locks.lock_run(folder).release()
    # a process killed while it holds the lock (SIGKILL): the kernel frees it
    script = f"from gtopk_lab.orchestration import locks; locks.lock_run({str(folder)!r}); import os; os._exit(0)"
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    locks.lock_run(folder).release()
    # points: a lock, and the record of who completed it
    point = locks.try_lock_point(tmp_path, "abc:simulated")
    assert point is not None and locks.try_lock_point(tmp_path, "abc:simulated") is None
    assert locks.point_record(tmp_path, "abc:simulated") is None
    locks.record_point(tmp_path, "abc:simulated", "run-a")
    point.release()
    assert locks.point_record(tmp_path, "abc:simulated") == "run-a"
    (tmp_path / locks.POINTS_DIR / "abc.simulated.json").write_text("{trunc")
    assert locks.point_record(tmp_path, "abc:simulated") is None  # damaged: run the point to be sure


#: One client: a Lab with its own LocalCluster that waits for the other client, then runs a
#: simulated study into the shared folder and prints what its study says of each point.
CLIENT = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from gtopk_lab.orchestration.lab import Lab

    if __name__ == "__main__":
        out, me, other, methods = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
        base = {"model": "mlp", "dataset": "synthetic", "train_samples": 256, "test_samples": 32,
                "batch_size": 16, "epochs": 1, "max_iterations": 4, "density": 0.05}
        with Lab(n_workers=1, out=out, timeout_s=60, connect_timeout_s=60) as lab:
            flags = Path(out).parent
            (flags / f"ready-{me}").touch()
            while not (flags / f"ready-{other}").exists():
                time.sleep(0.02)
            began = time.time()
            study = lab.study(methods=methods, workers=[2, 4], seeds=2, simulate=True, base=base)
            assert study.wait(240)
            points = [{"run_id": r["run_id"], "status": r["status"], "method": r["method"],
                       "workers": r["workers"], "seed": r["seed"], "skipped": r.get("skipped") is True}
                      for r in study.summaries().to_dict("records")]
            print(json.dumps({"began": began, "ended": time.time(), "points": points}), flush=True)
""")


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_two_clients_overlapping_studies_run_each_point_once(tmp_path):
    out = tmp_path / "shared"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    grids = {"a": "topk,gtopk", "b": "gtopk,gaussiank"}  # gtopk's 4 points are in both
    procs = {me: subprocess.Popen([sys.executable, "-c", CLIENT, str(out), me, other, grids[me]],
                                  cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
             for me, other in (("a", "b"), ("b", "a"))}
    answers = {}
    for me, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=280)
        assert proc.returncode == 0, stderr[-3000:]
        answers[me] = json.loads(stdout.strip().splitlines()[-1])
    a, b = answers["a"], answers["b"]
    assert a["began"] < b["ended"] and b["began"] < a["ended"]  # the studies ran at once
    for answer in (a, b):  # each study has all 8 of its points completed
        assert len(answer["points"]) == 8 and {p["status"] for p in answer["points"]} == {"completed"}

    runs = store.read_runs(out)
    assert {r.status for r in runs} == {"completed"}
    points = Counter((r.config["method"], r.config["workers"], r.config["seed"]) for r in runs)
    assert len(points) == 12 and set(points.values()) == {1}, points  # every point once
    shared = {(p["method"], p["workers"], p["seed"]): p for p in a["points"] + b["points"]
              if p["method"] == "gtopk"}
    by_point = {(r.config["method"], r.config["workers"], r.config["seed"]): r.path.name for r in runs}
    for key in shared:  # both studies name the one run of a shared point
        ids = {p["run_id"] for p in a["points"] + b["points"]
               if (p["method"], p["workers"], p["seed"]) == key}
        assert ids == {by_point[key]}
    assert sum(p["skipped"] for p in a["points"] + b["points"]) >= 4  # the other client's runs
    for run in runs:  # a shared point's one run belongs to both studies (run identity, issue 26)
        assert len(run.summary["study_ids"]) == (2 if run.config["method"] == "gtopk" else 1), run.summary
    # no interleaved files: one writer per folder, nothing left of a live run
    for run in runs:
        assert sorted(p.name for p in run.path.iterdir()) == [".lock", "config.json", "metrics.parquet",
                                                              "summary.json"]
        assert run.config["run_id"] == run.summary["run_id"] == run.path.name
        frame = run.metrics
        assert set(frame["method"]) == {run.config["method"]} and set(frame["workers"]) == {run.config["workers"]}
        assert len(frame[frame["kind"] == "iter"]) == 4 * run.config["workers"]  # 4 iterations, P ranks
    print(f"\nshared results: studies overlapped {min(a['ended'], b['ended']) - max(a['began'], b['began']):.1f} s; "
          f"{sum(p['skipped'] for p in a['points'] + b['points'])} points taken from the other client")
