"""PowerSGD (gtopk_lab/methods/powersgd.py): equal to torch's ``powerSGD_hook`` on a real gloo
group, identical on every rank, real gloo equal to the simulator, and oracles in-process
(full rank = exact mean, mass conservation of the error feedback, low rank of each layer,
the allreduce program = the sum, formulas = the recorded messages, checkpoint round trip)."""

from __future__ import annotations

import math

import pytest
import torch

from gtopk_lab.comm.dense import allreduce_bytes_per_rank, allreduce_program, allreduce_time_s
from gtopk_lab.comm.tensor_programs import TENSOR_HEADER_BYTES, simulate_tensor_programs
from gtopk_lab.config import RunConfig
from gtopk_lab.methods import get_method
from gtopk_lab.methods.powersgd import layer_plan, powersgd_bytes_per_rank, powersgd_options, powersgd_time_s
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.training.step import RankStep, communicate, communicate_simulated

#: A bucket with a repeated matrix shape after others (the hook draws Q grouped by shape), a
#: conv-shaped weight, biases and a matrix below the compression threshold.
LAYOUT = ((12, 6), (12,), (6, 2, 3), (9, 12), (4, 3), (5,), (12, 6))
NUMEL = sum(math.prod(s) for s in LAYOUT)
#: (rank r, min_compression_rate, warm_start, seed): Gram-Schmidt, fresh Q each call, QR.
CASES = ((1, 2.0, True, 0), (2, 1.0, False, 7), (3, 1.0, True, 3))
ITERS = 4


def _options(rank: int, rate: float, warm: bool, seed: int) -> dict:
    return {"powersgd_rank": rank, "powersgd_min_compression_rate": rate, "powersgd_warm_start": warm,
            "powersgd_seed": seed}


def _grad(iteration: int, rank: int, numel: int = NUMEL) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 * iteration + rank))


class _Bucket:
    """What powerSGD_hook reads of a dist.GradBucket: one flat buffer and its per-parameter views."""

    def __init__(self, flat: torch.Tensor, layout: tuple) -> None:
        self.flat = flat
        self.views, offset = [], 0
        for shape in layout:
            n = math.prod(shape)
            self.views.append(flat[offset:offset + n].view(shape))
            offset += n

    def buffer(self) -> torch.Tensor:
        return self.flat

    def gradients(self) -> list[torch.Tensor]:
        return self.views

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True


def _hook_vs_method(rank: int, world: int) -> list[dict]:
    """On one gloo rank: torch's hook and the method on the same gradients, per case."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

    out = []
    for r, rate, warm, seed in CASES:
        state = PowerSGDState(process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=2,
                              min_compression_rate=rate, use_error_feedback=True, warm_start=warm,
                              random_seed=seed)
        for it in range(2):  # the hook's mandatory vanilla allreduces (start_powerSGD_iter = 2)
            powerSGD_hook(state, _Bucket(_grad(-1 - it, rank), LAYOUT)).wait()
        method = get_method("powersgd")
        step = RankStep(method, NUMEL, torch.device("cpu"), rank=rank, world=world, layout=LAYOUT,
                        options=_options(r, rate, warm, seed))
        hook_out, ours, diffs, error_diffs = [], [], [], []
        for it in range(ITERS):
            g = _grad(it, rank)
            expected = powerSGD_hook(state, _Bucket(g.clone(), LAYOUT)).wait()
            contribution = step.prepare(g.clone(), 1)
            result = communicate(method, contribution, step.call(1, it))
            step.finish(contribution, result)
            mine = step.aggregate(result, torch.device("cpu")) / world
            hook_out.append(expected.clone())
            ours.append(mine.clone())
            diffs.append(float((expected - mine).abs().max()))
            error_diffs.append(float((state.error_dict[0] - step.memory.residual).abs().max()))
        out.append({"case": (r, rate, warm, seed), "hook": hook_out, "ours": ours, "diffs": diffs,
                    "error_diffs": error_diffs, "seeds_drawn": step.collective_state.seeds_drawn})
    return out


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_equals_torch_powersgd_hook_on_a_real_gloo_group() -> None:
    from gtopk_lab.comm.launch import run_gloo

    per_rank = run_gloo(_hook_vs_method, 2, timeout_s=90)
    for case in range(len(CASES)):
        for rank_out in per_rank:
            res = rank_out[case]
            # W = 2: the same sums (a + b commutes exactly) and power-of-two scaling, so the
            # hook's numbers are reproduced up to float tolerance (in practice bit for bit)
            assert max(res["diffs"]) <= 1e-6, (res["case"], res["diffs"])
            assert max(res["error_diffs"]) <= 1e-6, (res["case"], res["error_diffs"])
            # compression happened: the aggregate is not the plain mean of the gradients
            assert not torch.allclose(res["ours"][0], (_grad(0, 0) + _grad(0, 1)) / 2, atol=1e-3)
        # identical on every rank, bit for bit
        for it in range(ITERS):
            assert torch.equal(per_rank[0][case]["ours"][it], per_rank[1][case]["ours"][it])
    warm_draws = [per_rank[0][c]["seeds_drawn"] for c in range(len(CASES))]
    assert warm_draws == [1, ITERS, 1]  # warm start draws once; without it every call draws


def _mlp_config(**kw) -> RunConfig:
    base = dict(method="powersgd", workers=2, model="mlp", dataset="mnist1d", train_samples=240,
                test_samples=50, batch_size=8, epochs=1, max_iterations=6, lr=0.05, momentum=0.9,
                bandwidth="1GbE", sink_every=3, data_split="dirichlet", dirichlet_alpha=0.3,
                extra={"return_weights": True, "powersgd_rank": 2})
    base.update(kw)
    return RunConfig(**base)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_real_gloo_ranks_equal_the_simulator_on_a_tiny_mlp() -> None:
    from gtopk_lab.comm.launch import run_gloo
    from gtopk_lab.training.loop import gloo_rank_entry
    from gtopk_lab.training.simulator import simulate

    config = _mlp_config()
    real = run_gloo(gloo_rank_entry, 2, config.to_dict(), timeout_s=120)
    # bitwise equality is the sequential simulator's promise; the batched (vmap) path's losses
    # differ in the last bits (test_batched_ranks checks it within tolerance)
    sim = simulate(config.replace(extra={**config.extra, "sim_batched": "off"}))
    assert torch.equal(real[0].final_weights, real[1].final_weights)
    assert torch.equal(sim.final_weights, real[0].final_weights)
    key = lambda row: (row["rank"], row["iteration"], row["bytes_sent"], row["bytes_recv"], row["train_loss"])  # noqa: E731
    real_rows = sorted(key(row) for r in real for row in r.rows if row["kind"] == "iter")
    assert real_rows == sorted(key(row) for row in sim.rows if row["kind"] == "iter")
    # compressed: far fewer bytes than the 2 (P-1)/P * 4d = 4d of a dense ring allreduce at P = 2
    assert real_rows[0][2] < 0.3 * 4 * sim.summary["numel"]


# --------------------------------------------------------------------------- in-process oracles
def _run_group(world: int, layout: tuple, options: dict, iters: int, numel: int | None = None):
    """``iters`` calls of P virtual ranks; yields (accs, results, steps) per call."""
    numel = numel or sum(math.prod(s) for s in layout)
    method = get_method("powersgd")
    steps = [RankStep(method, numel, torch.device("cpu"), rank=r, world=world, layout=layout, options=options)
             for r in range(world)]
    for it in range(iters):
        contributions = [s.prepare(_grad(it, r, numel), 1) for r, s in enumerate(steps)]
        results = communicate_simulated(method, contributions, steps[0].call(1, it))
        accs = [c.acc.clone() for c in contributions]
        for s, c, res in zip(steps, contributions, results):
            s.finish(c, res)
        yield accs, results, steps


@pytest.mark.timeout(30)
def test_full_rank_equals_the_exact_mean_and_errors_conserve_mass() -> None:
    """Oracle 1: with r >= min(n, m) and every layer compressed the projection is exact, so the
    aggregate is the plain sum of the M_i. Oracle 2: sum_i e_i + G == sum_i M_i at rank 1."""
    layout = ((6, 4), (3, 5), (4,))
    full = {"powersgd_rank": 6, "powersgd_min_compression_rate": 0.0}
    for accs, results, _ in _run_group(3, layout, full, 3):
        torch.testing.assert_close(results[0].values, sum(accs), rtol=1e-5, atol=1e-5)
    for accs, results, steps in _run_group(5, LAYOUT, {"powersgd_rank": 1}, 3):
        for res in results[1:]:
            assert torch.equal(res.values, results[0].values)  # every virtual rank the same bits
        errors = sum(s.memory.residual for s in steps)
        torch.testing.assert_close(errors + results[0].values, sum(accs), rtol=1e-5, atol=1e-5)
        plan = layer_plan(LAYOUT, 1, 2.0)
        for offset, n, m, r in plan.compressed:  # each compressed layer of G has rank <= r
            block = results[0].values[offset:offset + n * m].view(n, m)
            assert int(torch.linalg.matrix_rank(block)) <= r


@pytest.mark.timeout(30)
@pytest.mark.parametrize("world", [1, 2, 3, 5, 6, 8])
def test_allreduce_program_is_the_sum_on_every_rank_and_matches_its_formulas(world: int) -> None:
    net = NetworkModel.from_strings("1Gbps", "0.5ms")
    for numel in (0, 1, 7, 96):
        xs = [torch.randint(-50, 50, (numel,), generator=torch.Generator().manual_seed(r)).float()
              for r in range(world)]
        results = simulate_tensor_programs(lambda r, w: allreduce_program(r, w, xs[r]), "ar", world)
        for res in results:
            assert torch.equal(res.values, sum(xs) if world > 1 else xs[0])  # integers: exact in any order
        payload = [res.stats.bytes_sent - TENSOR_HEADER_BYTES * res.stats.messages for res in results]
        assert sum(payload) / world == pytest.approx(allreduce_bytes_per_rank(numel, world), abs=4 * world)
        slowest = max(net.steps_time_s(res.stats.steps) for res in results)
        assert slowest <= allreduce_time_s(net, numel, world) + 1e-12
        assert slowest >= 0.9 * allreduce_time_s(net, numel, world)


@pytest.mark.timeout(30)
def test_formulas_match_the_recorded_messages_and_need_the_layout() -> None:
    net = NetworkModel.from_strings("1Gbps", "0.5ms")
    options = {"powersgd_rank": 2}
    for world in (2, 4):
        _, results, _ = next(_run_group(world, LAYOUT, options, 1))
        measured = [res.stats.bytes_sent - TENSOR_HEADER_BYTES * res.stats.messages for res in results]
        assert sum(measured) / world == pytest.approx(
            powersgd_bytes_per_rank(NUMEL, 1, world, layout=LAYOUT, rank=2), abs=8 * world)
        slowest = max(net.steps_time_s(res.stats.steps) for res in results)
        predicted = get_method("powersgd").predicted_time_s(net, NUMEL, 1, world, layout=LAYOUT, rank=2)
        assert predicted == pytest.approx(powersgd_time_s(net, NUMEL, 1, world, layout=LAYOUT, rank=2))
        assert 0.9 * predicted <= slowest <= predicted + 1e-12
    with pytest.raises(ValueError, match="layout=None"):
        powersgd_time_s(net, NUMEL, 1, 4)
    with pytest.raises(ValueError, match=r"layout=\(\)"):
        next(_run_group(2, (), options, 1, numel=NUMEL))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("warm", [True, False])
def test_resume_from_a_checkpoint_reaches_the_uninterrupted_weights(tmp_path, warm: bool) -> None:
    """Memory (error), Q and the seed draws go through torch.save / weights_only load: a
    simulated run resumed after epoch 1 of 3 ends with the uninterrupted run's weights."""
    from gtopk_lab.training.simulator import simulate

    full = RunConfig(method="powersgd", workers=2, model="mlp", dataset="synthetic", train_samples=128,
                     test_samples=16, epochs=3, batch_size=16, momentum=0.9, checkpoint=True, device="cpu",
                     extra={"return_weights": True, "powersgd_rank": 2, "powersgd_warm_start": warm})
    uninterrupted = simulate(full)
    folder = str(tmp_path / "checkpoints")
    simulate(full.replace(epochs=1), checkpoint_dir=folder)
    resumed = simulate(full, checkpoint_dir=folder, resume_from=folder)
    assert min(r["iteration"] for r in resumed.rows if r["kind"] == "iter") == 4
    assert torch.equal(uninterrupted.final_weights, resumed.final_weights)


@pytest.mark.timeout(10)
def test_options_are_checked_when_the_config_is_built() -> None:
    assert powersgd_options({}).rank == 1 and powersgd_options({}).warm_start
    for extra, key in (({"powersgd_rank": 0}, "powersgd_rank"), ({"powersgd_rank": 1.5}, "powersgd_rank"),
                       ({"powersgd_min_compression_rate": -1}, "powersgd_min_compression_rate"),
                       ({"powersgd_min_compression_rate": float("nan")}, "powersgd_min_compression_rate"),
                       ({"powersgd_warm_start": "yes"}, "powersgd_warm_start"),
                       ({"powersgd_seed": -3}, "powersgd_seed"), ({"powersgd_rnak": 2}, "powersgd_rnak")):
        with pytest.raises(ValueError, match=key):  # the key, named by the method or as unknown
            RunConfig(method="powersgd", extra=extra)
    assert RunConfig(method="gtopk", extra={"powersgd_rank": 0}).method == "gtopk"  # not its option
    summary = get_method("powersgd").summary()
    assert summary["collective"] == "powersgd" and summary["selector"] == "-"
