"""Results store: atomic run folders, load_runs, resumable-sweep bookkeeping."""

from __future__ import annotations

import json
import math
import os

import pytest

from gtopk_lab.atomic_io import atomic_write_bytes
from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration import results as store


def _rows(run_config: RunConfig, n: int = 3) -> list[dict]:
    return [{"kind": "iter", "rank": r, "iteration": i, "epoch": i / n, "method": run_config.method,
             "workers": run_config.workers, "density": run_config.density, "k": 1,
             "train_loss": 1.0 / (i + 1)} for r in range(run_config.workers) for i in range(n)]


@pytest.mark.timeout(30)
def test_config_hash_ignores_run_id_and_sees_every_other_field():
    a = RunConfig(method="gtopk", workers=2, max_iterations=5)
    assert store.config_hash(a) == store.config_hash(a.replace(run_id="x"))
    assert store.config_hash(a) == store.config_hash(a.to_dict())
    assert store.config_hash(a) != store.config_hash(a.replace(density=0.02))
    assert store.config_hash(a) != store.config_hash(a.replace(custom={"note": 1}))
    rid = store.new_run_id(a)
    assert "gtopk-p2" in rid and store.config_hash(a)[:8] in rid and rid != store.new_run_id(a)


@pytest.mark.timeout(30)
def test_write_run_and_load_runs_roundtrip(tmp_path):
    cfg = RunConfig(method="topk", workers=2, max_iterations=3, run_id="r1")
    rank0 = {"iterations": 3, "final_train_loss": 0.5, "final_test_accuracy": float("nan"),
             "time_breakdown_s": {"compute": 0.01, "selection": 0.001, "communication": 0.002,
                                  "update": 0.0005}}
    summary = store.run_summary(cfg, rank0, status="completed")
    path = store.write_run(tmp_path, cfg, store.rows_to_frame(_rows(cfg)), summary)
    assert sorted(os.listdir(path)) == ["config.json", "metrics.parquet", "summary.json"]
    on_disk = json.loads((path / "summary.json").read_text())
    assert on_disk["final_test_accuracy"] is None  # NaN is not JSON: stored as null
    assert set(store.SUMMARY_KEYS) <= set(on_disk)
    assert on_disk["status"] == "completed" and on_disk["error"] is None
    assert on_disk["config_hash"] == store.config_hash(cfg)
    assert RunConfig.from_dict({k: v for k, v in json.loads((path / "config.json").read_text()).items()
                                if k != "config_hash"}) == cfg

    failed = RunConfig(method="dense", workers=1, run_id="r2")
    store.write_run(tmp_path, failed, store.rows_to_frame([]),
                    store.run_summary(failed, None, status="failed", error="boom\nTraceback ..."))
    summaries, metrics = store.load_runs(tmp_path)
    assert list(summaries["run_id"]) == ["r1", "r2"]
    assert list(summaries["status"]) == ["completed", "failed"]
    assert summaries.loc[0, "time_compute_s"] == pytest.approx(0.01)
    assert summaries.loc[1, "method"] == "dense" and summaries.loc[1, "error"].startswith("boom")
    assert len(metrics) == 6 and set(metrics["run_id"]) == {"r1"}
    assert {"kind", "rank", "iteration", "train_loss"} <= set(metrics.columns)
    assert store.completed_runs(tmp_path) == {store.config_hash(cfg): "r1"}


@pytest.mark.timeout(30)
def test_atomic_write_leaves_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "run" / "summary.json"
    store.write_json_atomic(target, {"status": "running"})
    with pytest.raises(TypeError):  # fails half way: after the temp file was created
        atomic_write_bytes(target, None)  # type: ignore[arg-type]
    assert json.loads(target.read_text()) == {"status": "running"}
    assert [p.name for p in target.parent.iterdir()] == ["summary.json"]  # no temp file left


@pytest.mark.timeout(30)
def test_load_runs_of_missing_or_empty_folder(tmp_path):
    summaries, metrics = store.load_runs(tmp_path / "nope")
    assert summaries.empty and metrics.empty
    assert set(store.SUMMARY_KEYS) <= set(summaries.columns)
    (tmp_path / "junk").mkdir()  # a folder without run files is not a run
    assert store.load_summaries(tmp_path).empty


@pytest.mark.timeout(30)
def test_bad_input_names_the_field(tmp_path):
    with pytest.raises(ValueError, match="run_id"):
        store.RunStore(tmp_path, "../x")
    with pytest.raises(ValueError, match="status='done'"):
        store.RunStore(tmp_path, "ok").write_summary({"status": "done"})
    assert store._jsonable({"a": float("nan"), "b": (1, math.inf)}) == {"a": None, "b": [1, None]}
