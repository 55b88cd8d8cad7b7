"""Ok-Topk sparse allreduce (gtopk_lab.comm.oktopk): real gloo ranks, simulator, exactness, residuals.

One spawned group of 8 gloo ranks covers P in {1, 2, 3, 4, 5, 8}: for each P the ranks
0..P-1 form a sub-group (P = 8 uses the default group, ``group=None``) and run several
input families through a persistent :class:`OkTopkState` (calls 0, 1, 2: re-balance, then
reuse of the boundaries); the parent checks every property on the returned results. The
remaining tests run in-process.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist

from gtopk_lab.compression.merge import coalesce_sparse, merge_sparse
from gtopk_lab.compression.residual import ErrorFeedback
from gtopk_lab.compression.selection import get_selector
from gtopk_lab.comm.launch import run_gloo
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.methods.formulas import oktopk_model_time_s
from gtopk_lab.comm.oktopk import (
    OkTopkState, boundaries_from_histogram, equal_boundaries, oktopk_allreduce,
    sim_oktopk_allreduce,
)

NUMEL = 3000
K = 40
WORLD_SIZES = (1, 2, 3, 4, 5, 8)
FAMILIES = ("randn", "disjoint", "ties", "skewed")
CALLS = 3


def make_input(family: str, world_size: int, rank: int, call: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic local selection of ``rank`` (shared by the gloo ranks and the parent)."""
    gen = torch.Generator().manual_seed(10_000 * world_size + 100 * rank + call)
    if family == "disjoint":  # rank r owns indices = r (mod P): supports never overlap
        own = torch.arange(rank, NUMEL, world_size)
        pick = own[torch.randperm(own.numel(), generator=gen)[:K]]
        return torch.randn(K, generator=gen), pick.to(torch.int32)
    if family == "ties":  # few distinct magnitudes: many ties straddle the threshold
        x = torch.randint(1, 4, (NUMEL,), generator=gen).float() * torch.sign(torch.randn(NUMEL, generator=gen))
        perm = torch.randperm(NUMEL, generator=gen)[:K]
        return x[perm], perm.to(torch.int32)
    x = torch.randn(NUMEL, generator=gen)
    if family == "skewed":  # selections crowd into the first 10% of the index space
        x[: NUMEL // 10] *= 50
    return get_selector("topk")(x, K)


def exact_global_topk(vs: list[torch.Tensor], is_: list[torch.Tensor], k: int):
    """Reference: exact sum of all sparse vectors (rank order), keep k largest |v|, ties -> lower index."""
    sv, si = coalesce_sparse(torch.cat(vs), torch.cat([i.to(torch.int32) for i in is_]))
    kv, ki, _, _ = merge_sparse(sv, si, sv[:0], si[:0], k)
    return kv, ki, sv, si


def _rank_job(rank: int, world_size: int) -> dict:
    out: dict = {"errors": {}}
    v, i = make_input("randn", world_size, rank, 0)
    for name, call in {"k0": lambda: oktopk_allreduce(v, i, NUMEL, 0),
                       "range": lambda: oktopk_allreduce(v, i + NUMEL, NUMEL, K),
                       "state": lambda: oktopk_allreduce(v, i, NUMEL, K, state="x")}.items():
        try:
            call()
            out["errors"][name] = None
        except (ValueError, TypeError) as exc:
            out["errors"][name] = str(exc)
    for p in range(1, world_size + 1):
        group = dist.new_group(list(range(p)))  # collective over the default group
        if rank >= p or p not in WORLD_SIZES:
            continue
        use = None if p == world_size else group
        res: dict = {}
        for fam in FAMILIES:
            state = OkTopkState(rebalance_every=2)
            for call in range(CALLS):
                v, i = make_input(fam, p, rank, call)
                res[(fam, call)] = oktopk_allreduce(v, i, NUMEL, K, group=use, state=state)
            res[(fam, "bounds")] = state.boundaries
        # error feedback, rule "mass": residuals + G conserve the accumulated gradients
        ef = ErrorFeedback(NUMEL, rule="mass")
        gen = torch.Generator().manual_seed(rank)
        mass = []
        state = OkTopkState()
        for _ in range(CALLS):
            acc = ef.compensate(torch.randn(NUMEL, generator=gen))
            lv, li = get_selector("topk")(acc, K)
            r = oktopk_allreduce(lv, li, NUMEL, K, group=use, state=state)
            ef.update(acc, lv, li, r)
            mass.append((acc.clone(), ef.residual.clone(), r.values, r.indices))
        res["mass"] = mass
        out[p] = res
    dist.barrier()
    return out


@functools.lru_cache(maxsize=1)
def _gloo_results() -> list[dict]:
    return run_gloo(_rank_job, max(WORLD_SIZES), timeout_s=120)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_oktopk_real_gloo_all_properties() -> None:
    results = _gloo_results()
    errors = results[0]["errors"]
    assert "k=0" in errors["k0"] and "1 <= k" in errors["k0"]
    assert "indices range" in errors["range"]
    assert "OkTopkState" in errors["state"]
    for p in WORLD_SIZES:
        ranks = [results[r][p] for r in range(p)]
        for fam in FAMILIES:
            sim_state = OkTopkState(rebalance_every=2)
            for call in range(CALLS):
                inputs = [make_input(fam, p, r, call) for r in range(p)]
                got = [ranks[r][(fam, call)] for r in range(p)]
                # 1. identical (bitwise) on every rank, canonical, exactly min(k, |union|) entries
                for g in got[1:]:
                    assert torch.equal(g.values, got[0].values) and torch.equal(g.indices, got[0].indices)
                assert torch.all(got[0].indices[1:] > got[0].indices[:-1])
                # 2. exact global top-k of the summed sparse vectors (any supports; ties -> lower index)
                kv, ki, sv, si = exact_global_topk([x[0] for x in inputs], [x[1] for x in inputs], K)
                assert torch.equal(got[0].indices, ki), (p, fam, call)
                assert torch.equal(got[0].values, kv), (p, fam, call)
                # 3. drops: charged to exactly one rank each, kept + dropped == the exact sum
                dv = torch.cat([g.stats.dropped_values for g in got])
                di = torch.cat([g.stats.dropped_indices for g in got])
                all_v, all_i = coalesce_sparse(torch.cat([kv, dv]), torch.cat([ki, di]))
                assert all_i.numel() == kv.numel() + dv.numel()  # no index charged twice
                assert torch.equal(all_i, si) and torch.equal(all_v, sv)
                # 4. simulated == real: values, bytes, rounds, per-round steps, drops
                sim = sim_oktopk_allreduce([x[0] for x in inputs], [x[1] for x in inputs], NUMEL, K,
                                           state=sim_state)
                for r in range(p):
                    a, b = got[r].stats, sim[r].stats
                    assert torch.equal(sim[r].values, got[r].values)
                    assert (a.bytes_sent, a.bytes_recv, a.messages, a.rounds, a.steps) == \
                           (b.bytes_sent, b.bytes_recv, b.messages, b.rounds, b.steps)
                    assert torch.equal(a.dropped_indices, b.dropped_indices)
                    assert a.collective == "oktopk_allreduce" and not a.library_estimate
                if p == 1:
                    assert got[0].stats.steps == []
            assert ranks[0][(fam, "bounds")] == sim_state.boundaries
        # re-balanced regions follow the selections: skewed inputs shrink region 0
        if p > 1:
            assert ranks[0][("skewed", "bounds")][1] < NUMEL // p
        # 5. mass conservation with error feedback "mass": sum residual + G == sum acc
        for call in range(CALLS):
            acc_sum = sum(ranks[r]["mass"][call][0] for r in range(p))
            res_sum = sum(ranks[r]["mass"][call][1] for r in range(p))
            G = torch.zeros(NUMEL)
            G[ranks[0]["mass"][call][3].long()] = ranks[0]["mass"][call][2]
            torch.testing.assert_close(res_sum + G, acc_sum, rtol=0, atol=1e-5)


@pytest.mark.timeout(60)
def test_balanced_bytes_near_lower_bound() -> None:
    """Uniform selections, P = 8: reduce-scatter + allgather carry ~2k(P-1)/P pairs per rank."""
    p, numel, k = 8, 200_000, 4000
    gen = torch.Generator().manual_seed(3)
    vs = [torch.randn(k, generator=gen) for _ in range(p)]
    is_ = [torch.randperm(numel, generator=gen)[:k].to(torch.int32) for _ in range(p)]
    state = OkTopkState(rebalance_every=4)
    sim_oktopk_allreduce(vs, is_, numel, k, state=state)  # call 0 re-balances
    res = sim_oktopk_allreduce(vs, is_, numel, k, state=state)
    lower_bound = 2 * k * (p - 1) / p * 8
    pairs = state.phase_bytes["reduce_scatter"] + state.phase_bytes["allgather"]
    assert "rebalance" not in state.phase_bytes
    assert pairs < 1.3 * lower_bound
    assert max(r.stats.bytes_sent for r in res) < 1.5 * lower_bound
    # the closed form as implemented predicts the modelled time of the measured steps
    for bandwidth, latency in (("1Gbps", None), ("1GbE", None)):
        net = NetworkModel.from_strings(bandwidth, latency)
        measured = max(net.steps_time_s(r.stats.steps) for r in res)
        predicted = oktopk_model_time_s(net, numel, k, p, rebalance_every=10**9)
        assert measured == pytest.approx(predicted, rel=0.15)


@pytest.mark.timeout(60)
def test_state_validation_boundaries_and_pickling() -> None:
    import pickle

    with pytest.raises(ValueError, match="rebalance_every=0"):
        OkTopkState(rebalance_every=0)
    with pytest.raises(TypeError, match="threshold_probes"):
        OkTopkState(threshold_probes=2.5)  # type: ignore[arg-type]
    assert equal_boundaries(10, 3) == [0, 3, 6, 10]
    hist = torch.tensor([8, 0, 0, 0, 0, 0, 0, 8])
    b = boundaries_from_histogram(hist, 80, 2)
    assert b[0] == 0 and b[-1] == 80 and b[1] == 10
    assert boundaries_from_histogram(torch.zeros(8, dtype=torch.long), 80, 4) == equal_boundaries(80, 4)
    state = OkTopkState(threshold_probes=3)
    vs = [torch.randn(30, dtype=torch.float64) for _ in range(3)]
    is_ = [torch.randperm(500)[:30] for _ in range(3)]
    got = sim_oktopk_allreduce(vs, is_, 500, 17, state=state)  # float64 keys, few probes
    kv, ki, _, _ = exact_global_topk(vs, is_, 17)
    assert torch.equal(got[2].indices, ki) and torch.equal(got[2].values, kv)
    assert pickle.loads(pickle.dumps(state)).boundaries == state.boundaries


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_oktopk_training_method_simulator_matches_real_gloo_ranks() -> None:
    """method="oktopk" trains through train_rank on 3 real gloo ranks and in the simulator,
    with the Ok-Topk state (region re-balancing) kept across iterations, to the same weights."""
    from gtopk_lab.config import RunConfig
    from gtopk_lab.training.loop import gloo_rank_entry
    from gtopk_lab.training.simulator import simulate

    cfg = RunConfig(method="oktopk", workers=3, density=0.01, max_iterations=20,
                    train_samples=300, test_samples=100, bandwidth="1GbE",
                    extra={"return_weights": True})
    sim = simulate(cfg)
    real = run_gloo(gloo_rank_entry, 3, cfg.to_dict(), timeout_s=120)
    iters = [r for r in sim.rows if r["kind"] == "iter"]
    assert iters and all(r["bytes_sent"] > 0 for r in iters)
    assert sim.summary["method"] == "oktopk"
    for rank_result in real:
        torch.testing.assert_close(rank_result.final_weights, sim.final_weights, rtol=1e-5, atol=1e-6)
