"""Lab.study: grid expansion, the study's tables against hand-computed oracles, and one
2-worker LocalCluster on which P beyond the cluster runs as simulator tasks on the workers,
seeds give mean +- std, a study resumes and a cancelled study stops its runs."""

from __future__ import annotations

import math
import statistics
import time

import pandas as pd
import pytest

from gtopk_lab.analysis.study_tables import aggregate_seeds, point_efficiency
from gtopk_lab.orchestration.study_grid import expand_grid

TINY = dict(model="cnn", max_iterations=12, train_samples=512, test_samples=64, batch_size=16,
            sink_every=2, bandwidth="10GbE", epochs=5, density=0.05)


# ------------------------------------------------------------------------------- the grid
@pytest.mark.timeout(30)
def test_grid_adds_dense_baselines_per_source_and_collapses_dense_density() -> None:
    points = expand_grid(TINY, {"methods": ["dense", "gtopk"], "workers": [2, 8],
                                "density": [0.1, 0.01], "seeds": 2}, real_max_workers=4)
    got = sorted((p.config.method, p.config.workers, p.config.density, p.config.seed, p.source)
                 for p in points)
    want = []
    for seed in (0, 1):
        want += [("dense", 1, 0.1, seed, "real"), ("dense", 1, 0.1, seed, "simulated"),
                 ("dense", 2, 0.1, seed, "real"), ("dense", 8, 0.1, seed, "simulated")]
        want += [("gtopk", 2, d, seed, "real") for d in (0.1, 0.01)]
        want += [("gtopk", 8, d, seed, "simulated") for d in (0.1, 0.01)]
    assert got == sorted(want)
    assert all(p.is_baseline for p in points[:4])  # baselines are scheduled first
    both = expand_grid(TINY, {"method": "gtopk", "workers": [1, 2]}, real_max_workers=4, both_ways=[2])
    assert sorted((p.config.workers, p.source) for p in both) == [(1, "real"), (2, "real"), (2, "simulated")]
    assert len({p.key for p in both}) == 3  # the source is part of a point's identity


@pytest.mark.timeout(30)
def test_grid_keeps_every_density_of_cltk_and_collapses_powersgds() -> None:
    """CLT-k aggregates the whole buffer but sends k = rho d of it (its leader selects): the
    density applies; PowerSGD's does not (its rank sets what it sends)."""
    points = expand_grid(TINY, {"methods": ["clt-k", "powersgd"], "workers": [2], "density": [0.1, 0.01]},
                         real_max_workers=4)
    got = sorted((p.config.method, p.config.density) for p in points if p.config.workers == 2)
    assert got == [("clt-k", 0.01), ("clt-k", 0.1), ("powersgd", 0.1)]


@pytest.mark.timeout(30)
def test_grid_runs_a_method_without_patterns_once_and_tables_show_no_pattern() -> None:
    """A pattern axis multiplies gTop-k's points only: Top-k's allgather has no pattern and
    Ok-Topk fixes its own, so listing butterfly and tree ran each twice (the same run; two seeds'
    worth of points in the tables, and Ok-Topk shown as "tree"). Their tables show none."""
    points = expand_grid(TINY, {"methods": ["gtopk", "topk", "oktopk"], "workers": [2],
                                "algorithms": ["butterfly", "tree"]}, real_max_workers=4)
    got = sorted((p.config.method, p.config.algorithm) for p in points)
    assert got == [("gtopk", "butterfly"), ("gtopk", "tree"), ("oktopk", "butterfly"), ("topk", "butterfly")]
    frame = pd.DataFrame([{"method": m, "workers": 2, "density": 0.01, "algorithm": a, "run_id": f"{m}-{a}",
                           "samples_per_s_virtual": 100.0} for m, a in got])
    from gtopk_lab.analysis.study_tables import _with_defaults
    shown = _with_defaults(frame).set_index("run_id")["algorithm"].to_dict()
    assert {k: None if pd.isna(v) else v for k, v in shown.items()} == {
        "gtopk-butterfly": "butterfly", "gtopk-tree": "tree", "oktopk-butterfly": None, "topk-butterfly": None}


@pytest.mark.timeout(60)
def test_a_summary_records_the_pattern_the_run_used() -> None:
    """A config asking for the tree: gTop-k takes it, Ok-Topk keeps its own (plain), Top-k's
    allgather has none; a run that failed before rank 0 finished says the same."""
    from gtopk_lab.config import RunConfig
    from gtopk_lab.orchestration.results import run_summary
    from gtopk_lab.training.simulator import simulate

    used = {}
    for method in ("gtopk", "oktopk", "topk"):
        config = RunConfig(method=method, workers=2, model="mlp", dataset="synthetic", train_samples=64,
                           test_samples=16, batch_size=16, max_iterations=1, algorithm="tree", run_id=method)
        used[method] = (simulate(config).summary["algorithm"], run_summary(config, None, status="failed")["algorithm"])
    assert used == {"gtopk": ("tree", "tree"), "oktopk": ("plain", "plain"), "topk": (None, None)}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("axes, error, field", [
    ({"workers": []}, ValueError, "workers"),
    ({"workers": [0, 2]}, ValueError, "workers"),
    ({"methods": ["nope"]}, ValueError, "nope"),
    ({"seeds": 0}, ValueError, "seeds"),
    ({"seeds": True}, TypeError, "seeds"),
    ({"not_a_field": 3}, TypeError, "not_a_field"),
    ({"density": [2.0]}, ValueError, "density"),
])
def test_grid_rejects_bad_input_naming_the_field(axes: dict, error: type, field: str) -> None:
    with pytest.raises(error, match=field):
        expand_grid(TINY, axes, real_max_workers=2)


# ------------------------------------------------------------------------------- the tables
def _point(method: str, workers: int, seed: int, speed: float, source: str = "real",
           final: bool = True) -> dict:
    return {"run_id": f"{method}-{workers}-{seed}-{source}", "method": method, "workers": workers,
            "density": 0.01, "algorithm": None, "model": "mlp", "dataset": "mnist1d", "batch_size": 16,
            "bandwidth_bps": 1e9, "latency_s": 1e-4, "seed": seed, "source": source, "final": final,
            "status": "completed", "samples_per_s_virtual": speed}


@pytest.mark.timeout(30)
def test_efficiency_divides_by_its_own_seed_and_source_baseline_and_averages_seeds() -> None:
    rows = [_point("dense", 1, 0, 100.0), _point("dense", 1, 1, 80.0),
            _point("dense", 1, 0, 50.0, "simulated"),
            _point("gtopk", 4, 0, 300.0), _point("gtopk", 4, 1, 288.0),
            _point("gtopk", 8, 0, 200.0, "simulated", final=False)]
    table = aggregate_seeds(point_efficiency(pd.DataFrame(rows)))
    real4 = table[(table.method == "gtopk") & (table.workers == 4)].iloc[0]
    per_seed = [300.0 / (4 * 100.0), 288.0 / (4 * 80.0)]  # each seed's own dense P=1
    assert real4.efficiency_mean == pytest.approx(statistics.mean(per_seed))
    assert real4.efficiency_std == pytest.approx(statistics.stdev(per_seed))
    assert real4.n == 2 and not real4.provisional
    sim8 = table[(table.method == "gtopk") & (table.workers == 8)].iloc[0]
    assert sim8.efficiency_mean == pytest.approx(200.0 / (8 * 50.0))  # the simulated baseline
    assert sim8.provisional and sim8.n == 1 and math.isnan(sim8.efficiency_std)


@pytest.mark.timeout(30)
def test_fidelity_check_flags_points_off_the_prediction_or_above_100_percent() -> None:
    from gtopk_lab.analysis.study_tables import fidelity_check

    table = pd.DataFrame([
        {"method": "gtopk", "workers": 4, "density": 0.01, "algorithm": "butterfly", "bandwidth_bps": 1e9,
         "latency_s": 0.0, "source": "real", "efficiency_mean": 0.70, "efficiency_std": math.nan,
         "n": 1, "provisional": False},
        {"method": "gtopk", "workers": 8, "density": 0.01, "algorithm": "butterfly", "bandwidth_bps": 1e9,
         "latency_s": 0.0, "source": "real", "efficiency_mean": 0.45, "efficiency_std": math.nan,
         "n": 1, "provisional": False},
        {"method": "dense", "workers": 2, "density": math.nan, "algorithm": None, "bandwidth_bps": 1e9,
         "latency_s": 0.0, "source": "real", "efficiency_mean": 1.10, "efficiency_std": math.nan,
         "n": 1, "provisional": False}])
    predicted = table[["method", "workers", "density", "algorithm", "bandwidth_bps", "latency_s", "source"]].assign(
        predicted=[0.75, 0.60, 1.08])
    checked = fidelity_check(table, predicted, tolerance=0.10)
    assert checked["error"].tolist() == pytest.approx([-0.05, -0.15, 0.02])
    assert checked["trusted"].tolist() == [True, False, False]  # off by 15 points; above 100%
    with pytest.raises(ValueError, match="tolerance"):
        fidelity_check(table, predicted, tolerance=0)


# ------------------------------------------------------------------------------- a cluster
@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from gtopk_lab.orchestration import Lab

    with Lab(n_workers=2, out=str(tmp_path_factory.mktemp("study")), timeout_s=30, progress=False) as lab:
        yield lab


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_study_runs_beyond_the_cluster_on_workers_live_and_resumes(lab) -> None:
    axes = dict(methods=["dense", "gtopk"], workers=[1, 2, 4], seeds=2, base=TINY)
    study = lab.study(**axes)
    seen: list[tuple[int, int]] = []  # (points with a throughput, runs still going)
    study.subscribe(lambda s: seen.append((len(s.points()), sum(not h.done() for h in s.handles.values()))))
    assert study.wait(200)
    status = study.status()
    assert (status["status"] == "completed").all(), status
    summaries = study.summaries()
    workers = set(lab.worker_info())
    sim = summaries[summaries["workers"] == 4]
    assert len(sim) == 4 and (sim["source"] == "simulated").all() and sim["simulated"].all()
    for addresses in sim["dask_workers"]:  # one reserved worker, not the client
        assert len(addresses) == 1 and addresses[0] in workers
    assert any(points and going for points, going in seen), seen  # points appeared while running
    table = study.efficiency()
    gtopk4 = table[(table.method == "gtopk") & (table.workers == 4)].iloc[0]
    assert gtopk4.n == 2 and math.isfinite(gtopk4.efficiency_std) and not gtopk4.provisional
    assert study.check_lines()  # the check always says something
    # every point has a prediction to be checked against; whether it is within 10 points
    # depends on the machine's load (benchmarks/RESULTS.md has the figure on a quiet one)
    checked = study.check()
    assert checked["predicted"].notna().all() and checked["trusted"].dtype == bool, checked.to_string()
    late: list = []
    study.subscribe(late.append)  # a finished study calls a new subscriber once, at once
    assert late[:1] == [study]
    again = lab.study(**axes)  # same grid, same folder: nothing runs again
    assert not again.handles and len(again.stored) == len(study.points_list)
    assert again.wait(5) and len(again.summaries()) == len(summaries)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cancelling_a_study_stops_its_runs(lab) -> None:
    slow = {**TINY, "max_iterations": 400, "epochs": 400, "latency": "20ms", "throttle": True,
            "sink_every": 1}
    study = lab.study(methods=["gtopk"], workers=[2, 4], base=slow, skip_completed=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
            h.status == "running" and len(h.metrics) for h in study.handles.values()):
        time.sleep(0.2)
    assert any(h.status == "running" for h in study.handles.values())  # cancel ranks that train
    study.cancel()
    assert study.wait(60)
    assert set(study.status()["status"]) <= {"cancelled"}, study.status()


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_study_run_again_continues_its_cancelled_points_under_their_run_ids(lab) -> None:
    from gtopk_lab.orchestration import results as store

    slow = {**TINY, "max_iterations": 60, "epochs": 60, "latency": "20ms", "throttle": True,
            "sink_every": 1, "seed": 7}
    first = lab.study(methods=["gtopk"], workers=[2], base=slow)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not any(
            h.status == "running" and len(h.metrics) for h in first.handles.values()):
        time.sleep(0.2)
    first.cancel()
    assert first.wait(60)
    cancelled = {key: h.run_id for key, h in first.handles.items() if h.status == "cancelled"}
    assert cancelled, first.status()
    deadline = time.monotonic() + 60  # the Lab winds the cancelled runs down
    while time.monotonic() < deadline and any(lab.run_active(rid) for rid in cancelled.values()):
        time.sleep(0.2)
    kept = {key: len(store.RunStore(lab.out, rid).read_metrics()) for key, rid in cancelled.items()}
    again = lab.study(methods=["gtopk"], workers=[2], base=slow)
    assert again.wait(150)
    assert (again.status()["status"] == "completed").all(), again.status()
    for key, run_id in cancelled.items():  # the same run folder, resumed, not a new one
        assert again.handles[key].run_id == run_id
        final = store.RunStore(lab.out, run_id).read_metrics()
        iters = final[final["kind"] == "iter"]
        assert len(final) >= kept[key] and sorted(set(iters["iteration"])) == list(range(60))
    assert not store.interrupted_runs(lab.out).keys() & cancelled.keys()


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_target_cnn_on_10gbe_every_real_and_simulated_point_within_10_points_of_its_prediction(lab) -> None:
    """Issue 15's target: on 10GbE with the CNN, dense, Top-k and gTop-k at P = 1, 2 on real
    ranks and P = 16 simulated within 10 points of the alpha-beta prediction, none above 100%.

    Every rank, real or virtual, is charged the workload's calibrated compute, merge gamma
    and each method's calibrated selection (``Lab.study``'s default, measured once on a
    worker: a loaded 2-core box, and this suite's other process, would otherwise decide the
    figure; a measured selection put gTop-k's P = 16 point 10-13 points over beside two busy
    loops) and the collectives modelled, so what is checked is the whole pipeline from rows
    to steady-state throughput to the efficiency table, for both sources."""
    base = dict(model="cnn", max_iterations=24, train_samples=1024, test_samples=64, batch_size=16,
                sink_every=8, epochs=50, bandwidth="10GbE")
    study = lab.study(methods=["dense", "topk", "gtopk"], workers=[1, 2, 16], density=0.01, base=base,
                      skip_completed=False)
    charged = {p.config.extra["compute_time_s"] for p in study.points_list}
    assert len(charged) == 1 and charged.pop() > 0  # one calibration for every point, both sources
    selections = {p.config.method: p.config.compute_charge.selection_time_s for p in study.points_list}
    assert selections["dense"] is None and selections["topk"] > 0 and selections["gtopk"] > 0
    assert study.wait(170)
    checked = study.check(tolerance=0.10)
    assert set(zip(checked.workers, checked.source)) == {(1, "real"), (2, "real"), (16, "simulated"),
                                                         (1, "simulated")}, checked.to_string()
    assert checked["predicted"].notna().all(), checked.to_string()
    assert checked["trusted"].all(), checked.to_string()
    assert (checked["efficiency_mean"] <= 1.0 + 1e-9).all(), checked.to_string()
    at16 = checked[checked.workers == 16].set_index("method")["efficiency_mean"]
    # on 10GbE at P = 16 gTop-k already wins: 2 log2 P = 8 latency-bound rounds against the
    # ring's 2(P - 1) = 30. Top-k's allgather also takes 2(P - 1) rounds, so against dense it
    # is a tie plus its selection (measured 0.50-0.54 vs dense 0.41-0.56 as the calibrated
    # compute varies): its point is checked against its prediction above, not against dense
    assert at16["gtopk"] > at16["dense"], at16.to_dict()
    assert study.check_lines() == ["check: every point within 10% of the alpha-beta prediction"]


@pytest.mark.timeout(120)
def test_calibrated_costs_are_measured_once_per_workload_on_a_worker_and_kept(lab, tmp_path) -> None:
    """orchestration.calibration: one compute task per workload (not per density, method, P
    or network), one merge-gamma task per density, one selection task per sparse method and
    density (PowerSGD's its collective's projections; none for dense, a local-steps method or
    a density schedule); the stored values
    are reused (a resumed study keeps its points' identity); a damaged file is moved aside,
    not lost."""
    import json

    from gtopk_lab.config import RunConfig
    from gtopk_lab.orchestration.calibration import CALIBRATION_FILE, calibrated_costs

    def entries() -> list[dict]:
        return json.loads((tmp_path / CALIBRATION_FILE).read_text())["entries"]

    config = RunConfig(method="gtopk", workers=4, model="mlp", batch_size=8, density=0.01)
    first = calibrated_costs(lab, config, tmp_path, repeats=3)
    assert first["compute_time_s"] > 0 and first["merge_gamma_s_per_element"] > 0
    assert first["selection_time_s"] > 0
    stored = entries()
    assert [next(k for k in ("workload", "merge_workload", "selection_workload") if k in e) for e in stored] \
        == ["workload", "merge_workload", "selection_workload"]
    assert stored[0]["compute_time_s"] == first["compute_time_s"] and stored[0]["threads"] == 1
    assert stored[0]["compute_time_s"] <= stored[0]["compute_median_s"]  # the lower quartile
    assert stored[1]["k"] == int(0.01 * stored[0]["numel"]) == stored[2]["k"]
    assert stored[2]["selection_time_s"] == first["selection_time_s"] <= stored[2]["selection_median_s"]
    assert stored[2]["selection_workload"]["method"] == "gtopk" and stored[2]["threads"] == 1
    # P and the network change neither one rank's compute nor its selection: the stored values
    assert calibrated_costs(lab, config.replace(workers=16, bandwidth="10GbE"), tmp_path, repeats=3) == first
    assert len(entries()) == 3
    # dense: the same compute, no selection to charge
    dense = calibrated_costs(lab, config.replace(method="dense"), tmp_path, repeats=3)
    assert dense == {**first, "selection_time_s": None} and len(entries()) == 3
    # Top-k: a selection entry of its own; a density schedule keeps the selection measured
    assert calibrated_costs(lab, config.replace(method="topk"), tmp_path, repeats=3)["selection_time_s"] > 0
    assert len(entries()) == 4
    # PowerSGD selects nothing but projects in its collective: that is its selection
    assert calibrated_costs(lab, config.replace(method="powersgd"), tmp_path, repeats=3)["selection_time_s"] > 0
    assert entries()[-1]["selection_workload"]["method"] == "powersgd" and len(entries()) == 5
    warm = calibrated_costs(lab, config.replace(density_warmup=(0.1, 1)), tmp_path, repeats=3)
    assert warm["selection_time_s"] is None and len(entries()) == 5
    # another density: the same compute, a gamma and a selection of its own (k changes)
    other = calibrated_costs(lab, config.replace(density=0.1), tmp_path, repeats=3)
    assert other["compute_time_s"] == first["compute_time_s"] and len(entries()) == 7
    calibrated_costs(lab, config.replace(batch_size=16), tmp_path, repeats=3)
    assert len(entries()) == 10
    (tmp_path / CALIBRATION_FILE).write_text("{trunc")
    assert calibrated_costs(lab, config, tmp_path, repeats=3)["compute_time_s"] > 0
    assert [p.name.split(".damaged-")[0] for p in tmp_path.glob("*.damaged-*")] == [CALIBRATION_FILE]

@pytest.mark.slow
@pytest.mark.timeout(120)
def test_lab_tune_runs_on_the_cluster_and_compares_at_the_chosen_lr(lab) -> None:
    """Lab.tune: the tuning and comparison runs go through the cluster's sweep (simulated)
    and come back matched to their configs; SGD with momentum 0.9 on MNIST-1D prefers 0.1
    to 0.001 on the validation split."""
    base = dict(model="mlp", dataset="mnist1d", train_samples=400, test_samples=100, workers=2, epochs=3,
                batch_size=16, eval_every_epochs=3)
    result = lab.tune("dense", lrs=[0.001, 0.1], base=base)
    assert result.best_lr == {"dense": 0.1}
    assert result.trials["value"].notna().all() and len(result.trials) == 2
    row = result.comparison.iloc[0]
    assert row["lr"] == 0.1 and row["status"] == "completed" and row["lr_budget"] == [0.001, 0.1]


# ------------------------------------------------------- one scan, reload, shared points
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_study_scans_its_folder_once_and_reloads_finished_or_not(lab, monkeypatch) -> None:
    """Study start reads the results folder once for all its points (it read it twice, a
    completed and an interrupted pass, before); Study.load rebuilds the study from the
    summaries that record its id: while it runs (views of the unfinished points) and after
    (its tables equal the launched study's)."""
    from gtopk_lab.orchestration import reading
    from gtopk_lab.orchestration.study import Study
    from gtopk_lab.orchestration.study_load import StoredRunView

    scans: list[str] = []
    real_run_dirs = reading.run_dirs
    monkeypatch.setattr(reading, "run_dirs", lambda out: scans.append(str(out)) or real_run_dirs(out))
    base = {**TINY, "seed": 21, "max_iterations": 8}
    study = lab.study(methods=["dense", "gtopk"], workers=[1, 2, 4], simulate=True, compute="measured",
                      base=base, tags=["reload"])
    assert len(study.points_list) == 6  # dense and gtopk at P = 1, 2, 4
    assert scans == [lab.out], scans  # one pass over the folder, whatever the number of points
    early = Study.load(lab.out, study.study_id)  # the queued/running points as views
    assert [p.key for p in early.points_list] == [p.key for p in study.points_list]
    assert set(early.handles) | set(early.stored) == {p.key for p in study.points_list}
    assert all(isinstance(h, StoredRunView) for h in early.handles.values())
    assert study.wait(120)
    assert early.wait(30)  # the views re-read their folders until the runs ended
    loaded = Study.load(lab.out, study.study_id)
    assert loaded.tags == ("reload",) and not loaded.handles and loaded.done()
    assert {k: s["run_id"] for k, s in loaded.stored.items()} == {
        k: h.run_id for k, h in study.handles.items()}
    # the oracle: the launched study's own tables
    columns = ["method", "workers", "source", "efficiency_mean", "n"]
    pd.testing.assert_frame_equal(loaded.efficiency()[columns], study.efficiency()[columns])
    pd.testing.assert_frame_equal(early.efficiency()[columns], study.efficiency()[columns])
    assert len(loaded.metrics()) == len(study.metrics())
    with pytest.raises(ValueError, match="study_id='no-such-study'"):
        Study.load(lab.out, "no-such-study")


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_point_two_studies_share_while_it_runs_is_submitted_once(lab) -> None:
    """A second study whose point the first one runs now follows that run (the same handle,
    one run in the Lab's queue), records both studies on it, and cancelling the second
    study leaves the first one's run going."""
    # 80 throttled iterations (>= 1.6 s of link time alone): the second study starts while
    # the first one's run is queued or running, however loaded the machine
    slow = {**TINY, "max_iterations": 80, "epochs": 80, "latency": "20ms", "throttle": True,
            "sink_every": 1, "seed": 31}
    first = lab.study(methods=["gtopk"], workers=[2], base=slow, compute="measured", study_id="share-a")
    second = lab.study(methods=["gtopk"], workers=[2], base=slow, compute="measured", study_id="share-b")
    (key,) = [p.key for p in first.points_list]
    assert second.handles[key] is first.handles[key] and second.shared == {key}
    assert sum(h.point_key == key for h in lab._monitor.handles()) == 1  # submitted once
    second.cancel()  # not its run to stop
    assert not first.handles[key].cancel_requested
    assert first.wait(120) and second.wait(5)
    summary = first.handles[key].summary
    assert summary["status"] == "completed"
    assert summary["study_id"] == "share-a" and summary["study_ids"] == ["share-a", "share-b"]
    stored = lab.runs(study="share-b")
    assert stored["run_id"].tolist() == [first.handles[key].run_id]
