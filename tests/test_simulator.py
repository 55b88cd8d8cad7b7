"""The simulator runs the same code as real ranks: same weights as a real gloo run."""

from __future__ import annotations

import gc
import math

import pytest
import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.comm.launch import run_gloo
from gtopk_lab.training.loop import gloo_rank_entry
from gtopk_lab.training.simulator import simulate


def _config(method: str, workers: int = 4, **kw) -> RunConfig:
    base = dict(method=method, workers=workers, model="mlp", dataset="mnist1d", train_samples=640,
                test_samples=100, batch_size=8, epochs=1, max_iterations=20, density=0.05, lr=0.05,
                momentum=0.9, bandwidth="1GbE", sink_every=5, extra={"return_weights": True})
    base.update(kw)
    return RunConfig(**base)


#: fixed compute and selection seconds a rank is charged per iteration (no CPU measured)
FIXED = {"compute_time_s": 0.05, "selection_time_s": 0.002}


def _configs() -> dict[str, RunConfig]:
    return {"dense": _config("dense"), "topk": _config("topk"), "gtopk": _config("gtopk"),
            "gtopk-fixed": _config("gtopk", max_iterations=6, extra=dict(FIXED)),
            "clt-k-fixed": _config("clt-k", max_iterations=6, extra=dict(FIXED))}


@pytest.fixture(scope="module")
def real_runs() -> dict[str, list]:
    """dense, topk, gtopk (and gtopk charged a fixed compute time) on one 4-rank gloo group
    (one process start for all the runs)."""
    from gtopk_lab.training.loop import gloo_runs_entry

    configs = _configs()
    per_rank = run_gloo(gloo_runs_entry, 4, [c.to_dict() for c in configs.values()], timeout_s=200)
    return {name: [per_rank[r][i] for r in range(4)] for i, name in enumerate(configs)}


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", ["dense", "topk", "gtopk"])
def test_simulator_matches_real_gloo_run(method: str, real_runs: dict) -> None:
    config = _config(method)
    real = real_runs[method]
    sim = simulate(config)
    for r in real[1:]:  # synchronous SGD: every real rank holds the same weights
        torch.testing.assert_close(r.final_weights, real[0].final_weights, rtol=0, atol=1e-6)
    torch.testing.assert_close(sim.final_weights, real[0].final_weights, rtol=1e-4, atol=1e-5)
    # same bytes per iteration and the same modelled communication, rank by rank
    real_iters = sorted((row["rank"], row["iteration"], row["bytes_sent"], row["comm_model_s"])
                        for r in real for row in r.rows if row["kind"] == "iter")
    sim_iters = sorted((row["rank"], row["iteration"], row["bytes_sent"], row["comm_model_s"])
                       for row in sim.rows if row["kind"] == "iter")
    assert [x[:3] for x in real_iters] == [x[:3] for x in sim_iters]
    assert all(math.isclose(a[3], b[3], rel_tol=1e-9) for a, b in zip(real_iters, sim_iters))
    assert sim.summary["simulated"] is True and sim.summary["iterations"] == 20


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_real_ranks_charged_a_fixed_compute_time_match_the_simulator_exactly(real_runs: dict) -> None:
    """extra["compute_time_s"] / ["selection_time_s"] on real ranks: every rank's clock is
    compute + selection + modelled communication per iteration, whatever the machine's load,
    so a real run's virtual time equals the simulated one's."""
    real = real_runs["gtopk-fixed"]
    sim = simulate(_configs()["gtopk-fixed"])
    for r in real:
        iters = [row for row in r.rows if row["kind"] == "iter"]
        assert len(iters) == 6
        assert all(row["compute_s"] == 0.05 and row["selection_s"] == 0.002 for row in iters)
        assert r.summary["compute_time_source"] == "fixed" and r.summary["fixed_compute_time_s"] == 0.05
        assert r.summary["virtual_time_s"] == pytest.approx(
            sum(0.05 + 0.002 + row["comm_model_s"] for row in iters), rel=1e-9)
        assert r.summary["virtual_time_s"] == pytest.approx(sim.summary["virtual_time_s"], rel=1e-9)
    assert real_runs["gtopk"][0].summary["compute_time_source"] == "measured"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cltk_leaders_selection_is_charged_on_real_ranks_and_in_the_simulator(real_runs: dict) -> None:
    """CLT-k selects on one rank per iteration, the leader ``it mod P``: that rank is charged
    the selection, the others none, and the collective waits for it, so every rank's virtual
    time is compute + selection + communication per iteration, as for a method whose ranks
    all select; real gloo ranks and the simulator agree."""
    real = real_runs["clt-k-fixed"]
    sim = simulate(_configs()["clt-k-fixed"], rows="all")
    sim_rows = [row for row in sim.rows if row["kind"] == "iter"]
    for rows in ([row for r in real for row in r.rows if row["kind"] == "iter"], sim_rows):
        assert len(rows) == 4 * 6
        for row in rows:
            leader = row["iteration"] % 4
            assert row["compute_s"] == 0.05 and row["selection_s"] == (0.002 if row["rank"] == leader else 0.0)
            assert row["selected"] is (row["rank"] == leader)
    # rank 0 leads iterations 0 and 4 of 6: its mean selection is a third of what one waits for
    for summary in (real[0].summary, sim.summary):
        assert summary["time_breakdown_s"]["selection_when_selected"] == pytest.approx(0.002, rel=1e-12)
        assert summary["time_breakdown_s"]["selection"] == pytest.approx(0.002 * 2 / 6, rel=1e-12)
    for r in real:
        iters = [row for row in r.rows if row["kind"] == "iter"]
        assert r.summary["virtual_time_s"] == pytest.approx(
            sum(0.05 + 0.002 + row["comm_model_s"] for row in iters), rel=1e-9)
        assert r.summary["virtual_time_s"] == pytest.approx(sim.summary["virtual_time_s"], rel=1e-9)
    torch.testing.assert_close(sim.final_weights, real[0].final_weights, rtol=1e-4, atol=1e-5)


@pytest.mark.timeout(60)
def test_simulator_many_virtual_ranks_rows_and_virtual_time() -> None:
    sink_batches: list[list[dict]] = []
    config = _config("gtopk", workers=64, dataset="synthetic", train_samples=64 * 8,
                     epochs=3, max_iterations=3, sink_every=2)
    result = simulate(config, sink=sink_batches.append)
    iters = [r for r in result.rows if r["kind"] == "iter"]
    assert {r["rank"] for r in iters} == {0}  # P > 32: rank 0 only by default
    assert [r["iteration"] for r in iters] == [0, 1, 2]
    assert sum(len(b) for b in sink_batches) == len(result.rows)
    times = [r["virtual_time_s"] for r in iters]
    assert all(b > a for a, b in zip(times, times[1:]))
    # butterfly over 64 ranks: log2(64) = 6 rounds, each at least one latency on 1GbE
    assert all(r["comm_model_s"] >= 6 * 0.436e-3 for r in iters)
    assert result.summary["workers"] == 64 and result.summary["k"] == iters[0]["k"]


@pytest.mark.timeout(60)
def test_simulator_all_rows_and_residual_rule_paper() -> None:
    config = _config("gtopk", workers=4, max_iterations=2, residual_rule="paper", algorithm="tree")
    result = simulate(config, rows="all")
    assert {r["rank"] for r in result.rows if r["kind"] == "iter"} == {0, 1, 2, 3}
    epoch_rows = [r for r in result.rows if r["kind"] == "epoch"]
    assert not math.isnan(epoch_rows[0]["test_accuracy"])
    assert all(math.isnan(r["test_accuracy"]) for r in epoch_rows[1:])


@pytest.mark.timeout(60)
def test_the_setups_objects_are_frozen_for_the_run_only() -> None:
    """The collector's full passes skip the setup's objects while the ranks iterate (a P = 1024
    iteration spent a third of its time in them), and what the first iteration made once it
    ends; the run unfreezes them when it ends, also when it fails, so the process's collector
    is as it was."""
    assert gc.get_freeze_count() == 0
    during: list[int] = []
    simulate(_config("gtopk", max_iterations=3, sink_every=1), sink=lambda rows: during.append(gc.get_freeze_count()))
    assert during and min(during) > 0
    assert during[1] > during[0]  # frozen again after the first iteration (its imports and kernels)
    assert gc.get_freeze_count() == 0

    def fail(_rows: list) -> None:
        raise RuntimeError("sink failed")

    with pytest.raises(RuntimeError, match="sink failed"):
        simulate(_config("gtopk", max_iterations=3, sink_every=1), sink=fail)
    assert gc.get_freeze_count() == 0


def test_simulator_rejects_bad_rows_argument() -> None:
    with pytest.raises(ValueError, match="rows="):
        simulate(_config("dense"), rows="some")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("algorithm", ["butterfly", "tree"])
def test_density_one_sparse_methods_reproduce_dense(algorithm: str) -> None:
    """rho = 1: Top-k and gTop-k select everything, so the run must be dense S-SGD (to rounding),
    with momentum, weight decay and LR warm-up all on (they act on G / P in the same way)."""
    kw = dict(workers=3, density=1.0, max_iterations=12, weight_decay=1e-3, lr_warmup_epochs=1.0,
              algorithm=algorithm)
    dense = simulate(_config("dense", **kw), rows="rank0").final_weights
    for method in ("topk", "gtopk"):
        sparse = simulate(_config(method, **kw), rows="rank0").final_weights
        torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("batched", ["off", "on"])
def test_mass_rule_conserves_gradient_mass_every_iteration(monkeypatch: pytest.MonkeyPatch, batched: str) -> None:
    """Mass rule: sum_i residual_i + G == sum_i acc_i after every iteration (nothing lost or
    counted twice), also with P not a power of two and the density warm-up changing k; on
    the per-rank steps and on the batched ones (BatchedSteps' one memory update)."""
    from gtopk_lab.training.batched_step import BatchedSteps
    from gtopk_lab.training.step import RankStep, aggregate_dense

    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    errors: list[float] = []
    finish, update_memories = RankStep.finish, BatchedSteps.update_memories

    def check() -> None:
        acc_sum = sum(a for a, _, _ in seen)
        kept = sum(r for _, r, _ in seen) + seen[0][2]
        errors.append(float((kept - acc_sum).abs().max() / acc_sum.abs().max()))
        seen.clear()

    def checked(step, local, result) -> None:
        finish(step, local, result)
        seen.append((local.acc.clone(), step.memory.residual.clone(),
                     aggregate_dense(result, local.acc.numel(), local.acc.device)))
        if len(seen) == 3:
            check()

    def checked_batched(steps, round_, results) -> None:
        update_memories(steps, round_, results)
        for step, local, result in zip(steps.steps, round_.contributions, results):
            seen.append((local.acc.clone(), step.memory.residual.clone(),
                         aggregate_dense(result, local.acc.numel(), local.acc.device)))
        check()

    monkeypatch.setattr(RankStep, "finish", checked)
    monkeypatch.setattr(BatchedSteps, "update_memories", checked_batched)
    config = _config("gtopk", workers=3, density=0.01, density_warmup=(0.05, 1), max_iterations=30, epochs=3,
                     train_samples=3 * 8 * 10, simulator={"batched": batched})
    assert simulate(config, rows="rank0").summary["batched_steps"] is (batched == "on")
    assert len(errors) == 30 and max(errors) < 1e-5


@pytest.mark.timeout(60)
def test_fixed_compute_time_makes_virtual_time_exact() -> None:
    """With fixed compute and selection times the virtual clock is compute + selection +
    modelled communication per iteration, identical across repeats (no CPU noise)."""
    fixed = {"compute_time_s": 0.1, "selection_time_s": 0.01}
    runs = [simulate(_config("gtopk", workers=8, dataset="synthetic", train_samples=8 * 8,
                             max_iterations=3, epochs=3, extra=dict(fixed)), rows="rank0")
            for _ in range(2)]
    for run in runs:
        iters = [r for r in run.rows if r["kind"] == "iter"]
        expected = sum(0.1 + 0.01 + r["comm_model_s"] for r in iters)
        assert run.summary["virtual_time_s"] == pytest.approx(expected, rel=1e-12)
        assert all(r["compute_s"] == 0.1 and r["selection_s"] == 0.01 for r in iters)
        assert run.summary["compute_time_source"] == "fixed"
    assert runs[0].summary["virtual_time_s"] == runs[1].summary["virtual_time_s"]
    # dense is charged no selection; the keyword overrides config.extra
    dense = simulate(_config("dense", workers=2, max_iterations=2, extra={"compute_time_s": 5.0}),
                     rows="rank0", compute_time_s=0.2)
    iters = [r for r in dense.rows if r["kind"] == "iter"]
    assert dense.summary["virtual_time_s"] == pytest.approx(sum(0.2 + r["comm_model_s"] for r in iters))
    assert simulate(_config("dense", workers=1, max_iterations=1),
                    rows="rank0").summary["compute_time_source"] == "measured"


def test_fixed_compute_time_bad_values() -> None:
    with pytest.raises(ValueError, match="compute_time_s=-1.0 is invalid"):
        simulate(_config("dense"), compute_time_s=-1.0)
    with pytest.raises(TypeError, match="compute_time_s='fast'"):
        simulate(_config("dense", extra={"compute_time_s": "fast"}))
    with pytest.raises(ValueError, match="selection_time_s=0.1 is invalid without compute_time_s"):
        simulate(_config("topk"), selection_time_s=0.1)
