"""The post-2019 methods (gtopk_lab/methods/{cltk,ef21,diloco,sparseloco}.py) against oracles
written here: CLT-k is a dense allreduce restricted to the leader's indices; EF21's mean of the
estimates is the aggregate; DiLoCo at H = 1 with SGD in and out is dense data-parallel SGD;
SparseLoCo (and over gTop-k) at density 1 without quantisation or decay is the same H-step
scheme with a plain averaged outer step; the collectives conserve mass and agree on every rank;
real gloo ranks equal the simulator; CLT-k and EF21 as DDP hooks equal the training step."""

from __future__ import annotations

import contextlib
import io
import time

import pytest
import torch

from gtopk_lab.config import RunConfig
from gtopk_lab.methods import get_method, register_method
from gtopk_lab.methods.base import CommCall, Contribution
from gtopk_lab.methods.ef21 import ef21_method
from gtopk_lab.methods.sparseloco import CHUNK, chunk_topk, decode, encode, encoded_bytes
from gtopk_lab.training.step import RankStep, communicate_simulated

MODERN = ("clt-k", "ef21", "ef21-sgdm", "diloco", "sparseloco", "sparseloco-gtopk")
CPU = torch.device("cpu")


def _config(method: str, workers: int = 3, extra: dict | None = None, **kw) -> RunConfig:
    base = dict(method=method, workers=workers, model="mlp", dataset="mnist1d", train_samples=240,
                test_samples=50, batch_size=8, epochs=1, max_iterations=6, density=0.05, lr=0.05,
                momentum=0.0, bandwidth="1GbE", sink_every=4, extra={"return_weights": True, **(extra or {})})
    base.update(kw)
    return RunConfig(**base)


def _steps(method: str, world: int, numel: int, extra: dict | None = None, **kw) -> list[RankStep]:
    return [RankStep(get_method(method), numel, CPU, rank=r, options=extra, **{"world": world, **kw})
            for r in range(world)]


def _round(steps: list[RankStep], grads: list[torch.Tensor], k: int, it: int):
    method = steps[0].method
    contributions = [s.prepare(g, k, it) for s, g in zip(steps, grads)]
    results = communicate_simulated(method, contributions, steps[0].call(k, it))
    for s, c, r in zip(steps, contributions, results):
        s.finish(c, r)
    return contributions, results


# --------------------------------------------------------------------------- registry, listing
@pytest.mark.timeout(30)
def test_modern_methods_are_listed_and_their_options_are_checked() -> None:
    from gtopk_lab.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["methods"]) == 0
    for name in MODERN:
        assert f"\n{name} " in out.getvalue()
    assert _config("sparseloco", extra={"ef_decay": 0}).extra["ef_decay"] == 0  # an int for a float
    with pytest.raises(ValueError, match="method_options ef_decay='high'"):
        _config("sparseloco", extra={"ef_decay": "high"})
    with pytest.raises(ValueError, match="method_options sync_every=0"):
        _config("diloco", extra={"sync_every": 0})
    with pytest.raises(ValueError, match="method_options quant_bits=3"):
        RankStep(get_method("sparseloco"), 100, CPU, options={"quant_bits": 3})
    # EF21 needs the exact sum: register_method refuses gTop-k (it drops entries)
    with pytest.raises(ValueError, match="collective='gtopk'"):
        register_method(ef21_method("ef21-over-gtopk", collective="gtopk"))


# --------------------------------------------------------------------------- CLT-k
@pytest.mark.timeout(30)
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_cltk_is_a_dense_allreduce_restricted_to_the_leaders_indices(world: int) -> None:
    numel, k, beta = 300, 17, 0.3
    steps = _steps("clt-k", world, numel, {"lowpass_beta": beta})
    gen = torch.Generator().manual_seed(world)
    for it in range(2 * world + 1):
        memories = [s.memory.memory.clone() for s in steps]
        grads = [torch.randn(numel, generator=gen) for _ in steps]
        contributions, results = _round(steps, grads, k, it)
        accs = [g + m for g, m in zip(grads, memories)]  # oracle: error-compensated gradients
        leader = it % world
        expected_idx = torch.topk(accs[leader].abs(), k).indices.sort().values
        expected = torch.stack([a[expected_idx] for a in accs]).sum(0)
        for r, res in enumerate(results):
            assert torch.equal(res.values, results[0].values) and torch.equal(res.indices, results[0].indices)
            assert torch.equal(res.indices.long(), expected_idx)
            torch.testing.assert_close(res.values, expected, rtol=1e-6, atol=1e-6)
            residual = accs[r].clone()
            residual[expected_idx] = 0.0
            torch.testing.assert_close(steps[r].memory.memory, (1 - beta) * memories[r] + beta * residual)
        sent = [res.stats.bytes_sent - 16 * res.stats.messages for res in results]  # payload
        assert sum(sent) / world == pytest.approx(get_method("clt-k").predicted_bytes_per_rank(numel, k, world))


#: CPU seconds the slow selector below burns per call (far above a tiny model's compute)
SLOW_SELECTION_S = 0.05


@pytest.fixture
def slow_selector():
    """An exact top-k that first burns :data:`SLOW_SELECTION_S` of its thread's CPU,
    registered for one test."""
    from gtopk_lab.compression import selection

    def slow_topk(x: torch.Tensor, k: int):
        start = time.thread_time()
        while time.thread_time() - start < SLOW_SELECTION_S:
            pass
        return selection.topk_select(x, k)

    selection.register_selector("test-slow-topk", exact_k=True)(slow_topk)
    yield "test-slow-topk"
    selection.SELECTORS.pop("test-slow-topk", None)
    selection.EXACT_K_SELECTORS.discard("test-slow-topk")


@pytest.mark.timeout(60)
def test_cltk_leaders_measured_selection_is_charged_to_every_iteration(slow_selector: str) -> None:
    """Measured compute (the simulator's median rule over P ranks): only the leader selects, so
    the typical rank's compute alone would drop its selection; the leader is charged its own
    and the collective waits for it: every iteration costs at least the selection."""
    from gtopk_lab.training.simulator import simulate

    iterations = 4
    run = simulate(_config("clt-k", workers=4, max_iterations=iterations, selector=slow_selector), rows="all")
    iters = [r for r in run.rows if r["kind"] == "iter"]
    # the leader's row reports its selection (wall >= the CPU it burnt); the others' are
    # microseconds of compensation, not asserted (a loaded machine may stall any of them)
    assert all(row["selection_s"] >= SLOW_SELECTION_S for row in iters if row["rank"] == row["iteration"] % 4)
    per_iteration = {r["iteration"]: r["comm_model_s"] for r in iters}
    assert run.summary["virtual_time_s"] >= iterations * SLOW_SELECTION_S + sum(per_iteration.values())


# --------------------------------------------------------------------------- EF21
@pytest.mark.timeout(30)
@pytest.mark.parametrize("method", ["ef21", "ef21-sgdm"])
def test_ef21_aggregate_is_the_sum_of_the_estimates_on_every_rank(method: str) -> None:
    numel, k, world, eta = 400, 25, 4, 0.1
    steps = _steps(method, world, numel)
    gen = torch.Generator().manual_seed(5)
    estimates = [torch.zeros(numel) for _ in steps]  # oracle: g_i <- g_i + topk(v_i - g_i)
    velocity: list[torch.Tensor | None] = [None] * world
    for it in range(6):
        grads = [torch.randn(numel, generator=gen) for _ in steps]
        _, results = _round(steps, grads, k, it)
        applied = [s.aggregate(r, CPU) for s, r in zip(steps, results)]
        for r, g in enumerate(grads):
            if method == "ef21-sgdm":
                velocity[r] = g.clone() if velocity[r] is None else (1 - eta) * velocity[r] + eta * g
                g = velocity[r]
            diff = g - estimates[r]
            idx = torch.topk(diff.abs(), k).indices
            estimates[r][idx] += diff[idx]
        for a in applied:
            assert torch.equal(a, applied[0])
            torch.testing.assert_close(a, sum(estimates), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sum(s.memory.estimate for s in steps), applied[0], rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- DiLoCo
@pytest.mark.timeout(60)
def test_diloco_h1_with_sgd_in_and_out_is_dense_sgd_and_syncs_every_h() -> None:
    from gtopk_lab.training.simulator import simulate

    dense = simulate(_config("dense")).final_weights
    diloco = simulate(_config("diloco", extra={"sync_every": 1, "optimizer": "sgd", "outer_lr": 1.0,
                                               "outer_momentum": 0.0})).final_weights
    torch.testing.assert_close(diloco, dense, rtol=1e-5, atol=1e-6)
    h3 = simulate(_config("diloco", lr=1e-3, extra={"sync_every": 3}))
    assert [r["bytes_sent"] > 0 for r in h3.rows if r["kind"] == "iter" and r["rank"] == 0] == \
        [i % 3 == 2 for i in range(6)]
    assert h3.final_weights.isfinite().all() and not torch.equal(h3.final_weights, dense)


@pytest.mark.timeout(10)
def test_diloco_outer_step_is_nesterov_with_the_papers_defaults() -> None:
    from gtopk_lab.methods.diloco import nesterov_outer_optimizer

    w = torch.nn.Parameter(torch.zeros(3))
    opt = nesterov_outer_optimizer([w], _config("diloco"))
    assert opt.param_groups[0]["lr"] == 0.7 and opt.param_groups[0]["momentum"] == 0.9
    delta = torch.tensor([1.0, -2.0, 0.5])
    m = torch.zeros(3)
    expected = torch.zeros(3)
    for _ in range(3):  # oracle: m <- mu m + D; theta <- theta - lr (D + mu m)
        w.grad = delta.clone()
        opt.step()
        m = 0.9 * m + delta
        expected = expected - 0.7 * (delta + 0.9 * m)
    torch.testing.assert_close(w.detach(), expected)


# --------------------------------------------------------------------------- SparseLoCo
@pytest.mark.timeout(60)
def test_sparseloco_at_density_1_unquantised_without_decay_is_the_averaged_h_step_scheme() -> None:
    from gtopk_lab.training.simulator import simulate

    plain = {"sync_every": 2, "quant_bits": 32, "ef_decay": 0.0}
    averaged = simulate(_config("diloco", density=1.0, lr=1e-3, extra={"sync_every": 2, "outer_lr": 1.0,
                                                                        "outer_momentum": 0.0}))
    for method in ("sparseloco", "sparseloco-gtopk"):
        run = simulate(_config(method, density=1.0, lr=1e-3, extra=plain))
        torch.testing.assert_close(run.final_weights, averaged.final_weights, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(20)
def test_chunk_topk_and_the_2bit_encoding() -> None:
    gen = torch.Generator().manual_seed(0)
    numel = 3 * CHUNK + 100
    x = torch.randn(numel, generator=gen)
    for k in (1, 5, 300, numel):
        v, i = chunk_topk(x, k)
        assert i.numel() == k and torch.unique(i).numel() == k and torch.equal(v, x[i.long()])
        assert bool((i[1:] > i[:-1]).all())
    v, i = chunk_topk(x, 400)  # every chunk keeps its largest |x|: its share of k
    for c in range(4):
        lo, hi = c * CHUNK, min((c + 1) * CHUNK, numel)
        mine = i[(i >= lo) & (i < hi)].long()
        others = torch.ones(hi - lo, dtype=torch.bool)
        others[mine - lo] = False
        assert x[mine].abs().min() >= x[lo:hi][others].abs().max()
    blob = encode(v, i, numel, 32)
    dv, di = decode(blob, numel, 32)
    assert torch.equal(dv, v) and torch.equal(di, i) and blob.dtype == torch.uint8
    blob = encode(v, i, numel, 2)
    qv, qi = decode(blob, numel, 2)
    assert torch.equal(qi, i) and torch.equal(torch.sign(qv), torch.sign(v))
    assert blob.numel() == encoded_bytes(400, 4, numel, 2) == 2 * 4 + 2 * 400 + 8 * 4 + 100
    for c in range(4):  # two magnitude levels per chunk, each the mean of its class
        sel = (i >= c * CHUNK) & (i < (c + 1) * CHUNK)
        levels = torch.unique(qv[sel].abs())
        assert levels.numel() == 2
        high = v[sel].abs() > v[sel].abs().mean()
        torch.testing.assert_close(levels, torch.stack([v[sel].abs()[~high].mean(), v[sel].abs()[high].mean()]))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method, algorithm", [("sparseloco", None), ("sparseloco-gtopk", "butterfly"),
                                               ("sparseloco-gtopk", "tree")])
def test_sparseloco_collectives_conserve_mass_and_agree_on_every_rank(method: str, algorithm: str | None) -> None:
    numel, k = 2 * CHUNK + 333, 150
    for world in (1, 2, 3, 4, 6):
        steps = _steps(method, world, numel, {"ef_decay": 0.5}, algorithm=algorithm)
        gen = torch.Generator().manual_seed(world)
        for it in range(3):
            residuals = [s.memory.residual.clone() for s in steps]
            deltas = [torch.randn(numel, generator=gen) for _ in steps]
            contributions, results = _round(steps, deltas, k, it)
            for c, d, e in zip(contributions, deltas, residuals):  # oracle: acc = beta e + Delta
                torch.testing.assert_close(c.acc, d + 0.5 * e)
            for res in results:
                assert torch.equal(res.values, results[0].values) and torch.equal(res.indices, results[0].indices)
            if method == "sparseloco-gtopk":
                assert results[0].indices.numel() <= k
            G = torch.zeros(numel).index_add_(0, results[0].indices.long(), results[0].values)
            # mass: what the buffers keep plus what was applied is what the ranks compensated
            torch.testing.assert_close(sum(s.memory.residual for s in steps) + G, sum(c.acc for c in contributions),
                                       rtol=1e-5, atol=1e-5)
            sent = [r.stats.bytes_sent - 16 * r.stats.messages for r in results]
            predicted = get_method(method).predicted_bytes_per_rank(numel, k, world, algorithm=algorithm)
            assert sum(sent) / world <= predicted + 1e-9
            if method == "sparseloco":  # every chunk non-empty: the formula is exact
                assert sum(sent) / world == pytest.approx(predicted)
            # encoding a rank's own selection is its compression (charged as its selection);
            # it happens where that selection travels before any merge: every rank of the
            # allgather (P = 1 too: it sums the quantised values) and of a power-of-two
            # butterfly, the tree's leaves; gTop-k's one rank keeps its own
            compress = [r.stats.compress_cpu_s for r in results]
            if world == 1:
                assert (compress[0] > 0) == (method == "sparseloco"), compress
            elif algorithm == "tree" and world == 4:
                assert compress[0] == 0.0 and compress[1] > 0 and compress[3] > 0
            elif algorithm != "tree" and world in (2, 4):
                assert all(c > 0 for c in compress), compress


@pytest.mark.timeout(20)
def test_sparseloco_gtopk_quantises_what_travels_and_keeps_the_top_k() -> None:
    """An independent butterfly at P = 2: each rank encodes its chunk top-k, both sum the two
    decoded vectors and keep the k largest."""
    numel, k = CHUNK + 50, 60
    gen = torch.Generator().manual_seed(9)
    accs = [torch.randn(numel, generator=gen) for _ in range(2)]
    call = CommCall(numel=numel, k=k, algorithm="butterfly", options={"quant_bits": 2})
    contributions = []
    for a in accs:
        v, i = chunk_topk(a, k)
        contributions.append(Contribution(gradient=a, acc=a, values=v, indices=i))
    results = get_method("sparseloco-gtopk").comm.simulate(contributions, call)
    total = torch.zeros(numel)
    for c in contributions:
        q, i = decode(encode(c.values, c.indices, numel, 2), numel, 2)
        total.index_add_(0, i.long(), q)
    # the k largest |sum|, ties (two levels per chunk make many) to the lower index
    keep = torch.sort(total.abs(), descending=True, stable=True).indices[:k].sort().values
    for res in results:
        assert torch.equal(res.indices.long(), keep)
        torch.testing.assert_close(res.values, total[keep])


@pytest.mark.timeout(90)
@pytest.mark.parametrize("method", ["clt-k", "ef21-sgdm", "sparseloco-gtopk"])
def test_a_resumed_simulation_reaches_the_uninterrupted_weights(method: str, tmp_path) -> None:
    """The methods' own state (filtered memory, EF21 estimates and momentum, decayed error
    buffer, anchor and inner AdamW between syncs) goes through epoch checkpoints."""
    from gtopk_lab.training.simulator import simulate

    full = _config(method, train_samples=96, epochs=2, max_iterations=None, checkpoint=True,
                   lr=1e-3 if "loco" in method else 0.05, extra={"sync_every": 2} if "loco" in method else {})
    folder = str(tmp_path / "ck")
    first = simulate(full.replace(epochs=1), checkpoint_dir=folder)  # 3 iterations: mid-round for H = 2
    resumed = simulate(full, checkpoint_dir=folder, resume_from=folder)
    assert min(r["iteration"] for r in resumed.rows if r["kind"] == "iter") == first.summary["iterations"] == 3
    assert torch.equal(simulate(full).final_weights, resumed.final_weights)


# --------------------------------------------------------------------------- real gloo ranks
def _real_job(rank: int, world: int, configs: dict) -> dict:
    from gtopk_lab.training.loop import train_rank

    out = {}
    for name, cfg in configs.items():
        result = train_rank(RunConfig.from_dict(cfg))
        out[name] = (result.final_weights, [(row["iteration"], row["bytes_sent"]) for row in result.rows
                                            if row["kind"] == "iter"])
    return out


def _modern_configs() -> dict[str, RunConfig]:
    local = dict(lr=1e-3, extra={"sync_every": 2})
    short = dict(workers=2, max_iterations=4)  # two syncs of the local-steps methods
    return {"clt-k": _config("clt-k", **short), "ef21": _config("ef21", **short),
            "ef21-sgdm": _config("ef21-sgdm", **short), "diloco": _config("diloco", **short, **local),
            "sparseloco": _config("sparseloco", **short, **local),
            "sparseloco-gtopk": _config("sparseloco-gtopk", **short, **local),
            "sparseloco-gtopk-tree": _config("sparseloco-gtopk", algorithm="tree", **short, **local)}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_real_gloo_ranks_equal_the_simulator() -> None:
    from gtopk_lab.comm.launch import run_gloo
    from gtopk_lab.training.simulator import simulate

    configs = _modern_configs()
    real = run_gloo(_real_job, 2, {n: c.to_dict() for n, c in configs.items()}, timeout_s=200)
    for name, config in configs.items():
        sim = simulate(config)
        weights = [r[name][0] for r in real]
        assert torch.equal(weights[0], weights[1]), name  # identical on every rank
        if get_method(config.method).comm.name == "allreduce":  # gloo's dense sum order is its own
            torch.testing.assert_close(sim.final_weights, weights[0], rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(sim.final_weights, weights[0]), name
        sim_sent = sorted((row["rank"], row["iteration"], row["bytes_sent"]) for row in sim.rows
                          if row["kind"] == "iter")
        assert sorted((rank, it, b) for rank, r in enumerate(real) for it, b in r[name][1]) == sim_sent, name


# --------------------------------------------------------------------------- DDP hook
def _hook_job(rank: int, world: int) -> dict:
    from test_ddp_hook import _batch, _net, _train_ddp

    from gtopk_lab.config import k_for
    from gtopk_lab.integrations.ddp_hook import SparseHookState
    from gtopk_lab.training.step import communicate

    out = {}
    for name in ("clt-k", "ef21"):
        hooked, _ = _train_ddp(rank, SparseHookState(density=0.05, method=name, warmup_iterations=0), steps=20)
        model = _net()  # the training step without DDP, parameters in DDP's bucket order (reversed)
        params = list(reversed(list(model.parameters())))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        numel = sum(p.numel() for p in params)
        step = RankStep(get_method(name), numel, CPU, rank=rank, world=world)
        k = k_for(numel, 0.05)
        for it in range(20):
            x, y = _batch(rank, it)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            contribution = step.prepare(torch.cat([p.grad.reshape(-1) for p in params]), k, it)
            result = communicate(step.method, contribution, step.call(k, it))
            step.finish(contribution, result)
            dense = step.aggregate(result, CPU) / world
            offset = 0
            for p in params:
                p.grad.copy_(dense[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            opt.step()
        out[name] = (hooked, torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    return out


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_cltk_and_ef21_as_ddp_hooks_equal_the_training_step() -> None:
    from gtopk_lab.comm.launch import run_gloo

    out = run_gloo(_hook_job, 2, timeout_s=150)
    for rank in out:
        for name, (hooked, reference) in rank.items():
            torch.testing.assert_close(hooked, reference, rtol=1e-5, atol=1e-6, msg=name)
            torch.testing.assert_close(hooked, out[0][name][0], rtol=0, atol=0, msg=name)
