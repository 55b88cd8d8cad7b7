"""Damaged and interrupted run folders: skipped with one warning, moved aside on resume,
never read as complete (issue 19 item 1)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gtopk_lab.cli.main import main as cli_main
from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration import results as store

REPO = Path(__file__).resolve().parent.parent
TINY = ["--max-iterations", "3", "--train-samples", "256", "--test-samples", "64", "--batch-size", "16",
        "--epochs", "1", "--model", "mlp", "--dataset", "synthetic"]


def _rows(config: RunConfig, n: int = 3) -> list[dict]:
    return [{"kind": "iter", "rank": r, "iteration": i, "epoch": i / n, "method": config.method,
             "workers": config.workers, "density": config.density, "k": 1, "train_loss": 1.0 / (i + 1)}
            for r in range(config.workers) for i in range(n)]


def _store(out: Path, run_id: str, method: str = "topk", workers: int = 2, status: str = "completed") -> Path:
    config = RunConfig(method=method, workers=workers, max_iterations=3, run_id=run_id)
    rank0 = {"iterations": 3, "final_train_loss": 0.5, "samples_per_s_virtual": 100.0 * workers}
    return store.write_run(out, config, store.rows_to_frame(_rows(config)),
                           store.run_summary(config, rank0, status=status))


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


#: (file, how it is damaged, words the reason contains)
DAMAGE = {
    "metrics-truncated": ("metrics.parquet", lambda p: _truncate(p, 7), "7 bytes"),
    "metrics-garbage": ("metrics.parquet", lambda p: p.write_bytes(b"PAR1" + b"x" * 100), ""),
    "metrics-missing": ("metrics.parquet", lambda p: p.unlink(), "missing"),
    "summary-truncated": ("summary.json", lambda p: _truncate(p, 40), "not valid JSON"),
    "summary-empty": ("summary.json", lambda p: p.write_bytes(b""), "empty file"),
    "summary-no-status": ("summary.json", lambda p: p.write_text('{"run_id": "x"}'), "status=None"),
    "config-truncated": ("config.json", lambda p: _truncate(p, 10), "not valid JSON"),
    "config-not-object": ("config.json", lambda p: p.write_text("[1, 2]"), "JSON object"),
}


def _damaged_folder(out: Path, kind: str) -> tuple[Path, str, str]:
    """Two good runs and one damaged one (``bad``) under ``out``."""
    _store(out, "good-a", "topk")
    _store(out, "good-b", "gtopk", status="failed")
    bad = _store(out, "bad", "dense", workers=1)
    name, damage, reason = DAMAGE[kind]
    damage(bad / name)
    return bad, name, reason


def _damage_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "skipping damaged run" in r.getMessage()]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_listings_skip_a_damaged_run_with_one_warning(tmp_path, caplog, kind):
    bad, name, reason = _damaged_folder(tmp_path, kind)
    with pytest.raises(store.DamagedRun) as info:
        store.read_run(bad)
    assert info.value.file == name and info.value.path == bad and reason in info.value.reason

    caplog.set_level(logging.WARNING, logger=store.__name__)
    summaries, metrics = store.load_runs(tmp_path)
    assert list(summaries["run_id"]) == ["good-a", "good-b"]
    assert set(metrics["run_id"]) == {"good-a", "good-b"}
    lines = _damage_lines(caplog)
    assert lines == [f"skipping damaged run {bad}: {name}: {info.value.reason}"]

    for listing in (store.load_summaries, store.load_metrics, store.completed_runs):
        caplog.clear()
        listing(tmp_path)
        assert len(_damage_lines(caplog)) == 1, listing
    assert list(store.completed_runs(tmp_path).values()) == ["good-a"]
    assert bad.is_dir()  # listing never moves or deletes anything


@pytest.mark.timeout(30)
def test_resume_moves_a_damaged_run_aside_and_listings_ignore_it(tmp_path, caplog):
    bad, name, _ = _damaged_folder(tmp_path, "metrics-truncated")
    before = sorted(p.name for p in bad.iterdir())
    caplog.set_level(logging.WARNING, logger=store.__name__)
    done = store.completed_runs(tmp_path, move_damaged=True)
    assert list(done.values()) == ["good-a"]
    assert not bad.exists()
    [moved] = [p for p in tmp_path.iterdir() if p.name.startswith("bad.damaged-")]
    assert sorted(p.name for p in moved.iterdir()) == before  # nothing deleted
    [line] = _damage_lines(caplog)
    assert line.startswith(f"skipping damaged run {bad}: {name}: ") and line.endswith(f"moved it to {moved}")
    caplog.clear()
    assert list(store.load_summaries(tmp_path)["run_id"]) == ["good-a", "good-b"]
    assert _damage_lines(caplog) == []  # a moved-aside folder is not a run any more


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "gtopk_lab.cli", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(90)
def test_cli_runs_and_report_skip_a_damaged_run(tmp_path, capsys, caplog):
    out = tmp_path / "res"
    bad, name, _ = _damaged_folder(out, "metrics-truncated")
    expected = f"skipping damaged run {bad}: {name}: "

    # the first listing in a process of its own (what a person types); the JSON listing and
    # the report through the CLI's main in this process: a new interpreter each took 15-30 s
    # of imports at load 15-20, past this test's timeout
    listed = _cli("runs", "--out", str(out), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    lines = [line for line in listed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(expected), listed.stderr
    assert "good-a" in listed.stdout and "good-b" in listed.stdout and "bad" not in listed.stdout.split()

    capsys.readouterr()
    assert cli_main(["runs", "--out", str(out), "--json"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out.strip().splitlines()[-1])] == ["good-a", "good-b"]

    # in this process the warning reaches pytest's log capture, not stderr (the subprocess
    # above shows it is the one line on stderr)
    caplog.clear()
    caplog.set_level(logging.WARNING, logger=store.__name__)
    assert cli_main(["report", str(out), "-o", str(tmp_path / "report.html")]) == 0
    lines = [m for m in _damage_lines(caplog)]
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "good-a" in text


@pytest.mark.timeout(60)
def test_lab_load_and_lab_sweep_resume_skip_and_move_damaged_runs(tmp_path, caplog):
    """Lab.load() and Lab.sweep()'s skip of completed points, without a cluster."""
    from gtopk_lab.orchestration.lab import Lab

    config = RunConfig(method="dense", workers=1, max_iterations=3)
    first = config.replace(run_id="first")
    store.write_run(tmp_path, first, store.rows_to_frame(_rows(first)),
                    store.run_summary(first, {"iterations": 3}, status="completed"))
    _store(tmp_path, "other", "topk")
    _truncate(tmp_path / "first" / "summary.json", 25)

    lab = Lab.__new__(Lab)  # only the results side: no Dask client
    lab.out, lab.progress = str(tmp_path), False
    lab._monitor = SimpleNamespace(active_point=lambda key: None)  # no point runs elsewhere
    caplog.set_level(logging.WARNING, logger=store.__name__)
    summaries, metrics = lab.load()
    assert list(summaries["run_id"]) == ["other"] and set(metrics["run_id"]) == {"other"}
    assert len(_damage_lines(caplog)) == 1

    submitted = []

    class Handle:  # what a Study reads of a RunHandle; the run "ends" when waited for
        def __init__(self, cfg):
            self.cfg = cfg.replace(run_id="second")
            self.run_id, self.status, self.summary = "second", "running", None

        def wait(self, timeout_s=None):
            self.summary = store.run_summary(self.cfg, {"iterations": 3}, status="completed")
            store.write_run(tmp_path, self.cfg, store.rows_to_frame(_rows(self.cfg)), self.summary)
            self.status = "completed"
            return True

        def done(self):
            return self.summary is not None

    def submit(cfg, progress=False, simulate=False, skip_completed=False, labels=None):
        submitted.append(cfg)
        return Handle(cfg)

    lab.submit = submit
    caplog.clear()
    frame = lab.sweep([config])
    assert submitted == [config] and list(frame["run_id"]) == ["second"]  # the point ran again
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("first.damaged-")]
    assert "moved it to" in _damage_lines(caplog)[0]
    again = lab.sweep([config])  # now it is complete: skipped
    assert len(submitted) == 1 and bool(again["skipped"].iloc[0])


@pytest.mark.timeout(180)
def test_cli_sweep_resume_reruns_a_damaged_point(tmp_path, capsys, caplog):
    # in-process (main(), as `gtopk-lab sweep` runs it): the subprocess form of the CLI's
    # stderr line is checked by test_cli_runs_and_report_skip_a_damaged_run
    from gtopk_lab.cli import main

    out = tmp_path / "sweep"
    argv = ["sweep", "--simulate", "--methods", "dense", "--workers", "1", *TINY, "--out", str(out),
            "--no-progress", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    [run] = [p for p in out.iterdir() if not p.name.startswith(".")]  # .points: the study's locks
    _truncate(run / "metrics.parquet", 7)

    caplog.clear()
    with caplog.at_level("WARNING"):
        assert main(argv) == 0, capsys.readouterr().err
    lines = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"skipping damaged run {run}: metrics.parquet: ")
    assert "moved it to" in lines[0]
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert len(names) == 2 and any(n.startswith(f"{run.name}.damaged-") for n in names)
    summaries = store.load_summaries(out)
    assert list(summaries["status"]) == ["completed"] and summaries["run_id"].iloc[0] != run.name
    assert summaries["provenance"].iloc[0]["device"] == "cpu"  # a real run's resolved device


@pytest.mark.timeout(30)
def test_cli_resume_of_a_damaged_run_says_which_file(tmp_path, capsys):
    from gtopk_lab.cli import main

    _store(tmp_path, "cfg", status="failed")
    _truncate(tmp_path / "cfg" / "config.json", 10)
    _store(tmp_path, "met", status="failed")
    _truncate(tmp_path / "met" / "metrics.parquet", 7)
    assert main(["run", "--resume", "cfg", "--simulate", "--out", str(tmp_path)]) == 2
    assert "config.json (damaged" in capsys.readouterr().err
    # without a checkpoint no stored row is kept: the rerun writes a whole metrics.parquet
    assert main(["run", "--resume", "met", "--simulate", "--out", str(tmp_path)]) == 0
    assert store.read_run(tmp_path / "met").status == "completed"


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import numpy as np, pandas as pd
    import pyarrow as pa, pyarrow.parquet as pq
    from gtopk_lab.atomic_io import atomic_path
    from gtopk_lab.config import RunConfig
    from gtopk_lab.orchestration import results as store

    out, mode = Path(sys.argv[1]), sys.argv[2]
    marker = out / "marker"
    config = RunConfig(method="topk", workers=2, max_iterations=3, run_id="victim")
    run = store.RunStore(out, "victim")
    run.write_config(config)  # what the Lab writes when a run starts
    run.write_summary(store.run_summary(config, None, status="running"))
    n = 2_000_000 if mode == "big" else 1000
    frame = pd.DataFrame({"kind": "iter", "rank": 0, "iteration": np.arange(n), "epoch": 0.0,
                          "train_loss": np.random.default_rng(0).random(n)})

    def slow_parquet(path, frame):  # the real atomic path, one row group at a time
        with atomic_path(path) as tmp:
            table = pa.Table.from_pandas(frame, preserve_index=False)
            with pq.ParquetWriter(tmp, table.schema) as writer:
                for start in range(0, len(table), 100):
                    writer.write_table(table.slice(start, 100))
                    if start == 100:
                        marker.write_text("mid-write")
                    time.sleep(0.05)

    def pause_after_metrics(self, frame, _real=store.RunStore.write_metrics):
        _real(self, frame)
        marker.write_text("between files")
        time.sleep(60)

    if mode == "mid-parquet":
        store.write_parquet_atomic = slow_parquet
    elif mode == "between":
        store.RunStore.write_metrics = pause_after_metrics
    else:
        marker.write_text("writing")
    summary = store.run_summary(config, {"iterations": 3}, status="completed")
    for _ in range(1000 if mode == "big" else 1):  # "big": rewrite until killed
        store.write_run(out, config, frame, summary)
    time.sleep(60)
""")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["mid-parquet", "between", "big"])
def test_a_run_killed_while_writing_never_looks_complete(tmp_path, caplog, mode):
    _store(tmp_path, "good", "gtopk")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, str(script), str(tmp_path), mode], env=env)
    try:
        deadline = time.monotonic() + 40
        while not (tmp_path / "marker").exists():
            assert child.poll() is None, "the child died before writing"
            assert time.monotonic() < deadline, "the child never started writing"
            time.sleep(0.01)
        if mode == "big":  # kill inside a parquet write: while its temp file exists
            while not list((tmp_path / "victim").glob(".metrics.parquet.*.tmp")):
                assert time.monotonic() < deadline
                time.sleep(0.001)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    (tmp_path / "marker").unlink()
    victim = tmp_path / "victim"
    caplog.set_level(logging.WARNING, logger=store.__name__)
    summaries, metrics = store.load_runs(tmp_path)
    status = dict(zip(summaries["run_id"], summaries["status"]))
    assert status["good"] == "completed"
    assert _damage_lines(caplog) == []  # interrupted is not damaged: every file is whole
    leftovers = [p.name for p in victim.iterdir() if p.name.endswith(".tmp")]
    if mode == "mid-parquet":
        assert leftovers and not (victim / "metrics.parquet").exists()  # the half file kept its temp name
    if mode in ("mid-parquet", "between"):
        assert status["victim"] == "running"
    if status["victim"] == "completed":  # "big" may have finished a write before the kill
        assert (metrics["run_id"] == "victim").sum() == 2_000_000
        assert "victim" in store.completed_runs(tmp_path).values()
    else:
        assert "victim" not in store.completed_runs(tmp_path).values()
    assert store.completed_runs(tmp_path, move_damaged=True)  # nothing there is moved aside
    assert victim.is_dir()
