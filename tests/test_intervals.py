"""Confidence intervals over seeds (gtopk_lab.analysis.intervals) and the Pareto frontier
(gtopk_lab.analysis.pareto), each against an oracle computed here: scipy's own
``t.interval`` on known samples, and an O(n^2) dominance check on random points."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from gtopk_lab.analysis.intervals import (ONE_SEED_NOTE, add_intervals, interval_columns, interval_note,
                                          t_interval)
from gtopk_lab.analysis.outcomes import run_outcomes, time_to_accuracy, time_to_accuracy_table
from gtopk_lab.analysis.pareto import frontier_points, pareto_front
from gtopk_lab.analysis.scaling import efficiency_intervals
from gtopk_lab.analysis.study_tables import aggregate_seeds, point_efficiency

pytestmark = pytest.mark.timeout(60)

SAMPLES = ([0.81, 0.84, 0.86], [1.0, 2.0], [3.5, 2.25, 4.0, 3.0, 3.75, 2.5, 3.25], [10.0, 10.0, 10.0])


@pytest.mark.parametrize("sample", SAMPLES)
@pytest.mark.parametrize("confidence", [0.95, 0.9, 0.99])
def test_t_interval_matches_scipy(sample: list[float], confidence: float) -> None:
    n = len(sample)
    mean = statistics.fmean(sample)
    sem = statistics.stdev(sample) / math.sqrt(n)
    if sem == 0:
        low = high = mean  # scipy returns NaN for a zero scale; the interval is a point
    else:
        low, high = stats.t.interval(confidence, n - 1, loc=mean, scale=sem)
    ci = t_interval(sample, confidence)
    assert ci.n == n and ci.mean == pytest.approx(mean)
    assert ci.low == pytest.approx(low, rel=1e-12, abs=1e-12)
    assert ci.high == pytest.approx(high, rel=1e-12, abs=1e-12)
    assert ci.std == pytest.approx(statistics.stdev(sample))


def test_one_seed_has_no_interval_and_says_so() -> None:
    one = t_interval([0.7, math.nan])  # NaN dropped: one value left
    assert one.n == 1 and one.mean == 0.7 and math.isnan(one.low) and math.isnan(one.high)
    empty = t_interval([])
    assert empty.n == 0 and math.isnan(empty.mean)
    assert interval_note(1) == ONE_SEED_NOTE
    assert "95% Student-t" in interval_note(3) and "n up to 3" in interval_note(3)
    with pytest.raises(ValueError, match="confidence=1.5"):
        t_interval([1.0, 2.0], 1.5)


def test_add_intervals_and_interval_columns_per_group() -> None:
    frame = pd.DataFrame({"method": ["a", "a", "a", "b", "c", "c"], "v": [1.0, 2.0, 4.0, 5.0, 2.0, 3.0]})
    table = add_intervals(frame, ["method"], "v", prefix="eff").set_index("method")
    low, high = stats.t.interval(0.95, 2, loc=7 / 3, scale=statistics.stdev([1, 2, 4]) / math.sqrt(3))
    assert table.loc["a", "eff_ci_low"] == pytest.approx(low) and table.loc["a", "eff_ci_high"] == pytest.approx(high)
    assert table.loc["b", "n"] == 1 and math.isnan(table.loc["b", "eff_ci_low"])
    lo, hi = interval_columns(table["eff_mean"], table["eff_std"], table["n"])
    assert lo["a"] == pytest.approx(low) and hi["c"] == pytest.approx(table.loc["c", "eff_ci_high"])
    assert math.isnan(lo["b"])
    with pytest.raises(ValueError, match="'nope'"):
        add_intervals(frame, ["nope"], "v")


def _study_points(seeds: int) -> pd.DataFrame:
    rows = []
    for seed in range(seeds):
        for method, p, speed in (("dense", 1, 100.0), ("dense", 4, 200.0 + 10 * seed), ("gtopk", 4, 300.0 + 25 * seed)):
            rows.append({"method": method, "workers": p, "density": 0.01 if method == "gtopk" else 1.0,
                         "seed": seed, "source": "real", "final": True, "run_id": f"{method}{p}s{seed}",
                         "samples_per_s_virtual": speed * (1 + 0.1 * seed if p == 1 else 1), "status": "completed",
                         "bandwidth_bps": 1e9, "latency_s": 1e-4})
    return pd.DataFrame(rows)


def test_efficiency_tables_carry_the_t_interval() -> None:
    points = _study_points(3)
    # the oracle: per seed, P=4 speed / (4 * that seed's dense P=1 speed)
    per_seed = [(300.0 + 25 * s) / (4 * 100.0 * (1 + 0.1 * s)) for s in range(3)]
    low, high = stats.t.interval(0.95, 2, loc=statistics.fmean(per_seed),
                                 scale=statistics.stdev(per_seed) / math.sqrt(3))
    table = aggregate_seeds(point_efficiency(points))
    g = table[(table.method == "gtopk")].iloc[0]
    assert g.n == 3 and g.efficiency_ci_low == pytest.approx(low) and g.efficiency_ci_high == pytest.approx(high)
    intervals = efficiency_intervals(points)
    g2 = intervals[intervals.method == "gtopk"].iloc[0]
    assert g2.efficiency_mean == pytest.approx(statistics.fmean(per_seed))
    assert g2.efficiency_ci_low == pytest.approx(low) and g2.efficiency_ci_high == pytest.approx(high)
    single = aggregate_seeds(point_efficiency(_study_points(1)))
    assert single.efficiency_ci_low.isna().all() and single.efficiency_ci_high.isna().all()


def _dominated_brute_force(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """O(n^2): i is dominated when some j has x_j <= x_i, y_j >= y_i, one of them strictly."""
    n = len(x)
    out = np.zeros(n, dtype=bool)
    for i in range(n):
        for j in range(n):
            if x[j] <= x[i] and y[j] >= y[i] and (x[j] < x[i] or y[j] > y[i]):
                out[i] = True
                break
    return out


@pytest.mark.parametrize("seed", range(12))
def test_pareto_front_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 80))
    # few distinct values: ties on one or both axes (duplicates) are the hard cases
    x = rng.integers(0, 8 if seed % 2 else 1000, n).astype(float)
    y = rng.integers(0, 8 if seed % 3 else 1000, n).astype(float)
    assert (pareto_front(x, y) == ~_dominated_brute_force(x, y)).all()
    # the other orientations: flip the signs for the oracle
    assert (pareto_front(x, y, x_lower_better=False) == ~_dominated_brute_force(-x, y)).all()
    assert (pareto_front(x, y, y_higher_better=False) == ~_dominated_brute_force(x, -y)).all()


def test_pareto_front_edge_cases() -> None:
    assert pareto_front([], []).tolist() == []
    assert pareto_front([1.0, math.nan, 2.0], [0.5, 0.9, 0.4]).tolist() == [True, False, False]
    assert pareto_front([1.0, 1.0], [0.5, 0.5]).tolist() == [True, True]  # duplicates: neither dominates
    with pytest.raises(ValueError, match="shapes"):
        pareto_front([1.0, 2.0], [1.0])
    frame = pd.DataFrame({"b": [3.0, 1.0, 2.0, 4.0], "acc": [0.9, 0.5, 0.8, 0.7]})
    assert frontier_points(frame, "b", "acc")["b"].tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="'bytes'"):
        frontier_points(frame, "bytes", "acc")


def test_outcomes_and_time_to_accuracy_with_intervals() -> None:
    summaries, rows = [], []
    for seed in range(3):
        for method in ("dense", "gtopk"):
            run = f"{method}-s{seed}"
            summaries.append({"run_id": run, "method": method, "workers": 4, "density": 0.01, "seed": seed,
                              "source": "real", "status": "completed", "final_test_accuracy": 0.9,
                              "final_test_loss": 0.3, "final_train_loss": 0.2, "iterations": 30,
                              "bytes_sent_per_rank_per_iter": 1000.0 if method == "dense" else 50.0,
                              "virtual_time_s": 3.0, "network": "1GbE"})
            for i, it in enumerate((9, 19, 29)):
                # gtopk reaches 0.8 one evaluation later, and seed 2 of gtopk never does
                acc = [0.5, 0.85, 0.9][i] if method == "dense" else [0.3, 0.6, 0.82][i] if seed < 2 else 0.5
                rows.append({"run_id": run, "kind": "epoch", "rank": 0, "iteration": it, "epoch": (it + 1) / 10,
                             "test_accuracy": acc, "virtual_time_s": (it + 1) * (0.1 + 0.01 * seed)})
    summaries.append({"run_id": "broken", "method": "gtopk", "workers": 4, "status": "failed"})
    summaries, metrics = pd.DataFrame(summaries), pd.DataFrame(rows)
    outcomes = run_outcomes(summaries)
    assert len(outcomes) == 6 and set(outcomes.bytes_sent_per_rank) == {30_000.0, 1_500.0}
    assert outcomes.density[outcomes.method == "dense"].isna().all() and (outcomes.final_loss == 0.3).all()
    hits = time_to_accuracy(metrics, 0.8).set_index("run_id")
    assert hits.loc["dense-s1", "virtual_time_s"] == pytest.approx(20 * 0.11)
    assert hits.loc["dense-s1", "iteration"] == 19
    assert math.isnan(hits.loc["gtopk-s2", "virtual_time_s"])
    table = time_to_accuracy_table(summaries, metrics, 0.8).set_index("method")
    dense_times = [20 * (0.1 + 0.01 * s) for s in range(3)]
    low, high = stats.t.interval(0.95, 2, loc=statistics.fmean(dense_times),
                                 scale=statistics.stdev(dense_times) / math.sqrt(3))
    assert table.loc["dense", "time_ci_low"] == pytest.approx(low)
    assert table.loc["dense", "time_ci_high"] == pytest.approx(high)
    assert table.loc["gtopk", "reached"] == 2 and table.loc["gtopk", "n"] == 3
    with pytest.raises(ValueError, match="target=90"):
        time_to_accuracy(metrics, 90)
