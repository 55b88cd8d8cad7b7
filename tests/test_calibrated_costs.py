"""Calibrated per-rank costs on the virtual clock (issue 27 item 5): compute charged from a
calibration, merges as ``gamma * merged elements``, the summary saying so, and the study's
prediction counting a method's P = 1 merges once. Oracles: hand-computed clock arithmetic and
the alpha-beta(-gamma) time of a simulated gTop-k run written out here."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from gtopk_lab.analysis.study_tables import predicted_efficiency
from gtopk_lab.comm.stats import CollectiveResult, CommStats
from gtopk_lab.config import RunConfig
from gtopk_lab.methods import get_method
from gtopk_lab.network.clock import VirtualClock
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.config_options import ComputeOptions
from gtopk_lab.training.compute_charge import clock_merge_options, compute_time_fields
from gtopk_lab.training.simulator import simulate

pytestmark = pytest.mark.timeout(60)

NET = NetworkModel(latency_s=1e-4, bandwidth_bps=1e9)  # alpha 0.1 ms, beta 8 ns per byte


def _stats(merged: int, merge_cpu_s: float, steps: list[tuple[int, int]]) -> CommStats:
    return CommStats("test", "ring", steps=steps, rounds=len(steps), merged_elements=merged,
                     merge_cpu_s=merge_cpu_s)


def test_clock_charges_merges_from_the_calibrated_gamma_not_their_cpu_time() -> None:
    """Real-rank hook, world 1: charged compute 2 ms, one round of 1000 bytes (0.1 ms + 8 us),
    500 merged elements at 1 us = 0.5 ms; the measured 9 ms of merge CPU is not charged."""
    clock = VirtualClock(NET, include_merge_cpu=True, charged_compute=True, merge_gamma_s_per_element=1e-6)
    clock.charge(2e-3)
    result = CollectiveResult(None, None, _stats(500, 9e-3, [(1000, 1000)]))
    clock.collective(lambda: result)
    assert clock.synced_time_s == pytest.approx(2e-3 + 1e-4 + 8e-6 + 5e-4)
    assert clock.total_merge_cpu_s == pytest.approx(5e-4)


def test_simulated_ranks_wait_for_the_slowest_calibrated_merge() -> None:
    """P virtual ranks: max compute + max over ranks of (its rounds + gamma * its elements)."""
    clock = VirtualClock(NET, include_merge_cpu=True, merge_gamma_s_per_element=2e-6)
    stats = [_stats(100, 1.0, [(800, 800)]), _stats(300, 0.0, [(800, 0)])]
    clock.simulate_collective([1e-3, 1e-3], stats)
    assert clock.synced_time_s == pytest.approx(1e-3 + 1e-4 + 800 * 8e-9 + 300 * 2e-6)
    with pytest.raises(ValueError, match="merge_gamma_s_per_element"):
        VirtualClock(NET, merge_gamma_s_per_element=-1.0)


@pytest.mark.parametrize("merge_cpu, extra, fixed, want", [
    (True, {}, None, {"include_merge_cpu": True, "merge_gamma_s_per_element": None}),  # measured
    (True, {}, 0.01, {"include_merge_cpu": False, "merge_gamma_s_per_element": None}),  # fixed, no gamma
    (True, {"merge_gamma_s_per_element": 3e-7}, 0.01,
     {"include_merge_cpu": True, "merge_gamma_s_per_element": 3e-7}),  # calibrated
    (False, {"merge_gamma_s_per_element": 3e-7}, 0.01,
     {"include_merge_cpu": False, "merge_gamma_s_per_element": None}),  # the run said no merges
])
def test_merge_options(merge_cpu: bool, extra: dict, fixed: float | None, want: dict) -> None:
    assert clock_merge_options(merge_cpu, ComputeOptions(**extra), fixed) == want


def test_summary_fields_say_where_the_compute_came_from() -> None:
    calibration = {"calibration": "calibrated", "host": "h", "measured_at": "t", "repeats": 15}
    calibrated = compute_time_fields(ComputeOptions(compute_time_s=0.002, calibration=calibration,
                                                    merge_gamma_s_per_element=1e-7), 0.002, None)
    assert calibrated["compute_time_source"] == "calibrated"
    assert calibrated["compute_calibration"] == calibration and calibrated["merge_gamma_s_per_element"] == 1e-7
    assert compute_time_fields(ComputeOptions(), 0.002, None)["compute_time_source"] == "fixed"
    assert compute_time_fields(ComputeOptions(calibration=calibration), None, None)["compute_time_source"] == "measured"


def test_a_calibrated_simulated_gtopk_run_takes_the_alpha_beta_gamma_time() -> None:
    """gTop-k, butterfly, P = 4, exact k (no headers): per iteration a rank is charged
    c + s (compute and selection fixed) and then 2 rounds of 8k bytes each way plus 2 merges
    of 2k entries at gamma: T = iterations * (c + s + 2 (alpha + 8 k beta) + 4 k gamma)."""
    c, s, gamma = 0.01, 0.002, 1e-6
    extra = {"compute_time_s": c, "selection_time_s": s, "merge_gamma_s_per_element": gamma,
             "compute_calibration": {"calibration": "calibrated"}}
    config = RunConfig(method="gtopk", workers=4, model="mlp", dataset="synthetic", train_samples=256,
                       test_samples=32, batch_size=16, max_iterations=6, density=0.01, bandwidth="1Gbps",
                       latency="0.1ms", device="cpu", extra=extra)
    summary = simulate(config).summary
    k = summary["k"]
    per_iteration = c + s + 2 * (1e-4 + 8 * k * 8e-9) + 4 * k * gamma
    assert summary["virtual_time_s"] == pytest.approx(6 * per_iteration, rel=1e-9)
    assert summary["compute_time_source"] == "calibrated" and summary["merge_gamma_s_per_element"] == gamma
    assert summary["merge_cpu_s"] == pytest.approx(6 * 4 * k * gamma)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["oktopk", "powersgd", "sparseloco"])
def test_a_collectives_own_compression_is_charged_unless_a_fixed_selection_stands_for_it(method: str) -> None:
    """Ok-Topk selects by its thresholds inside its collective and PowerSGD projects there:
    with a fixed compute time and merges off, each iteration costs c + the step's measured
    selection + the modelled rounds + the ranks' median compression (measured, the summary's ``compress_cpu_s``); a method that
    selects and is given a fixed selection time is charged that instead (a calibrated one
    measures the collective's part too), its compression not again: PowerSGD, which pays
    a selection without selecting (``Method.compresses``), as Ok-Topk; SparseLoCo's 2-bit
    encoding of its own selection, in the iterations that synchronise (every second here)."""
    c, s, iterations = 0.01, 0.003, 6
    base = dict(method=method, workers=4, model="mlp", dataset="synthetic", train_samples=256, test_samples=32,
                batch_size=16, max_iterations=iterations, density=0.05, bandwidth="1Gbps", latency="0.1ms",
                device="cpu", virtual_merge_cpu=False,
                method_options={"sync_every": 2} if method == "sparseloco" else {})
    measured = simulate(RunConfig(**base, extra={"compute_time_s": c}), rows="rank0")
    rows = [r for r in measured.rows if r["kind"] == "iter"]
    assert measured.summary["compress_cpu_s"] > 0
    assert all(r["compute_s"] == c for r in rows)  # and the step's own (measured) selection
    assert measured.summary["virtual_time_s"] == pytest.approx(
        sum(c + r["selection_s"] + r["comm_model_s"] for r in rows) + measured.summary["compress_cpu_s"], rel=1e-9)
    syncs = [r["comm_model_s"] > 0 for r in rows]
    assert get_method(method).compresses and [r["selected"] for r in rows] == syncs
    assert sum(syncs) == (iterations // 2 if method == "sparseloco" else iterations)
    fixed = simulate(RunConfig(**base, extra={"compute_time_s": c, "selection_time_s": s}), rows="rank0")
    rows = [r for r in fixed.rows if r["kind"] == "iter"]
    assert fixed.summary["compress_cpu_s"] == 0 and [r["selection_s"] for r in rows] == [s if y else 0.0 for y in syncs]
    assert fixed.summary["virtual_time_s"] == pytest.approx(
        iterations * c + sum(syncs) * s + sum(r["comm_model_s"] for r in rows), rel=1e-9)
    assert fixed.summary["time_breakdown_s"]["selection_when_selected"] == pytest.approx(s, rel=1e-12)


def _point(method: str, workers: int, per_iteration_s: float, merge_per_iteration_s: float) -> dict:
    return {"method": method, "workers": workers, "density": 0.01, "algorithm": None, "bandwidth_bps": 1e9,
            "latency_s": 1e-4, "source": "real", "final": True, "batch_size": 32, "numel": 100_000,
            "iterations": 10, "samples_per_s_virtual": 32 * workers / per_iteration_s,
            "merge_cpu_s": 10 * merge_per_iteration_s, "virtual_merge_cpu": True}


def test_prediction_counts_the_p1_merges_once() -> None:
    """dense P=1: 2 ms; Top-k P=1: 2.3 ms of which 0.1 ms merges, so its own cost is 0.2 ms;
    at P = 4: 2 + 0.2 + allgather(P=4) + 0.4 ms of merges (before: 0.3 ms of own cost)."""
    points = pd.DataFrame([_point("dense", 1, 2e-3, 0.0), _point("topk", 1, 2.3e-3, 1e-4),
                           _point("topk", 4, 4e-3, 4e-4)])
    predicted = predicted_efficiency(points)
    at4 = predicted[(predicted.method == "topk") & (predicted.workers == 4)]["predicted"].iloc[0]
    comm = get_method("topk").predicted_time_s(NET, 100_000, 1000, 4)
    assert at4 == pytest.approx(2e-3 / (2e-3 + 2e-4 + comm + 4e-4))
    at1 = predicted[(predicted.method == "topk") & (predicted.workers == 1)]["predicted"].iloc[0]
    assert at1 == pytest.approx(2e-3 / 2.3e-3)  # its own merges count at P = 1 too


@pytest.mark.timeout(60)
def test_powersgd_is_predicted_from_the_layout_its_summary_keeps() -> None:
    """PowerSGD's traffic depends on the parameters' shapes: a run's summary keeps them and
    its options (``comm_formula``), the study's check and the report's model line price its
    points with them; a gTop-k summary's is empty. Runs without it get no prediction."""
    from gtopk_lab.analysis.predict import predict_scaling
    from gtopk_lab.plotting.report import predicted_scaling_table
    from gtopk_lab.training.models import build_model

    config = RunConfig(method="powersgd", workers=2, model="mlp", dataset="synthetic", train_samples=64,
                       test_samples=16, batch_size=16, max_iterations=1, method_options={"powersgd_rank": 2})
    formula = simulate(config).summary["comm_formula"]
    assert formula == {"layout": [list(p.shape) for p in build_model("mlp").parameters()], "rank": 2,
                       "min_compression_rate": 2.0}
    assert simulate(config.replace(method="gtopk")).summary["comm_formula"] == {}
    numel = sum(math.prod(s) for s in formula["layout"])
    comm = get_method("powersgd").predicted_time_s(NET, numel, 1, 4, **formula)
    assert comm > 0

    def point(workers: int, per_iteration_s: float, method: str = "powersgd", with_formula: bool = True) -> dict:
        return {**_point(method, workers, per_iteration_s, 0.0), "numel": numel,
                "comm_formula": formula if with_formula and method == "powersgd" else {}}

    points = pd.DataFrame([point(1, 2e-3, "dense"), point(1, 2.1e-3), point(4, 5e-3)])
    predicted = predicted_efficiency(points).set_index(["method", "workers"])["predicted"]
    # t_1 is dense S-SGD's P = 1 run alone: PowerSGD is dense-kind too, and its own P = 1 run
    # (2.1 ms) had been averaged into the baseline
    assert predicted["powersgd", 1] == pytest.approx(2e-3 / 2.1e-3)
    assert predicted["powersgd", 4] == pytest.approx(2e-3 / (2e-3 + 1e-4 + comm))
    assert ("powersgd", 4) not in predicted_efficiency(pd.DataFrame(
        [point(1, 2e-3, "dense"), point(4, 5e-3, with_formula=False)])).set_index(["method", "workers"]).index
    summaries = pd.DataFrame([{"method": m, "workers": p, "density": 0.01, "numel": numel, "bandwidth_bps": 1e9,
                               "latency_s": 1e-4, "status": "completed", "algorithm": None, "comm_formula": f,
                               "time_breakdown_s": {"compute": 2e-3, "update": 0.0, "selection": 0.0}}
                              for m, p, f in (("dense", 1, {}), ("powersgd", 4, formula))])
    line = predicted_scaling_table(summaries, workers=[4]).set_index("method")["scaling_efficiency"]
    assert line["powersgd"] == pytest.approx(predict_scaling(numel, 0.01, 2e-3, NET, [4], methods=[
        ("powersgd", "powersgd", None)], formulas={"powersgd": formula})[0]["scaling_efficiency"])
    assert line["powersgd"] == pytest.approx(2e-3 / (2e-3 + comm))


def test_merges_time_share_the_cores_the_ranks_get() -> None:
    """bench's abg with other jobs on the host: P = 4 butterfly ranks that get 0.5 cores
    between them stretch each of their 2 concurrent merges (2k entries at gamma) 8 times."""
    from gtopk_lab.analysis.predict import collective_time_s

    net, d, k, g = NetworkModel.from_strings("1Gbps"), 25_000_000, 25_000, 5e-8
    free = collective_time_s(net, "gtopk", d, k, 4, "butterfly", g)
    assert collective_time_s(net, "gtopk", d, k, 4, "butterfly", g, host_cores=0.5) == pytest.approx(
        free + 2 * (g * 2 * k) * (8 - 1))
    with pytest.raises(ValueError, match="host_cores"):
        collective_time_s(net, "gtopk", d, k, 4, "butterfly", g, host_cores=-1.0)


def _cores_rank(rank: int, world: int) -> float:
    from gtopk_lab.bench.timing import available_cores

    return available_cores(0.05)


@pytest.mark.timeout(120)
def test_available_cores_sums_the_shares_of_ranks_computing_at_once() -> None:
    """Two gloo ranks spin together: each gets at most one core, so the sum lies in (0, 2]
    and every rank reads the same sum."""
    from gtopk_lab.comm.launch import run_gloo

    shares = run_gloo(_cores_rank, 2, timeout_s=100)
    assert shares[0] == shares[1] and 0 < shares[0] <= 2.0
