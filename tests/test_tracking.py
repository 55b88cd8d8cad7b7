"""Experiment tracking (gtopk_lab.orchestration.tracking): a real study on a 1-worker
LocalCluster forwarded to a real local MLflow file store and read back with MLflow's own
client (runs, tags, params, metric histories, summaries, artifact); a stored study
forwarded at once; W&B's calls (offline mode) recorded by a stand-in module, since wandb
is not installed here; the one-line error naming the extra when a package is absent."""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import pytest

from gtopk_lab.orchestration.tracking import (MLflowTracker, WandbTracker, row_metrics, summary_metrics,
                                              track_study)

TINY = dict(model="cnn", max_iterations=6, train_samples=256, test_samples=64, batch_size=16,
            sink_every=2, bandwidth="10GbE", epochs=3, density=0.05)


# --- the metric names -------------------------------------------------------------------------
def test_row_and_summary_metrics_by_hand() -> None:
    row = {"kind": "iter", "rank": 0, "iteration": 3, "epoch": 0.5, "method": "gtopk", "workers": 2,
           "density": 0.05, "k": 7, "train_loss": 2.5, "comm_s": float("nan"), "flag": True, "note": "x"}
    assert row_metrics(row) == {"epoch": 0.5, "k": 7.0, "train_loss": 2.5}
    epoch = {"kind": "epoch", "rank": 0, "iteration": 9, "epoch": 1.0, "test_accuracy": 0.25}
    assert row_metrics(epoch) == {"epoch_end/epoch": 1.0, "epoch_end/test_accuracy": 0.25}
    summary = {"run_id": "r", "iterations": 6, "final_test_accuracy": 0.5, "status": "completed",
               "time_breakdown_s": {"compute": 0.1, "communication": 0.2}, "wall_time_s": float("inf")}
    assert summary_metrics(summary) == {"summary/iterations": 6.0, "summary/final_test_accuracy": 0.5,
                                        "summary/time_breakdown_s/compute": 0.1,
                                        "summary/time_breakdown_s/communication": 0.2}


@pytest.mark.parametrize("module, make, extra", [("mlflow", lambda: MLflowTracker(), "mlflow"),
                                                 ("wandb", lambda: WandbTracker(), "wandb")])
def test_an_absent_package_is_one_line_naming_the_extra(monkeypatch, module, make, extra) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(ModuleNotFoundError) as info:
        make()
    message = str(info.value)
    assert "\n" not in message and f"pip install 'gtopk-lab[{extra}]'" in message


# --- a real study into a real MLflow store ---------------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 3-point study (dense P=1 baseline, dense and gtopk P=2, simulated) tracked while it runs."""
    pytest.importorskip("mlflow", reason="mlflow (the [mlflow] extra) is not installed")
    from gtopk_lab.orchestration.lab import Lab

    out = tmp_path_factory.mktemp("tracked")
    with Lab(n_workers=1, out=str(out), timeout_s=60, progress=False) as lab:
        study = lab.study(methods=["dense", "gtopk"], workers=[2], base=TINY, simulate=True)
        tracking = track_study(study, MLflowTracker(), tags={"purpose": "test"})
        assert study.wait(timeout_s=300)
        assert tracking.wait(timeout_s=120), tracking.errors
        yield lab, study, tracking


def _client(out: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=(Path(out).resolve() / "mlruns").as_uri())


@pytest.mark.timeout(600)
def test_study_lands_in_mlflow_and_reads_back(finished) -> None:
    lab, study, tracking = finished
    assert tracking.errors == []
    client = _client(lab.out)
    experiment = client.get_experiment_by_name("gtopk-lab")
    runs = {r.data.tags["gtopk_lab.run_id"]: r for r in client.search_runs([experiment.experiment_id])}
    summaries = {s["run_id"]: s for s in study.summaries().to_dict("records")}
    assert set(runs) == set(summaries) and len(runs) == len(study.points_list) == 3
    metrics = study.metrics()
    for run_id, run in runs.items():
        summary = summaries[run_id]
        point = next(p for p in study.points_list if study.handles[p.key].run_id == run_id)
        assert run.info.status == "FINISHED" and run.info.run_name == run_id
        assert run.data.tags["gtopk_lab.source"] == "simulated" and run.data.tags["purpose"] == "test"
        assert run.data.tags["gtopk_lab.point_key"] == point.key
        assert run.data.params["method"] == point.config.method == summary["method"]
        assert run.data.params["workers"] == str(point.config.workers)
        stored = point.config.to_dict()  # the typed option groups travel as JSON params
        assert json.loads(run.data.params["compute_charge"]) == stored["compute_charge"]
        assert json.loads(run.data.params["simulator"]) == stored["simulator"]
        # every rank-0 iteration row's loss, at its iteration
        mine = metrics[(metrics["run_id"] == run_id) & (metrics["rank"] == 0)]
        iters = mine[mine["kind"] == "iter"].sort_values("iteration")
        history = sorted(client.get_metric_history(run.info.run_id, "train_loss"), key=lambda m: m.step)
        assert [m.step for m in history] == iters["iteration"].tolist()
        assert [m.value for m in history] == pytest.approx(iters["train_loss"].tolist(), rel=1e-6)
        epochs = mine[mine["kind"] == "epoch"].sort_values("iteration")
        accuracy = client.get_metric_history(run.info.run_id, "epoch_end/test_accuracy")
        assert sorted(m.step for m in accuracy) == epochs["iteration"].tolist()
        # the summary: its numbers and the whole file
        assert run.data.metrics["summary/final_test_accuracy"] == pytest.approx(summary["final_test_accuracy"])
        assert run.data.metrics["summary/iterations"] == summary["iterations"]
        assert math.isclose(run.data.metrics["summary/time_breakdown_s/communication"],
                            summary["time_breakdown_s"]["communication"], rel_tol=1e-9, abs_tol=1e-15)
        import mlflow.artifacts

        stored = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/summary.json")
        assert stored["run_id"] == run_id and stored["status"] == "completed"


@pytest.mark.timeout(600)
def test_a_stored_study_is_forwarded_at_once(finished) -> None:
    lab, study, _ = finished
    again = lab.study(methods=["dense", "gtopk"], workers=[2], base=TINY, simulate=True)  # all stored
    assert not again.handles and len(again.stored) == 3
    tracking = track_study(again, MLflowTracker(experiment="again"))
    assert tracking.wait(timeout_s=60) and tracking.errors == []
    client = _client(lab.out)
    experiment = client.get_experiment_by_name("again")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.tags["gtopk_lab.run_id"] for r in runs) == sorted(h.run_id for h in study.handles.values())
    for run in runs:
        assert run.info.status == "FINISHED"
        assert len(client.get_metric_history(run.info.run_id, "train_loss")) >= 1


# --- W&B, offline: the calls, recorded ---------------------------------------------------------
class _FakeRun:
    def __init__(self, kwargs: dict) -> None:
        self.kwargs, self.logged, self.summary, self.exit_code = kwargs, [], {}, None

    def log(self, metrics: dict, step: int) -> None:
        self.logged.append((step, dict(metrics)))

    def finish(self, exit_code: int = 0) -> None:
        self.exit_code = exit_code


@pytest.mark.timeout(600)
def test_wandb_gets_one_offline_run_per_point_with_forward_steps(finished, monkeypatch) -> None:
    lab, study, _ = finished
    runs: list[_FakeRun] = []
    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: runs.append(_FakeRun(kwargs)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    tracking = track_study(study, WandbTracker(group="g"))
    assert tracking.wait(timeout_s=60) and tracking.errors == []
    metrics = study.metrics()
    assert sorted(r.kwargs["name"] for r in runs) == sorted(h.run_id for h in study.handles.values())
    for run in runs:
        assert run.kwargs["mode"] == "offline" and run.kwargs["group"] == "g"
        assert Path(run.kwargs["dir"]) == Path(lab.out) / "wandb"
        steps = [s for s, _ in run.logged]
        assert steps == sorted(set(steps))  # strictly forward
        mine = metrics[(metrics["run_id"] == run.kwargs["name"]) & (metrics["rank"] == 0)]
        assert set(steps) == set(mine["iteration"].tolist())
        assert run.summary["status"] == "completed" and run.exit_code == 0
        assert "final_test_accuracy" in run.summary
