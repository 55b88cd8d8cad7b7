"""Scaling efficiency from summaries, rows and simulated runs."""

from __future__ import annotations

import pytest

from gtopk_lab.config import RunConfig
from gtopk_lab.training.scaling import scaling_efficiency, scaling_table, throughput
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


def test_scaling_table_layout() -> None:
    runs = [_summary("dense", 1, 100.0)]
    for method, eff in (("dense", 0.3), ("topk", 0.7), ("gtopk", 0.85)):
        for p in (4, 32):
            runs.append(_summary(method, p, 100.0 * p * eff))
    table = scaling_table(runs)
    assert list(table.columns) == [4, 32]
    assert list(table.index) == ["dense", "topk", "gtopk"]
    assert table.loc["gtopk", 32] == pytest.approx(85.0)
    two_models = runs + [_summary("dense", 1, 10.0, "vgg16"), _summary("dense", 4, 8.0, "vgg16")]
    assert scaling_table(two_models).loc[("vgg16", "dense"), 4] == pytest.approx(20.0)


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
    from gtopk_lab.training.scaling import measure_iteration_times

    cfg = RunConfig(method="gtopk", workers=4, model="cnn", dataset="synthetic", batch_size=16,
                    density=0.01, device="cpu")
    times = measure_iteration_times(cfg, repeats=3, warmup=1)
    assert len(times["compute_samples_s"]) == 3 and times["compute_time_s"] > 0
    assert times["selection_time_s"] >= 0 and times["numel"] == 5210 and times["k"] == 52
    assert sorted(times["compute_samples_s"])[1] == times["compute_time_s"]
    with pytest.raises(ValueError, match="repeats=0 is invalid"):
        measure_iteration_times(cfg, repeats=0)
