"""End to end on one embedded LocalCluster (4 worker processes): the real train_rank over
gloo for dense / Top-k / gTop-k at P = 1, 2, 4, live metrics, concurrency, resumable sweeps."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from gtopk_lab.config import RunConfig
from gtopk_lab.orchestration import Lab, load_runs
from gtopk_lab.orchestration.results import SUMMARY_KEYS

pytestmark = pytest.mark.slow

TINY = dict(max_iterations=4, train_samples=256, test_samples=64, batch_size=16, sink_every=1,
            bandwidth="1Gbps", epochs=1)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab")
    with Lab(n_workers=4, out=str(out), timeout_s=30) as lab:
        yield lab


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["dense", "topk", "gtopk"])
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_run_end_to_end(lab, method, workers):
    live: list = []
    cfg = RunConfig(method=method, workers=workers, density=0.05, **TINY)
    handle = lab.submit(cfg)
    handle.subscribe(lambda rows: live.append(rows))
    metrics, summary = handle.result(timeout_s=100)
    assert summary["status"] == "completed", summary["error"]
    assert set(SUMMARY_KEYS) <= set(summary)
    assert summary["workers"] == workers and summary["method"] == method
    assert summary["iterations"] == 4
    assert len(set(handle.workers)) == workers  # P distinct Dask workers
    assert summary["backend"] == "gloo"
    # co-located ranks: gTop-k's rounds and Top-k's allgather ring through shared memory; the
    # library collective (dense's ring) and a lone rank on gloo
    assert summary["transport"] == ("shm" if method != "dense" and workers > 1 else "gloo"), summary["transport"]
    it = metrics[metrics["kind"] == "iter"]
    assert sorted(it["rank"].unique()) == list(range(workers))
    assert (it.groupby("rank")["iteration"].max() == 3).all()
    assert live and sum(len(f) for f in live) == len(metrics)  # subscribers saw every row once
    folder = Path(lab.out) / handle.run_id
    stored = json.loads((folder / "summary.json").read_text())
    assert stored["status"] == "completed" and stored["run_id"] == handle.run_id
    assert (folder / "metrics.parquet").exists() and (folder / "config.json").exists()


@pytest.mark.timeout(120)
def test_live_rows_arrive_while_running(lab):
    # Throttled to a 20 ms-latency link so the run lasts seconds whatever the machine's speed
    # (the sleeps cost no CPU), longer than several 0.25 s monitor polls.
    cfg = RunConfig(method="gtopk", workers=2, density=0.05,
                    **{**TINY, "max_iterations": 80, "sink_every": 5, "epochs": 20,
                       "latency": "20ms", "throttle": True})
    handle = lab.submit(cfg)
    seen_running: list[int] = []
    handle.subscribe(lambda rows: seen_running.append(len(rows)) if handle.status == "running" else None)
    metrics, summary = handle.result(timeout_s=100)
    assert summary["status"] == "completed", summary["error"]
    assert len(seen_running) >= 2  # several batches delivered before the end


@pytest.mark.timeout(150)
def test_concurrent_runs_use_disjoint_workers_or_queue(lab):
    longer = {**TINY, "max_iterations": 40, "epochs": 10}
    a = lab.submit(RunConfig(method="topk", workers=2, **longer))
    b = lab.submit(RunConfig(method="gtopk", workers=2, **longer))
    assert a.status == "running" and b.status == "running"  # started within submit()
    c = lab.submit(RunConfig(method="dense", workers=4, **TINY))  # needs all 4: waits for a and b
    assert c.status == "queued" or (a.done() or b.done())
    assert len(set(a.workers) | set(b.workers)) == 4  # disjoint
    results = [h.result(timeout_s=120)[1] for h in (a, b, c)]
    assert [s["status"] for s in results] == ["completed"] * 3, [s["error"] for s in results]
    assert results[2]["started_at"] >= max(results[0]["finished_at"], results[1]["finished_at"])


@pytest.mark.timeout(150)
def test_sweep_resumes_and_load_runs(lab):
    configs = [RunConfig(method=m, workers=2, density=0.05, seed=7, **TINY) for m in ("topk", "gtopk")]
    first = lab.sweep(configs)
    assert list(first["status"]) == ["completed", "completed"]
    again = lab.sweep(configs)
    assert list(again["run_id"]) == list(first["run_id"]) and again["skipped"].all()
    summaries, metrics = load_runs(lab.out)
    assert set(first["run_id"]) <= set(summaries["run_id"])
    assert set(first["run_id"]) <= set(metrics["run_id"])
    assert lab.runs().shape[0] == summaries.shape[0]
    assert lab.dashboard_link.startswith("http://127.0.0.1:")


@pytest.mark.timeout(60)
def test_submit_bad_input(lab):
    with pytest.raises(TypeError, match="expected RunConfig"):
        lab.submit("gtopk")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="workers=5 is more than the 4"):
        lab.submit(RunConfig(workers=5, **TINY))
    with pytest.raises(ValueError, match="method='nope'"):
        lab.submit({"method": "nope"})
    with pytest.raises(ValueError, match="n_workers=0"):
        Lab(n_workers=0)
    with pytest.raises(ValueError, match="scheduler='udp://x:1'"):
        Lab(scheduler="udp://x:1")


def test_handles_are_thread_safe_to_read(lab):
    handle = lab.submit(RunConfig(method="dense", workers=1, **TINY))
    frames = []
    reader = threading.Thread(target=lambda: [frames.append(len(handle.metrics)) for _ in range(200)])
    reader.start()
    handle.result(timeout_s=60)
    reader.join(10)
    assert frames == sorted(frames)


@pytest.mark.timeout(120)
def test_calibration_file_travels_as_constants(lab, tmp_path):
    """Workers need no copy of a calibration JSON: the Lab sends its constants inline."""
    from gtopk_lab.network.model import NetworkModel

    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"model": {"alpha_s": 2e-4, "beta_s_per_byte": 8e-9, "name": "lab-cal"}}))
    cfg = RunConfig(method="gtopk", workers=2, density=0.05, **{**TINY, "bandwidth": str(cal)})
    handle = lab.submit(cfg)
    cal.unlink()  # gone before any rank reads it
    _metrics, summary = handle.result(timeout_s=100)
    assert summary["status"] == "completed", summary["error"]
    assert summary["latency_s"] == pytest.approx(2e-4) and summary["bandwidth_bps"] == pytest.approx(1e9)
    stored = json.loads((Path(lab.out) / handle.run_id / "config.json").read_text())
    assert NetworkModel.from_strings(stored["bandwidth"]).name == "lab-cal"
    with pytest.raises(ValueError, match="bandwidth="):
        lab.submit(RunConfig(method="gtopk", workers=2, density=0.05, **{**TINY, "bandwidth": str(cal)}))
