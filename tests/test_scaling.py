"""Scaling efficiency from summaries, rows and simulated runs."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from gtopk_lab.config import RunConfig
from gtopk_lab.analysis.scaling import (BASELINE_DENSE, BASELINE_NONE, BASELINE_OWN, add_scaling_efficiency,
                                        baseline_note, scaling_efficiency, scaling_table, throughput)
from gtopk_lab.training.simulator import simulate


def _summary(method: str, workers: int, samples_per_s: float, model: str = "resnet20") -> dict:
    return {"method": method, "workers": workers, "model": model, "batch_size": 32,
            "samples_per_s_virtual": samples_per_s, "samples_per_s_wall": samples_per_s / 2}


def test_efficiency_is_throughput_ratio() -> None:
    one, four = _summary("dense", 1, 100.0), _summary("gtopk", 4, 300.0)
    assert scaling_efficiency(one, four) == pytest.approx(0.75)
    assert scaling_efficiency(one, four, time="wall") == pytest.approx(0.75)
    with pytest.raises(ValueError, match="run_1 has workers=4"):
        scaling_efficiency(four, one)
    with pytest.raises(ValueError, match="time="):
        scaling_efficiency(one, four, time="cpu")


def test_efficiency_from_rows_equals_iteration_time_ratio() -> None:
    def rows(workers: int, t_iter: float) -> list[dict]:
        return [{"kind": "iter", "rank": 0, "workers": workers, "virtual_time_s": t_iter * (i + 1),
                 "wall_time_s": t_iter * (i + 1)} for i in range(5)]

    assert scaling_efficiency(rows(1, 0.1), rows(8, 0.4)) == pytest.approx(0.25)
    assert throughput(rows(8, 0.4), batch_size=32) == pytest.approx(8 * 32 / 0.4)


def _runs() -> pd.DataFrame:
    """Summaries of two networks: 1 Gbit/s with dense/topk/gtopk at P=1,2; 10 Gbit/s without dense P=1."""
    rows = []
    for method, p, virt, wall in (("dense", 1, 100.0, 50.0), ("dense", 2, 150.0, 80.0),
                                  ("topk", 1, 120.0, 60.0), ("topk", 2, 180.0, 100.0),
                                  ("gtopk", 1, 110.0, 55.0), ("gtopk", 2, 200.0, 90.0)):
        rows.append({"run_id": f"{method}-{p}", "method": method, "workers": p, "bandwidth_bps": 1e9})
        rows[-1].update(samples_per_s_virtual=virt, samples_per_s_wall=wall)
    rows += [
        {"run_id": "dense-1-failed", "method": "dense", "workers": 1, "bandwidth_bps": 1e10,
         "samples_per_s_virtual": 1000.0, "samples_per_s_wall": 1000.0, "status": "failed"},
        {"run_id": "topk-1-fast", "method": "topk", "workers": 1, "bandwidth_bps": 1e10,
         "samples_per_s_virtual": 100.0, "samples_per_s_wall": 40.0},
        {"run_id": "topk-2-fast", "method": "topk", "workers": 2, "bandwidth_bps": 1e10,
         "samples_per_s_virtual": 150.0, "samples_per_s_wall": 60.0},
        {"run_id": "gtopk-2-fast", "method": "gtopk", "workers": 2, "bandwidth_bps": 1e10,
         "samples_per_s_virtual": 190.0, "samples_per_s_wall": 70.0},
    ]
    frame = pd.DataFrame(rows)
    frame["status"] = frame["status"].fillna("completed")
    return frame.assign(model="cnn", dataset="mnist1d", batch_size=32, latency_s=4.36e-4, density=0.01,
                        algorithm="butterfly")


def test_efficiency_divides_every_method_by_dense_p1() -> None:
    out = add_scaling_efficiency(_runs()).set_index("run_id")
    slow = out.loc[["dense-1", "dense-2", "topk-1", "topk-2", "gtopk-1", "gtopk-2"]]
    # by hand: samples/s(m, P) / (P * samples/s(dense, 1)), dense P=1 = 100 virtual, 50 wall
    assert slow.efficiency_virtual.tolist() == pytest.approx([1.0, 150 / 200, 120 / 100, 180 / 200, 110 / 100, 1.0])
    assert slow.efficiency_wall.tolist() == pytest.approx([1.0, 80 / 100, 60 / 50, 1.0, 55 / 50, 90 / 100])
    assert set(slow.baseline) == {BASELINE_DENSE} and set(slow.baseline_run_id) == {"dense-1"}
    assert slow.baseline_samples_per_s_virtual.tolist() == [100.0] * 6
    assert slow.baseline_samples_per_s_wall.tolist() == [50.0] * 6


def test_efficiency_falls_back_to_own_p1_only_without_dense_p1_and_says_so() -> None:
    out = add_scaling_efficiency(_runs()).set_index("run_id")
    # 10 Gbit/s: the only dense P=1 run failed, so topk divides by its own P=1 run
    assert out.loc["topk-2-fast", "baseline"] == BASELINE_OWN
    assert out.loc["topk-2-fast", "baseline_run_id"] == "topk-1-fast"
    assert out.loc["topk-2-fast", "efficiency_virtual"] == pytest.approx(150 / 200)
    assert out.loc["topk-2-fast", "efficiency_wall"] == pytest.approx(60 / 80)
    # gtopk has no P=1 run there at all: no efficiency, never another group's baseline
    assert out.loc["gtopk-2-fast", "baseline"] == BASELINE_NONE
    assert math.isnan(out.loc["gtopk-2-fast", "efficiency_virtual"])
    assert out.loc["dense-1-failed", "baseline"] == BASELINE_NONE
    note = baseline_note(out.baseline)
    assert "dense S-SGD at P=1" in note and "'own P=1'" in note and "'none'" in note and "\n" not in note
    assert "own P=1" not in baseline_note([BASELINE_DENSE])
    # only one clock asked for: only its columns
    virtual = add_scaling_efficiency(_runs(), times="virtual")
    assert "efficiency_virtual" in virtual and "efficiency_wall" not in virtual


def test_explicit_own_baseline_and_bad_arguments() -> None:
    out = add_scaling_efficiency(_runs(), baseline="own").set_index("run_id")
    assert out.loc["gtopk-2", "efficiency_virtual"] == pytest.approx(200 / 220)
    assert out.loc["gtopk-2", "baseline"] == BASELINE_OWN and out.loc["dense-2", "baseline"] == BASELINE_DENSE
    with pytest.raises(ValueError, match="baseline='best' is invalid"):
        add_scaling_efficiency(_runs(), baseline="best")
    with pytest.raises(ValueError, match="time='cpu' is invalid"):
        add_scaling_efficiency(_runs(), times="cpu")
    with pytest.raises(ValueError, match="no column 'workers'"):
        add_scaling_efficiency(_runs().drop(columns=["workers"]))


def test_scaling_table_layout() -> None:
    runs = [_summary("dense", 1, 100.0)]
    for method, eff in (("dense", 0.3), ("topk", 0.7), ("gtopk", 0.85)):
        for p in (4, 32):
            runs.append(_summary(method, p, 100.0 * p * eff))
    table = scaling_table(runs)
    assert list(table.columns) == [4, 32]
    assert list(table.index) == ["dense", "topk", "gtopk"]
    assert table.loc["gtopk", 32] == pytest.approx(85.0)
    assert table.attrs["baseline"] == {"dense": BASELINE_DENSE, "topk": BASELINE_DENSE, "gtopk": BASELINE_DENSE}
    two_models = runs + [_summary("dense", 1, 10.0, "vgg16"), _summary("dense", 4, 8.0, "vgg16")]
    assert scaling_table(two_models).loc[("vgg16", "dense"), 4] == pytest.approx(20.0)
    # the same rule as the sweep: a sparse P=1 run is not the baseline while dense P=1 exists
    with_own = runs + [_summary("gtopk", 1, 50.0)]
    assert scaling_table(with_own).loc["gtopk", 32] == pytest.approx(85.0)
    only_gtopk = [r for r in with_own if r["method"] == "gtopk"]
    fallback = scaling_table(only_gtopk)
    assert fallback.loc["gtopk", 32] == pytest.approx(100.0 * (100.0 * 32 * 0.85) / (32 * 50.0))
    assert fallback.attrs["baseline"] == {"gtopk": BASELINE_OWN}
    with pytest.raises(ValueError, match="no workers=1 baseline for model='resnet20', method='topk'"):
        scaling_table([r for r in with_own if r["method"] in ("gtopk", "topk")])


@pytest.mark.timeout(60)
def test_simulated_scaling_orders_methods_on_slow_network() -> None:
    base = RunConfig(method="dense", workers=1, model="mlp", dataset="synthetic", train_samples=512,
                     test_samples=32, batch_size=8, max_iterations=3, density=0.01, bandwidth="100Mbps",
                     latency="0.5ms")
    one = simulate(base)
    dense8 = simulate(base.replace(workers=8))
    gtopk8 = simulate(base.replace(workers=8, method="gtopk"))
    # 15k parameters over 100 Mbit/s: dense ring costs ~2 ms/iter, gTop-k sends ~1% of it
    assert gtopk8.summary["bytes_sent_per_rank_per_iter"] < dense8.summary["bytes_sent_per_rank_per_iter"] / 10
    e_dense, e_gtopk = scaling_efficiency(one, dense8), scaling_efficiency(one, gtopk8)
    assert 0 < e_dense < e_gtopk


@pytest.mark.timeout(60)
def test_measure_iteration_times_medians() -> None:
    from gtopk_lab.config import RunConfig
    from gtopk_lab.training.compute_time import measure_iteration_times

    cfg = RunConfig(method="gtopk", workers=4, model="cnn", dataset="synthetic", batch_size=16,
                    density=0.01, device="cpu")
    times = measure_iteration_times(cfg, repeats=3, warmup=1)
    assert len(times["compute_samples_s"]) == 3 and times["compute_time_s"] > 0
    assert times["selection_time_s"] >= 0 and times["numel"] == 5210 and times["k"] == 52
    assert sorted(times["compute_samples_s"])[1] == times["compute_time_s"]
    with pytest.raises(ValueError, match="repeats=0 is invalid"):
        measure_iteration_times(cfg, repeats=0)
