"""A client killed mid-run (issue 30 item 1): its run's rows are on disk, readers show it
``crashed`` once its heartbeat is older than its timeout, its ranks stop, and a resume
completes it. The folder's pieces (parts, heartbeat, provisional rows of a resume) are
checked without a cluster first; then a real ``gtopk-lab run`` on the embedded
LocalCluster is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from gtopk_lab.cli.main import main as cli_main
from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration import results as store
from gtopk_lab.orchestration.handle import RunHandle
from gtopk_lab.orchestration.journal import FOLD_PARTS, RunJournal
from gtopk_lab.orchestration.run_stream import part_files, write_heartbeat, write_part
from testbed_support import wait_for as _wait

REPO = Path(__file__).resolve().parent.parent


def _iter_rows(ranks: int, iterations: range, loss: float = 1.0) -> list[dict]:
    return [{"kind": "iter", "rank": r, "iteration": i, "epoch": i / 8, "train_loss": loss + i}
            for r in range(ranks) for i in iterations]


def _running(out: Path, run_id: str, heartbeat_age_s: float, timeout_s: float = 10.0) -> Path:
    config = RunConfig(method="topk", workers=2, max_iterations=8, run_id=run_id)
    folder = out / run_id
    s = store.RunStore(out, run_id)
    s.write_config(config)
    s.write_summary(store.run_summary(config, None, status="running"))
    write_heartbeat(folder, timeout_s)
    beat = json.loads((folder / "heartbeat.json").read_text())
    beat["heartbeat_unix_s"] -= heartbeat_age_s
    (folder / "heartbeat.json").write_text(json.dumps(beat))
    return folder


@pytest.mark.timeout(30)
def test_a_running_run_reads_crashed_only_once_its_heartbeat_is_older_than_its_timeout(tmp_path):
    _running(tmp_path, "alive", heartbeat_age_s=3.0)
    _running(tmp_path, "dead", heartbeat_age_s=11.0)
    # the rows a dead client streamed: metrics.parquet overlaid by its parts, a later row
    # of the same (kind, rank, iteration) replacing an earlier one
    store.RunStore(tmp_path, "dead").write_metrics(store.rows_to_frame(_iter_rows(2, range(4))))
    write_part(tmp_path / "dead", _iter_rows(2, range(3, 6), loss=10.0), 1)
    write_part(tmp_path / "dead", _iter_rows(1, range(5, 6), loss=20.0), 2)
    summaries = store.load_summaries(tmp_path).set_index("run_id")
    assert summaries.loc["alive", "status"] == "running"
    assert summaries.loc["dead", "status"] == "crashed"
    assert summaries.loc["dead", "stored_status"] == "running"
    assert "no heartbeat for 11 s (timeout 10 s" in summaries.loc["dead", "error"]
    rows = store.read_run(tmp_path / "dead").metrics
    loss = {(r.rank, r.iteration): r.train_loss for r in rows.itertuples()}
    assert len(rows) == 12
    assert loss[(0, 2)] == 3.0 and loss[(1, 3)] == 13.0 and loss[(0, 5)] == 25.0 and loss[(1, 5)] == 15.0
    assert store.completed_runs(tmp_path) == {}
    # a finished run is what its summary says, whatever heartbeat is left
    config = RunConfig(method="topk", workers=2, max_iterations=8, run_id="dead")
    store.write_run(tmp_path, config, rows, store.run_summary(config, None, status="failed"))
    assert store.read_run(tmp_path / "dead").status == "failed"
    assert not (tmp_path / "dead" / "parts").exists() and not (tmp_path / "dead" / "heartbeat.json").exists()


class _Owner:  # what a RunHandle needs of its Lab here (nothing: it is never submitted)
    def _post(self, fn):
        fn()

    def _cancel(self, handle):
        pass


@pytest.mark.timeout(30)
def test_a_resumed_handle_replaces_the_stored_rows_it_redoes_and_the_journal_streams_them(tmp_path):
    config = RunConfig(method="topk", workers=2, max_iterations=8, run_id="r")
    handle = RunHandle(_Owner(), config, timeout_s=10.0)
    stored = _iter_rows(2, range(6)) + [{"kind": "epoch", "rank": 0, "iteration": 4, "train_loss": 0.5},
                                        {"kind": "epoch", "rank": 0, "iteration": 6, "train_loss": 0.7}]
    handle.preload_rows(stored, redo_from=4)  # resumed at the checkpoint of iteration 4
    journal = RunJournal(str(tmp_path))
    journal.track(handle)
    assert (tmp_path / "r" / "heartbeat.json").exists()
    handle.add_rows(_iter_rows(2, range(4, 8), loss=100.0))
    handle.add_rows(_iter_rows(2, range(0, 2), loss=-1.0))  # kept rows are not replaced
    journal.flush(journal._entries[id(handle)])
    [part] = part_files(tmp_path / "r")
    assert len(pd.read_parquet(part)) == len(stored) + 4  # the preloaded rows and the new ones
    frame = handle.metrics
    loss = {(r.kind, r.rank, r.iteration): r.train_loss for r in frame.itertuples()}
    assert loss[("iter", 0, 3)] == 4.0 and loss[("iter", 1, 4)] == 104.0 and loss[("iter", 0, 0)] == 1.0
    assert len(frame) == 2 * 8 + 2
    # it completes without re-emitting the epoch row of iteration 6: that stored row goes
    assert handle.record_end(str(tmp_path), "completed", None)
    keys = set(zip(handle.metrics["kind"], handle.metrics["iteration"]))
    assert ("epoch", 4) in keys and ("epoch", 6) not in keys
    assert store.read_run(tmp_path / "r").metrics.shape[0] == 2 * 8 + 1
    assert not (tmp_path / "r" / "parts").exists()
    journal.flush(journal._entries[id(handle)])  # a late flush writes nothing beside an ended run
    assert not (tmp_path / "r" / "parts").exists() and not (tmp_path / "r" / "heartbeat.json").exists()


@pytest.mark.timeout(30)
def test_the_journal_folds_its_parts_into_metrics_parquet(tmp_path):
    handle = RunHandle(_Owner(), RunConfig(method="topk", workers=1, run_id="long"), timeout_s=10.0)
    journal = RunJournal(str(tmp_path))
    journal.track(handle)
    entry = journal._entries[id(handle)]
    for i in range(FOLD_PARTS + 3):
        handle.add_rows(_iter_rows(1, range(i, i + 1)))
        journal.flush(entry)
    assert len(part_files(tmp_path / "long")) == 3
    assert sorted(store.RunStore(tmp_path, "long").read_metrics()["iteration"]) == list(range(FOLD_PARTS + 3))


# --- a SIGKILLed client on the embedded LocalCluster ---------------------------------------
TIMEOUT_S = 10.0
ITERATIONS = 5 * 32  # 5 epochs of 1024 samples in batches of 2 x 16; about 30 ms each (20 ms paced)
RUN = ["--method", "gtopk", "--workers", "2", "--density", "0.05", "--model", "mlp", "--dataset",
       "synthetic", "--train-samples", "1024", "--test-samples", "64", "--batch-size", "16",
       "--epochs", "5", "--latency", "20ms", "--throttle", "--sink-every", "5", "--checkpoint"]


def _cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "gtopk_lab.cli", *argv]


def _session(sid: int) -> list[int]:
    found = []
    for pid in psutil.pids():
        try:
            if os.getsid(pid) == sid:
                found.append(pid)
        except OSError:
            pass
    return found




@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_sigkilled_run_client_leaves_a_crashed_run_with_its_rows_and_resume_completes_it(tmp_path, capsys):
    out = tmp_path / "res"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    folder = out / "victim"
    client = subprocess.Popen(
        _cli("run", *RUN, "--timeout", str(TIMEOUT_S), "--out", str(out), "--no-progress", "--run-id", "victim"),
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        # mid-run: an epoch checkpoint written and rows streamed into a part
        _wait(lambda: client.poll() is not None or ((folder / "checkpoints" / "latest.json").exists()
                                                    and part_files(folder)), 150, "no checkpoint and part")
        assert client.poll() is None, client.stderr.read().decode()[-2000:]
        os.kill(client.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        client.wait(10)
        streamed = store.RunStore(out, "victim").read_metrics()
        assert len(streamed) > 0

        def crashed():
            return store.load_summaries(out).set_index("run_id").loc["victim", "status"] == "crashed"

        _wait(crashed, TIMEOUT_S + 20, "the run never read as crashed")
        shown_after_s = time.monotonic() - killed_at
        with capsys.disabled():  # (capsys is there for the listing below; -s still shows this)
            print(f"\ncrash-safe: {len(streamed)} rows on disk at the kill; crashed shown {shown_after_s:.1f} s after it")
        # the heartbeat was at most one flush (2 s) old at the kill, and readers wait for the
        # timeout: not earlier than half of it (a slow client may have been late), not later
        assert TIMEOUT_S / 2 <= shown_after_s <= TIMEOUT_S + 3, shown_after_s
        # the listing in this process (the CLI's own main): a second interpreter's start adds
        # nothing the CLI tests do not cover, and its imports alone cost seconds under load
        assert cli_main(["runs", "--out", str(out), "--status", "crashed", "--json"]) == 0
        [row] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert row["run_id"] == "victim" and "gtopk-lab run --resume victim" in row["error"]
        kept = store.read_run(folder).metrics
        assert len(kept) >= len(streamed)
        # the dead client's ranks and workers stop (their scheduler died with the client)
        _wait(lambda: not _session(client.pid), 60, f"processes of the killed client left: {_session(client.pid)}")

        resumed = subprocess.run(_cli("run", "--resume", "victim", "--out", str(out), "--timeout", str(TIMEOUT_S),
                                      "--no-progress", "--json"),
                                 env=env, cwd=tmp_path, capture_output=True, text=True, timeout=200)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        with capsys.disabled():
            print(f"crash-safe: ranks gone, resumed and completed {time.monotonic() - killed_at:.1f} s after the kill")
        assert "resuming victim from epoch" in resumed.stderr
        summary = json.loads(resumed.stdout.strip().splitlines()[-1])
        assert summary["status"] == "completed" and summary["iterations"] == ITERATIONS
    finally:
        for pid in _session(client.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    final = store.RunStore(out, "victim").read_metrics()
    iters = final[final["kind"] == "iter"]
    for rank in (0, 1):
        assert sorted(iters[iters["rank"] == rank]["iteration"]) == list(range(ITERATIONS))
    # every row streamed before the kill is there, with its loss: kept as it was before the
    # checkpoint, recomputed bit for bit after it (one thread per rank on the CPU)
    both = streamed.merge(final, on=["kind", "rank", "iteration"], suffixes=("_then", "_now"))
    assert len(both) == len(streamed)
    assert (both["train_loss_then"] == both["train_loss_now"]).all()
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "checkpoints", "config.json",
                                                       "metrics.parquet", "summary.json"]


#: the kill comes after epoch 1's checkpoint; 24 more epochs (~2 s of a quiet core, more
#: under load) leave the kill ample time to land mid-run
SIM_EPOCHS = 25
SIM_RUN = ["--simulate", "--method", "gtopk", "--workers", "2", "--density", "0.05", "--model", "mlp",
           "--dataset", "synthetic", "--train-samples", "1024", "--test-samples", "64", "--batch-size", "16",
           "--epochs", str(SIM_EPOCHS), "--sink-every", "5", "--checkpoint", "--timeout", "2"]


@pytest.mark.timeout(300)
def test_a_sigkilled_simulated_run_reads_crashed_with_its_streamed_rows_and_resume_completes_it(tmp_path):
    """``run --simulate`` streams parts and a heartbeat like a Dask run (simulated_run.py)."""
    out = tmp_path / "res"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    folder = out / "sim-victim"
    client = subprocess.Popen(_cli("run", *SIM_RUN, "--out", str(out), "--run-id", "sim-victim"),
                              env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True)
    try:
        _wait(lambda: client.poll() is not None or ((folder / "checkpoints" / "latest.json").exists()
                                                    and part_files(folder)), 150, "no checkpoint and part")
        assert client.poll() is None, client.stderr.read().decode()[-2000:]
        os.kill(client.pid, signal.SIGKILL)
        client.wait(10)
    finally:
        if client.poll() is None:
            client.kill()
    streamed = store.RunStore(out, "sim-victim").read_metrics()
    assert len(streamed) > 0
    assert store.read_run(folder, metrics=False).status in ("running", "crashed")
    _wait(lambda: store.load_summaries(out).set_index("run_id").loc["sim-victim", "status"] == "crashed",
          30, "the simulated run never read as crashed")
    resumed = subprocess.run(_cli("run", *SIM_RUN, "--resume", "sim-victim", "--out", str(out), "--json"),
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming sim-victim from epoch" in resumed.stderr
    summary = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["iterations"] == SIM_EPOCHS * 32
    final = store.RunStore(out, "sim-victim").read_metrics()
    iters = final[final["kind"] == "iter"]
    assert sorted(set(iters["iteration"])) == list(range(SIM_EPOCHS * 32))
    kept = streamed[streamed["kind"] == "iter"].merge(iters, on=["kind", "rank", "iteration"])
    assert len(kept) == (streamed["kind"] == "iter").sum()  # every streamed row is still there
    assert not part_files(folder) and not (folder / "heartbeat.json").exists()
