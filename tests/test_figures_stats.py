"""Figures that carry statistics: confidence-interval bars and bands with two or more seeds
(none with one), the time-to-accuracy figure and the Pareto figures with their frontier.
Oracles: scipy's t interval and a brute-force dominance check, computed here."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from gtopk_lab.analysis.outcomes import run_outcomes, time_to_accuracy_table
from gtopk_lab.plotting import figures
from gtopk_lab.plotting.live_study import convergence_study_figure, scaling_study_figure
from test_figures import synthetic_run

pytestmark = pytest.mark.timeout(60)


def _t_half(values: list[float]) -> float:
    n = len(values)
    low, high = stats.t.interval(0.95, n - 1, loc=np.mean(values), scale=np.std(values, ddof=1) / math.sqrt(n))
    return (high - low) / 2


def _seeded_metrics(seeds: int) -> pd.DataFrame:
    rows = []
    for seed in range(seeds):
        for method in ("dense", "gtopk"):
            r, _ = synthetic_run(f"{method}-s{seed}", method, 2, 0.01, seed=seed)
            rows += [dict(x, seed=seed, source="real") for x in r]
    return pd.DataFrame(rows)


def test_convergence_figure_band_is_the_t_interval_over_seeds() -> None:
    metrics = _seeded_metrics(3)
    fig = figures.convergence_figure(metrics)
    lines = [t for t in fig.data if t.mode == "lines" and t.showlegend]
    assert [t.name for t in lines] == ["dense P=2 (3 seeds)", "gtopk ρ=0.01 P=2 (3 seeds)"]
    bands = [t for t in fig.data if t.fill == "toself"]
    assert len(bands) == 4  # train and test band per point
    # oracle at iteration 5 of dense: the rank-mean loss of each seed, then scipy's interval
    it = metrics[(metrics.kind == "iter") & (metrics.method == "dense") & (metrics.iteration == 5)]
    per_seed = it.groupby("seed")["train_loss"].mean().tolist()
    band = bands[0]
    n = len(band.x) // 2
    upper, lower = band.y[:n], band.y[n:][::-1]
    assert upper[5] - lower[5] == pytest.approx(2 * _t_half(per_seed))
    assert "95% Student-t confidence interval" in fig.layout.title.text
    # one seed: every run its own line, no band; seeds=False: runs even with seeds
    single = figures.convergence_figure(_seeded_metrics(1))
    assert not [t for t in single.data if t.fill == "toself"] and len(single.data) == 4
    assert len(figures.convergence_figure(metrics, seeds=False).data) == 12
    with pytest.raises(ValueError, match="seeds=True"):
        figures.convergence_figure(metrics.drop(columns="seed"), seeds=True)


def test_scaling_efficiency_figure_averages_seeds_with_intervals() -> None:
    measured = pd.DataFrame({"method": ["gtopk"] * 6, "workers": [2, 2, 2, 4, 4, 4],
                             "scaling_efficiency": [0.9, 0.92, 0.95, 0.8, 0.83, 0.84]})
    fig = figures.scaling_efficiency_figure(measured, paper_models=())
    trace = fig.data[0]
    assert list(trace.x) == [2, 4] and trace.y[0] == pytest.approx(np.mean([0.9, 0.92, 0.95]))
    assert trace.error_y.array[1] == pytest.approx(_t_half([0.8, 0.83, 0.84]))
    one = figures.scaling_efficiency_figure(measured.drop_duplicates("workers"), paper_models=())
    assert one.data[0].error_y.array is None  # one value per P: no bars


def test_live_study_figures_draw_intervals_with_two_seeds() -> None:
    points = []
    for seed in range(2):
        for method, p, speed in (("dense", 1, 100.0), ("dense", 4, 200.0 + 20 * seed), ("gtopk", 4, 300.0 + 40 * seed)):
            points.append({"method": method, "workers": p, "density": 0.01 if method == "gtopk" else 1.0, "seed": seed,
                           "source": "real", "final": True, "run_id": f"{method}{p}{seed}", "status": "completed",
                           "samples_per_s_virtual": speed, "bandwidth_bps": 1e9, "latency_s": 1e-4})
    fig = scaling_study_figure(pd.DataFrame(points))
    gtopk = next(t for t in fig.data if t.name == "gtopk")
    assert gtopk.error_y.visible and gtopk.error_y.array[0] == pytest.approx(100 * _t_half([300 / 400, 340 / 400]))
    assert "95% CI over seeds" in fig.layout.title.text
    conv = convergence_study_figure(_seeded_metrics(2))
    assert [t for t in conv.data if t.fill == "toself"] and "Student-t" in conv.layout.title.text
    assert "one seed" in convergence_study_figure(_seeded_metrics(1)).layout.title.text


def _runs(seeds: int = 2) -> tuple[pd.DataFrame, pd.DataFrame]:
    summaries, rows = [], []
    for seed in range(seeds):
        for method, density in (("dense", 1.0), ("topk", 0.01), ("gtopk", 0.01)):
            for workers in (2, 4):
                run = f"{method}-p{workers}-s{seed}"
                r, s = synthetic_run(run, method, workers, density, seed=seed)
                # a seed-dependent pace, so that the time to accuracy has a spread
                for x in r:
                    x["virtual_time_s"] *= 1 + 0.1 * seed
                s.update(seed=seed, source="real", network="1GbE",
                         final_test_accuracy=s["final_test_accuracy"] - 0.01 * workers * (method == "topk"))
                summaries.append(s)
                rows += r
    return pd.DataFrame(summaries), pd.DataFrame(rows)


def test_time_to_accuracy_figure_has_interval_bars() -> None:
    summaries, metrics = _runs()
    table = time_to_accuracy_table(summaries, metrics, 0.8)
    fig = figures.time_to_accuracy_figure(table)
    dense = next(t for t in fig.data if t.name == "dense")
    per_seed = [metrics[(metrics.run_id == f"dense-p2-s{s}") & (metrics.kind == "epoch")
                        & (metrics.test_accuracy >= 0.8)].virtual_time_s.min() for s in range(2)]
    assert dense.y[0] == pytest.approx(np.mean(per_seed))
    assert dense.error_y.array[0] == pytest.approx(_t_half(per_seed))
    assert "Time to 80% test accuracy" in fig.layout.title.text
    never = figures.time_to_accuracy_figure(time_to_accuracy_table(summaries, metrics, 0.99))
    assert not never.data and "not reached: dense P=2" in never.layout.title.text


@pytest.mark.parametrize("x", ["bytes_sent_per_rank", "virtual_time_s"])
@pytest.mark.parametrize("y", ["final_test_accuracy", "final_loss"])
def test_pareto_figure_one_point_per_run_and_the_frontier(x: str, y: str) -> None:
    summaries, _ = _runs()
    summaries["final_test_loss"] = 1.0 - summaries["final_test_accuracy"] + 0.001 * np.arange(len(summaries))
    outcomes = run_outcomes(summaries)
    fig = figures.pareto_figure(outcomes, x=x, y=y)
    points = [t for t in fig.data if t.mode == "markers"]
    assert sum(len(t.x) for t in points) == len(outcomes) == 12
    frontier = next(t for t in fig.data if t.name == "Pareto frontier")
    assert frontier.line.shape == "hv"
    # brute force: a run is on the frontier iff no run is as good on both and better on one
    xs, ys = outcomes[x].to_numpy(float), outcomes[y].to_numpy(float)
    better = (lambda a, b: a > b) if y == "final_test_accuracy" else (lambda a, b: a < b)
    on = [i for i in range(len(xs)) if not any(
        xs[j] <= xs[i] and (better(ys[j], ys[i]) or ys[j] == ys[i]) and (xs[j] < xs[i] or better(ys[j], ys[i]))
        for j in range(len(xs)))]
    assert sorted(zip(frontier.x, frontier.y)) == sorted(zip(xs[on], ys[on]))
    with pytest.raises(ValueError, match="x='bytes' is invalid"):
        figures.pareto_figure(outcomes, x="bytes")
