"""Repricing a recorded run on another network (gtopk_lab.analysis.reprice) and the
method-comparison table and figures built on it.

The oracle of a repriced run is the same run recorded on the other network: with a fixed
compute time the simulator's virtual clock depends on the network only through the
collectives' rounds and bytes, so both must agree row by row.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from gtopk_lab.analysis.reprice import (auto_target_loss, method_comparison, reprice_metrics,
                                        reprice_summaries, time_to_target_s)
from gtopk_lab.analysis.study_tables import predicted_efficiency
from gtopk_lab.config import RunConfig
from gtopk_lab.network.model import network_model
from gtopk_lab.training.simulator import simulate

NETWORKS = ("1GbE", "10GbE")
#: (method, extra config) of the runs: an asymmetric schedule (tree: rank 0 takes twice the
#: rounds), a local-steps method (a sync every 3 iterations) and the ring allreduce
CASES = (("gtopk", {"algorithm": "tree"}), ("diloco", {"extra": {"sync_every": 3}}), ("dense", {}))


def _run(method: str, changes: dict, bandwidth: str) -> tuple[pd.DataFrame, dict]:
    extra = {"compute_time_s": 0.01, "selection_time_s": 0.0, **changes.get("extra", {})}
    config = RunConfig(method=method, workers=4, density=0.01, model="mlp", dataset="mnist1d",
                       train_samples=256, test_samples=64, epochs=3, batch_size=32, bandwidth=bandwidth,
                       seed=0, **{k: v for k, v in changes.items() if k != "extra"}, extra=extra)
    result = simulate(config, rows="all")
    run_id = f"{method}-{bandwidth}"
    return pd.DataFrame(result.rows).assign(run_id=run_id), {**result.summary, "run_id": run_id}


@pytest.fixture(scope="module")
def recorded() -> dict[tuple[str, str], tuple[pd.DataFrame, dict]]:
    runs = {(m, bw): _run(m, changes, bw) for m, changes in CASES for bw in NETWORKS}
    runs[("dense", "none")] = _run("dense", {}, "none")  # the unthrottled branch
    return runs


@pytest.mark.timeout(120)
def test_repriced_run_equals_the_run_on_that_network(recorded) -> None:
    for method, _ in CASES:
        rows, summary = recorded[(method, "1GbE")]
        for target in NETWORKS[1:] + (("none",) if method == "dense" else ()):
            truth, truth_summary = recorded[(method, target)]
            again = reprice_metrics(rows, target)
            assert again["virtual_time_s"].tolist() == pytest.approx(truth["virtual_time_s"].tolist(),
                                                                       rel=1e-12, abs=1e-15), (method, target)
            iters = again["kind"] == "iter"
            assert again.loc[iters, "comm_model_s"].tolist() == pytest.approx(
                truth.loc[iters, "comm_model_s"].tolist(), rel=1e-12, abs=1e-15)
            priced = reprice_summaries(pd.DataFrame([summary]), rows, target).iloc[0]
            assert priced["samples_per_s_virtual"] == pytest.approx(truth_summary["samples_per_s_virtual"], rel=1e-9)
            assert priced["virtual_time_s"] == pytest.approx(truth_summary["virtual_time_s"], rel=1e-9)
            net = network_model(target)
            assert priced["latency_s"] == (0.0 if net.unthrottled else net.latency_s)
        # back to its own network: nothing moves
        same = reprice_metrics(rows, "1GbE")
        assert same["virtual_time_s"].tolist() == pytest.approx(rows["virtual_time_s"].tolist(), rel=1e-12)
    # the recorded steps themselves, against the ring formula: 2(P-1) rounds of d/P floats
    dense = recorded[("dense", "1GbE")][0]
    first = dense[(dense["kind"] == "iter")].iloc[0]
    numel = recorded[("dense", "1GbE")][1]["numel"]
    assert first["comm_rounds"] == 2 * 3 and first["comm_wire_bytes"] == 2 * 3 * numel * 4 // 4
    tree = recorded[("gtopk", "1GbE")][0]
    rounds = tree[(tree["kind"] == "iter") & (tree["iteration"] == 0)].set_index("rank")["comm_rounds"]
    assert rounds[0] == 2 * rounds[1]  # rank 0 receives up the tree and sends down it


@pytest.mark.timeout(120)
def test_time_to_target_and_the_comparison_table(recorded) -> None:
    rows, summary = recorded[("gtopk", "1GbE")]
    # oracle: mean over ranks per iteration, trailing mean of 3, first crossing
    per = rows[rows["kind"] == "iter"].groupby("iteration").agg(loss=("train_loss", "mean"),
                                                                t=("virtual_time_s", "max"))
    losses, times = per["loss"].tolist(), per["t"].tolist()
    target = sorted(losses)[len(losses) // 2]
    expected = math.nan
    for i in range(len(losses)):
        window = losses[max(0, i - 2):i + 1]
        if sum(window) / len(window) <= target:
            expected = times[i]
            break
    got = time_to_target_s(rows, target, window=3)
    assert got[summary["run_id"]] == pytest.approx(expected) if not math.isnan(expected) else math.isnan(got.iloc[0])
    assert math.isnan(time_to_target_s(rows, -1.0).iloc[0])  # never reached
    assert time_to_target_s(rows, 1e9, window=1).iloc[0] == pytest.approx(times[0])

    metrics = pd.concat([recorded[(m, "1GbE")][0] for m, _ in CASES], ignore_index=True)
    one = _run_p1()
    metrics = pd.concat([metrics, one[0]], ignore_index=True)
    summaries = pd.DataFrame([recorded[(m, "1GbE")][1] for m, _ in CASES] + [one[1]]).assign(status="completed")
    dense_final = (metrics[(metrics["run_id"] == "dense-1GbE") & (metrics["kind"] == "iter")]
                   .groupby("iteration")["train_loss"].mean().tail(5).mean())
    assert auto_target_loss(metrics, summaries) == pytest.approx(dense_final * 1.05)
    table = method_comparison(summaries, metrics, ["1GbE", "10GbE"], target_loss=1e9, window=1)
    assert set(table["network"]) == {"1GbE", "10GbE"} and len(table) == 2 * 4
    p1 = table[table["workers"] == 1]
    assert p1["efficiency"].tolist() == pytest.approx([1.0, 1.0])
    fast = table[(table["network"] == "10GbE") & (table["method"] == "dense") & (table["workers"] == 4)].iloc[0]
    slow = table[(table["network"] == "1GbE") & (table["method"] == "dense") & (table["workers"] == 4)].iloc[0]
    assert fast["efficiency"] > slow["efficiency"]
    truth = recorded[("dense", "10GbE")][1]
    assert fast["efficiency"] == pytest.approx(truth["samples_per_s_virtual"] / (4 * one[1]["samples_per_s_virtual"]))
    assert fast["bytes_per_rank_per_iter"] == truth["bytes_sent_per_rank_per_iter"]
    assert fast["final_loss"] == truth["final_test_loss"]

    from gtopk_lab.plotting.figures import loss_vs_time_figure, time_to_target_figure

    reached = method_comparison(summaries, metrics, ["1GbE", "10GbE"], target_loss=-1.0)
    fig = time_to_target_figure(reached, target_loss=-1.0)
    assert "not reached: " in fig.layout.annotations[0].text and len(fig.data) == 2 * 2  # 2 P x 2 networks
    lines = loss_vs_time_figure(reprice_metrics(metrics, "10GbE"), workers=4, target_loss=2.0)
    assert sorted(t.name for t in lines.data) == sorted(m for m, _ in CASES)


def _run_p1() -> tuple[pd.DataFrame, dict]:
    config = RunConfig(method="dense", workers=1, model="mlp", dataset="mnist1d", train_samples=256,
                       test_samples=64, epochs=3, batch_size=32, bandwidth="1GbE", seed=0,
                       extra={"compute_time_s": 0.01, "selection_time_s": 0.0})
    result = simulate(config, rows="all")
    return pd.DataFrame(result.rows).assign(run_id="dense-p1"), {**result.summary, "run_id": "dense-p1"}


@pytest.mark.timeout(30)
def test_bad_input_and_the_prediction_of_local_steps() -> None:
    rows = pd.DataFrame([{"run_id": "a", "kind": "iter", "rank": 0, "iteration": 0, "train_loss": 1.0,
                          "virtual_time_s": 1.0, "comm_model_s": 0.1}])
    with pytest.raises(ValueError, match="comm_rounds"):
        reprice_metrics(rows, "1GbE")
    with pytest.raises(TypeError, match="network has type int"):
        reprice_metrics(rows, 10)
    with pytest.raises(ValueError, match="window=0 is invalid"):
        time_to_target_s(rows, 1.0, window=0)
    # the alpha-beta prediction charges a local-steps method 1/H of its sync per iteration
    # and leaves out PowerSGD, whose formula needs the parameter layout
    base = dict(status="completed", final=True, bandwidth_bps=network_model("1GbE").bandwidth_bps,
                latency_s=network_model("1GbE").latency_s, batch_size=32, numel=100_000, density=0.01,
                source="simulated", seed=0, algorithm=None)
    points = pd.DataFrame([{**base, "method": "dense", "workers": 1, "samples_per_s_virtual": 3200.0},
                           {**base, "method": "diloco", "workers": 4, "samples_per_s_virtual": 3200.0,
                            "sync_every": 8},
                           {**base, "method": "powersgd", "workers": 4, "samples_per_s_virtual": 3200.0}])
    predicted = predicted_efficiency(points)
    predicted = predicted[predicted["workers"] == 4]
    assert list(predicted["method"]) == ["diloco"]
    net = network_model("1GbE")
    ring_s = 2 * 3 * net.latency_s + 2 * 3 / 4 * 100_000 * 4 * net.beta_s_per_byte
    assert predicted["predicted"].iloc[0] == pytest.approx(0.01 / (0.01 + ring_s / 8), rel=1e-6)


@pytest.mark.timeout(30)
def test_comparison_pivot_keeps_every_method_and_both_baselines() -> None:
    """The notebook's time-to-target table: a method that never reaches the target keeps its
    row (pivot_table dropped it), the real and the simulated dense P = 1 stay apart (pivot_table
    averaged them into one number neither clock measured), nonexistent (P, source) pairs add
    no column."""
    from gtopk_lab.analysis.reprice import comparison_pivot

    nan = math.nan
    table = pd.DataFrame({
        "network": ["1GbE"] * 5 + ["10GbE"] * 5,
        "method": ["dense", "dense", "dense", "dense", "gtopk"] * 2,
        "workers": [1, 1, 4, 16, 16] * 2,
        "source": ["real", "simulated", "real", "simulated", "simulated"] * 2,
        "time_to_target_s": [1.0, 2.0, 3.0, 4.0, nan, 0.5, 1.5, 2.5, 3.5, nan]})
    wide = comparison_pivot(table)
    assert wide.index.tolist() == ["dense", "gtopk"]
    assert wide.columns.tolist() == [(net, p, src) for net in ("1GbE", "10GbE")
                                     for p, src in ((1, "real"), (1, "simulated"), (4, "real"), (16, "simulated"))]
    assert wide.loc["dense", ("1GbE", 1, "real")] == 1.0 and wide.loc["dense", ("1GbE", 1, "simulated")] == 2.0
    assert wide.loc["gtopk"].isna().all()
    assert comparison_pivot(table, "workers").loc["dense", ("10GbE", 16, "simulated")] == 16
    with pytest.raises(ValueError, match="twice"):
        comparison_pivot(pd.concat([table, table.iloc[:1]]))
    with pytest.raises(ValueError, match="lacks source"):
        comparison_pivot(table.drop(columns="source"))


@pytest.mark.timeout(120)
def test_rank0_rows_reprice_like_every_rank_when_rank0_is_not_the_slowest() -> None:
    """CLT-k's leader moves, so rank 0 is often not the broadcast's root: with rank 0's rows
    only (the simulator above 32 ranks) repricing used rank 0's rounds and moved the run even
    on its own network (1.3% at P = 64 in notebook 05); the rows' peak pair fixes it."""
    from gtopk_lab.training.rows import peak_comm_pair

    def run(rows: str, bandwidth: str = "1GbE") -> pd.DataFrame:
        config = RunConfig(method="clt-k", workers=4, density=0.01, model="mlp", dataset="mnist1d",
                           train_samples=256, test_samples=64, epochs=1, batch_size=32, bandwidth=bandwidth,
                           seed=0, extra={"compute_time_s": 0.01, "selection_time_s": 0.0})
        return pd.DataFrame(simulate(config, rows=rows).rows).assign(run_id="cltk")

    every, only, truth = run("all"), run("rank0"), run("all", "10GbE")
    per = every[every["kind"] == "iter"].groupby("iteration")["comm_rounds"]
    assert (per.max() > per.min()).any()  # asymmetric: some rank takes more rounds than another
    assert set(only["rank"]) == {0} and "comm_peak_rounds" in only and "comm_peak_wire_bytes" not in every
    it0 = only["kind"] == "iter"
    assert (only.loc[it0, "comm_peak_rounds"].to_numpy() == per.max().to_numpy()).all()
    assert (only.loc[it0, "comm_peak_rounds"] > only.loc[it0, "comm_rounds"]).any()  # rank 0 not the root
    same = reprice_metrics(only, "1GbE")
    assert same["virtual_time_s"].tolist() == pytest.approx(only["virtual_time_s"].tolist(), rel=1e-12)
    faster = reprice_metrics(only, "10GbE")
    expected = truth[truth["rank"] == 0]["virtual_time_s"].tolist()
    assert faster["virtual_time_s"].tolist() == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert peak_comm_pair([]) == (0, 0)
