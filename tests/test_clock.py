"""VirtualClock: world size 1, simulator hook, throttling and synchronised virtual time on gloo."""

from __future__ import annotations

import pickle
import time

import pytest
import torch

from gtopk_lab.analysis.predict import collective_time_s
from gtopk_lab.collectives import CollectiveResult, CommStats, gtopk_allreduce
from gtopk_lab.comm.inprocess import sim_gtopk_allreduce
from gtopk_lab.network.clock import VirtualClock
from gtopk_lab.network.model import NetworkModel


def _burn_cpu_s(seconds: float) -> float:
    """Real compute (matrix products) for about ``seconds`` of CPU time; returns CPU used."""
    a = torch.randn(96, 96)
    start = time.process_time()
    while time.process_time() - start < seconds:
        a = torch.tanh(a @ a)
    return time.process_time() - start


def _sparse(rank: int, numel: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7 + rank)
    idx = torch.randperm(numel, generator=gen)[:k].sort().values.to(torch.int32)
    return torch.randn(k, generator=gen), idx


# --- single process --------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_world_size_one_counts_cpu_compute_and_no_comm() -> None:
    clock = VirtualClock(NetworkModel.from_strings("1Gbps"))
    used = _burn_cpu_s(0.05)
    vals, idx = _sparse(0, 10_000, 100)
    # no process group: the clock runs alone; the collective is the in-process one (P = 1)
    result = clock.collective(lambda: sim_gtopk_allreduce([vals], [idx], 10_000, 100)[0])
    assert isinstance(result, CollectiveResult)
    assert clock.last_comm_model_s == 0.0  # P = 1: no rounds
    assert clock.synced_time_s == pytest.approx(used, rel=0.2, abs=0.01)
    with clock.paused():
        _burn_cpu_s(0.05)
    assert clock.virtual_time_s - clock.synced_time_s < 0.03
    clock.advance(1.0)
    assert clock.synced_time_s >= 1.0
    clock.reset()
    assert clock.synced_time_s == 0.0 and clock.collectives == 0
    assert pickle.loads(pickle.dumps(clock)).network == clock.network


def test_simulator_hook_takes_max_compute_plus_max_model() -> None:
    net = NetworkModel(latency_s=1e-3, bandwidth_bps=8e6)  # beta = 1 us/byte
    clock = VirtualClock(net)
    stats = [CommStats("gtopk_allreduce", "butterfly", steps=[(1000, 1000)]),
             CommStats("gtopk_allreduce", "butterfly", steps=[(1000, 1000), (0, 3000)])]
    t = clock.simulate_collective([0.010, 0.030], stats)
    assert t == pytest.approx(0.030 + (2e-3 + 1e-3 + 3e-3))
    assert clock.last_comm_model_s == pytest.approx(6e-3)
    t2 = clock.simulate_collective([0.0, 0.0], [[(1000, 0)], []])  # plain steps lists work too
    assert t2 == pytest.approx(t + 2e-3)
    assert clock.total_comm_model_s == pytest.approx(8e-3)
    with pytest.raises(ValueError, match="compute_s"):
        clock.simulate_collective([0.1], stats)
    # with the simulator's own collectives: P = 6 virtual ranks (fold/unfold) == closed form
    numel, k = 50_000, 500
    pairs = [_sparse(r, numel, k) for r in range(6)]
    results = sim_gtopk_allreduce([v for v, _ in pairs], [i for _, i in pairs], numel, k, "butterfly")
    before = clock.synced_time_s
    after = clock.simulate_collective([0.0] * 6, results)
    assert after - before == pytest.approx(collective_time_s(net, "gtopk_allreduce", numel, k, 6, "butterfly"), rel=1e-12)
    with pytest.raises(TypeError, match="stats"):
        clock.simulate_collective([0.1], [42])


def test_a_collectives_own_compression_is_charged_as_the_selecting_ranks_median() -> None:
    """include_compress_cpu: the simulator adds the median of the compressing ranks'
    compress_cpu_s to each of them (a rank that compressed nothing adds none); a real rank's
    collective adds its own; off (the class default), nothing."""
    net = NetworkModel(latency_s=1e-3, bandwidth_bps=8e6)  # one 1000-byte round: 2 ms
    stats = [CommStats("oktopk_allreduce", "plain", steps=[(1000, 1000)], compress_cpu_s=c)
             for c in (0.001, 0.009, 0.004, 0.0)]
    on, off = VirtualClock(net, include_compress_cpu=True), VirtualClock(net)
    assert on.simulate_collective([0.01] * 4, stats) == pytest.approx(0.01 + 2e-3 + 0.004)  # median of 1, 9, 4 ms
    assert on.total_compress_cpu_s == pytest.approx(0.004) and on.last_comm_model_s == pytest.approx(2e-3)
    assert off.simulate_collective([0.01] * 4, stats) == pytest.approx(0.01 + 2e-3)
    alone = VirtualClock(net, include_compress_cpu=True)  # no process group: one real rank
    alone.collective(lambda: CollectiveResult(torch.zeros(1), None, stats[1]))
    assert alone.last_comm_charge_s == pytest.approx(2e-3 + 0.009) and alone.last_compress_cpu_s == 0.009


def test_merge_cpu_advances_virtual_time_but_not_the_comm_model() -> None:
    net = NetworkModel(latency_s=1e-3, bandwidth_bps=8e6)
    stats = [CommStats("gtopk_allreduce", "butterfly", steps=[(1000, 1000)], merge_cpu_s=0.004),
             CommStats("gtopk_allreduce", "butterfly", steps=[(1000, 1000)], merge_cpu_s=0.009)]
    with_merge = VirtualClock(net, include_merge_cpu=True)
    t = with_merge.simulate_collective([0.010, 0.030], stats)
    assert t == pytest.approx(0.030 + 2e-3 + 0.009)  # alpha-beta-gamma of the slowest rank
    assert with_merge.last_comm_model_s == pytest.approx(2e-3)  # the comm column stays alpha-beta
    without = VirtualClock(net)
    assert without.simulate_collective([0.010, 0.030], stats) == pytest.approx(0.030 + 2e-3)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("charge", [True, False])
def test_training_charges_merges_in_virtual_time_unless_told_not_to(monkeypatch, charge) -> None:
    from gtopk_lab.config import RunConfig
    from gtopk_lab.training import loop, simulator

    seen: list[bool] = []

    class Recording(VirtualClock):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            seen.append(self.include_merge_cpu)

    monkeypatch.setattr(loop, "VirtualClock", Recording)
    monkeypatch.setattr(simulator, "VirtualClock", Recording)
    cfg = RunConfig(method="gtopk", workers=1, model="digits_cnn", dataset="digits", train_samples=64,
                    test_samples=32, batch_size=16, epochs=1, max_iterations=2, density=0.05,
                    bandwidth="1GbE", virtual_merge_cpu=charge)
    assert loop.train_rank(cfg).summary["virtual_merge_cpu"] is charge
    assert simulator.simulate(cfg.replace(workers=2)).summary["virtual_merge_cpu"] is charge
    # fixed compute keeps virtual time exactly reproducible: merges are never charged there
    fixed = simulator.simulate(cfg.replace(workers=2), compute_time_s=0.01)
    assert fixed.summary["virtual_merge_cpu"] is False
    assert seen == [charge, charge, False]


def test_rejects_bad_arguments_and_results() -> None:
    with pytest.raises(TypeError, match="network"):
        VirtualClock("1Gbps")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="throttle"):
        VirtualClock(NetworkModel.from_strings("none"), throttle="yes")  # type: ignore[arg-type]
    clock = VirtualClock(NetworkModel.from_strings("none"))
    with pytest.raises(TypeError, match="CollectiveResult"):
        clock.collective(lambda: 42)


# --- real gloo ranks ------------------------------------------------------------------------------
def _throttled_rank(rank: int, world: int, numel: int, k: int, late_s: float = 0.0) -> dict[str, float]:
    """One paced gTop-k call through a throttled clock; the last rank starts ``late_s`` late."""
    clock = VirtualClock(NetworkModel.from_strings("100Mbps", "1ms"), throttle=True)
    vals, idx = _sparse(rank, numel, k)
    if rank == world - 1:
        time.sleep(late_s)
    t0 = time.perf_counter()
    clock.collective(gtopk_allreduce, vals, idx, numel, k)
    return {"wall": time.perf_counter() - t0, "model": clock.last_comm_model_s,
            "comm_wall": clock.last_comm_wall_s, "call": clock.last_call_wall_s,
            "span": clock.last_span_wall_s}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_throttled_collective_lasts_at_least_its_model() -> None:
    from gtopk_lab.comm.launch import run_gloo

    numel, k = 200_000, 20_000  # one butterfly round of 160 kB: 1 ms + 12.8 ms at 100 Mbps
    for r in run_gloo(_throttled_rank, 2, numel, k, timeout_s=60):
        wall, model, comm_wall = r["wall"], r["model"], r["comm_wall"]
        assert model == pytest.approx(1e-3 + (8 + 8 * k) * 8 / 100e6)
        assert wall >= model and comm_wall >= model
        assert wall < model + 10.0  # generous: the box is shared


@pytest.mark.timeout(120)
def test_span_runs_from_the_last_arrival_to_the_last_completion_on_every_rank() -> None:
    """The last rank arrives 1 s late: the early rank's own call time holds that wait, the
    span (max end - max start on the ranks' shared wall clock) does not, yet it still holds
    the whole paced round (which the late rank starts at its arrival), and every rank reads
    the same span."""
    from gtopk_lab.comm.launch import run_gloo

    numel, k, late_s = 200_000, 20_000, 1.0
    early, late = run_gloo(_throttled_rank, 2, numel, k, late_s, timeout_s=60)
    model = 1e-3 + (8 + 8 * k) * 8 / 100e6  # one paced butterfly round: 13.8 ms
    assert early["model"] == late["model"] == pytest.approx(model)
    # margins for a loaded box, which can hold a rank back for tens of milliseconds
    assert early["call"] >= 0.6 * late_s, early
    assert early["span"] == late["span"]
    assert model * 0.99 <= early["span"] < 0.4 * late_s, early


def _iterations(clock: VirtualClock, rank: int, numel: int, k: int, iters: int,
                compute_s: float) -> tuple[list[float], float]:
    """Train-like loop: compute (CPU), then a gTop-k collective through the clock."""
    vals, idx = _sparse(rank, numel, k)
    cpu = []
    clock.reset()
    for _ in range(iters):
        cpu.append(_burn_cpu_s(compute_s * (1 + 0.5 * rank)))  # uneven ranks: max arrival matters
        clock.collective(gtopk_allreduce, vals, idx, numel, k)
    return cpu, clock.total_comm_model_s


def _virtual_rank(rank: int, world: int, numel: int, k: int, iters: int, compute_s: float) -> dict:
    clock = VirtualClock(NetworkModel.from_strings("1Gbps"))
    cpu1, comm1 = _iterations(clock, rank, numel, k, iters, compute_s)
    t1 = clock.synced_time_s
    cpu2, comm2 = _iterations(clock, rank, numel, k, iters, compute_s)
    vals, idx = _sparse(rank, numel, k)
    steps = gtopk_allreduce(vals, idx, numel, k).stats.steps
    return {"cpu1": cpu1, "comm1": comm1, "t1": t1, "cpu2": cpu2, "comm2": comm2,
            "t2": clock.synced_time_s, "steps": steps}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_virtual_time_is_compute_plus_modelled_comm_on_4_gloo_ranks() -> None:
    """P = 4 real ranks on 2 cores, emulated 1 Gbps: oversubscription must not leak in."""
    from gtopk_lab.comm.launch import run_gloo

    world, numel, k, iters, compute_s = 4, 1_000_000, 50_000, 3, 0.04
    out = run_gloo(_virtual_rank, world, numel, k, iters, compute_s, timeout_s=120)
    net = NetworkModel.from_strings("1Gbps")
    model_per_iter = collective_time_s(net, "gtopk_allreduce", numel, k, world, "butterfly")
    assert model_per_iter == pytest.approx(max(net.steps_time_s(r["steps"]) for r in out), rel=1e-12)
    for run in ("1", "2"):
        # independent expectation: per iteration the slowest rank's CPU time, then the model
        expected = sum(max(r[f"cpu{run}"][i] for r in out) for i in range(iters)) + iters * model_per_iter
        for r in out:
            assert r[f"t{run}"] == pytest.approx(expected, rel=0.10)  # identical on every rank
            assert r[f"comm{run}"] == pytest.approx(iters * model_per_iter, rel=1e-12)
    # the communication part is deterministic across runs and ranks
    assert len({r["comm1"] for r in out} | {r["comm2"] for r in out}) == 1
