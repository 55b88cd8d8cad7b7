"""Conformance matrix: every registered method, and the test plugin's, through the four drivers
of the one training step gives the same trajectory, or is refused with one line.

Drivers: real gloo ranks (``train_rank``), the simulator (``simulate``), the DDP hook
(``gtopk_hook``, whole-model selection) and wait-free overlap (``WaitFreeBackprop``,
``scope="model"``). The DDP hook and overlap sit in a user's own loop (a plain model, the
run's optimiser and learning rate, the rank's shard), as a user would write it.

Set-up, lean: P = 2, a model of one 40 x 10 weight matrix (so DDP's bucket order and the
replica's flat order are the same order and the layout is one matrix), synthetic data, 6
iterations (3 synchronisations of the local-steps methods at ``sync_every=2``), SGD with
momentum 0.9, one gloo group that runs every method in sequence.

Agreement, tolerance 0: per method, the final weights and every iteration's loss of the
simulator's sequential path (``simulator.batched="off"``), the DDP hook and overlap are bitwise
those of the real ranks (and both real ranks bitwise alike); the simulator's batched ranks
(the default where allowed: a vmapped forward/backward) agree within ``rtol=1e-5``. At P = 2 every sum the collectives form has two terms, so no summation order
can change a bit; the float kernels are the same in every driver. A local-steps method is
refused by the DDP hook and overlap with a one-line ValueError naming the method and the
driver. Two methods are also checked against an oracle written here, within ``rtol=1e-5,
atol=1e-6`` (it applies momentum in its own order; measured: 1.5e-8 on weights of 0.2, while
leaving out the drops' residual moves gTop-k's by 5e-2): dense S-SGD (SGD on the averaged
gradient) and gTop-k at P = 2 (a brute-force top-k of the sum of both ranks' local top-k,
mass-rule residuals: rank 0 owns the merge's drops).

Calibration (``measure_iteration_times``), the fifth driver, times the method's own memory and
a callable selector through the step: the last test counts their calls.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gtopk_lab.config import RunConfig, k_for
from gtopk_lab.integrations.ddp_hook import SparseHookState, gtopk_hook
from gtopk_lab.integrations.overlap import WaitFreeBackprop
from gtopk_lab.methods import available_methods, get_method
from gtopk_lab.training.models import MODELS, ModelSpec, build_model
from gtopk_lab.training.optim import lr_at, make_optimizer, set_lr
from gtopk_lab.training.runtime import run_dataset
from gtopk_lab.training.shards import Shard

WORLD = 2
ITERATIONS = 6
MODEL = "conformance_linear"
#: the oracles' results against the real ranks' (see the module docstring)
ORACLE_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def _linear(num_classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(40, num_classes, bias=False))


def _register_model() -> None:
    """The test's model in the registry (in the test process and in every rank)."""
    MODELS.setdefault(MODEL, ModelSpec(MODEL, _linear, (40,), 10, ("synthetic",),
                                       description="test: one 40 x 10 weight matrix"))


@pytest.fixture(scope="module", autouse=True)
def setting(lab_test_methods):
    _register_model()
    yield
    MODELS.pop(MODEL, None)


def _config(method: str) -> RunConfig:
    extra: dict = {"return_weights": True}
    if get_method(method).local_steps:
        extra["sync_every"] = 2
    return RunConfig(method=method, workers=WORLD, model=MODEL, dataset="synthetic",
                     train_samples=WORLD * 8 * ITERATIONS, test_samples=16, batch_size=8, epochs=1,
                     max_iterations=ITERATIONS, density=0.05, lr=0.05, momentum=0.9, bandwidth="1GbE",
                     sink_every=ITERATIONS, extra=extra)


# --------------------------------------------------------------------------- the drivers
def _losses(rows: list[dict]) -> list[float]:
    return [r["train_loss"] for r in sorted(rows, key=lambda r: r["iteration"]) if r["kind"] == "iter"]


def _user_loop(config: RunConfig, rank: int, driver: str) -> tuple[torch.Tensor, list[float]]:
    """A user's loop around the DDP hook or overlap: the replica's initial weights, optimiser,
    learning rate and shard; returns (final flat weights, loss per iteration)."""
    torch.manual_seed(config.seed)
    net = build_model(config.model)
    shard = Shard(run_dataset(config), rank, WORLD, config.batch_size, config.seed,
                  split=config.data_split, alpha=config.dirichlet_alpha)
    batches = shard.epoch(0)
    opt = make_optimizer(net, config)
    model: nn.Module = net
    wfbp = None
    if driver == "ddp":
        model = DDP(net)
        model.register_comm_hook(SparseHookState(density=config.density, method=config.method,
                                                 warmup_iterations=0), gtopk_hook)
    else:
        wfbp = WaitFreeBackprop(net, density=config.density, method=config.method, scope="model")
    losses = []
    for it in range(ITERATIONS):
        x, y = next(batches)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if wfbp is not None:
            wfbp.finish()
        set_lr(opt, lr_at(config, it / shard.iterations_per_epoch, WORLD))
        opt.step()
        losses.append(float(loss.detach()))
    if wfbp is not None:
        wfbp.close()
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]), losses


def _rank_job(rank: int, world: int, configs: dict[str, dict], per_step: list[str]) -> dict:
    from gtopk_lab.training.loop import train_rank

    _register_model()
    out: dict = {}
    for name, config_dict in configs.items():
        config = RunConfig.from_dict(config_dict)
        real = train_rank(config)
        out[name] = {"real": (real.final_weights, _losses(real.rows))}
        if name in per_step:
            out[name]["ddp"] = _user_loop(config, rank, "ddp")
            out[name]["overlap"] = _user_loop(config, rank, "overlap")
    dist.barrier()
    return out


# --------------------------------------------------------------------------- oracles
def _oracle(config: RunConfig, method: str) -> torch.Tensor:
    """Final weights computed here, independently of the step: per iteration both ranks'
    gradients at the shared weights, then dense: ``G = g_0 + g_1``; gtopk: ``acc_r = g_r + e_r``,
    ``S_r = top-k |acc_r|``, ``u = sum_r acc_r on S_r``, ``G = u on top-k |u|``,
    ``e_r = acc_r off S_r`` plus, on rank 0, ``u`` on the union's dropped entries; then SGD with
    momentum on ``G / P``."""
    torch.manual_seed(config.seed)
    net = build_model(config.model)
    dataset = run_dataset(config)
    shards = [Shard(dataset, r, WORLD, config.batch_size, config.seed, split=config.data_split,
                    alpha=config.dirichlet_alpha).epoch(0) for r in range(WORLD)]
    w = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    d = w.numel()
    k = k_for(d, config.density)
    residuals = [torch.zeros(d) for _ in range(WORLD)]
    velocity = torch.zeros(d)
    for it in range(ITERATIONS):
        grads = []
        for batches in shards:
            x, y = next(batches)
            net.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
        if method == "dense":
            total = grads[0] + grads[1]
        else:
            accs = [g + e for g, e in zip(grads, residuals)]
            chosen = [torch.zeros(d, dtype=torch.bool) for _ in accs]
            for mask, acc in zip(chosen, accs):
                mask[torch.topk(acc.abs(), k).indices] = True
            merged = sum(torch.where(mask, acc, torch.zeros(d)) for mask, acc in zip(chosen, accs))
            union = chosen[0] | chosen[1]
            kept = torch.zeros(d, dtype=torch.bool)
            kept[torch.topk(torch.where(union, merged.abs(), torch.full((d,), -1.0)), k).indices] = True
            total = torch.where(kept, merged, torch.zeros(d))
            residuals = [torch.where(mask, torch.zeros(d), acc) for mask, acc in zip(chosen, accs)]
            residuals[0] = residuals[0] + torch.where(union & ~kept, merged, torch.zeros(d))
        velocity = config.momentum * velocity + total / WORLD
        w = w - config.lr * velocity
        with torch.no_grad():
            net[1].weight.copy_(w.view_as(net[1].weight))
    return w


# --------------------------------------------------------------------------- the matrix
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_method_through_every_driver() -> None:
    from gtopk_lab.comm.launch import run_gloo
    from gtopk_lab.training.simulator import simulate

    methods = available_methods()
    assert len(methods) >= 20 and "test-ring" in methods  # 14 built in + the test plugin's 6
    configs = {m: _config(m) for m in methods}
    per_step = [m for m in methods if not get_method(m).local_steps]
    for m in methods:
        if m in per_step:
            continue
        with pytest.raises(ValueError) as hook_refusal:
            SparseHookState(method=m)
        assert str(hook_refusal.value).startswith(f"method={m!r} is invalid for the DDP hook: it takes local")
        with pytest.raises(ValueError) as overlap_refusal:
            WaitFreeBackprop(_linear(), density=0.05, method=m, scope="model")
        assert str(overlap_refusal.value).startswith(f"method={m!r} is invalid for wait-free overlap:")
        assert "\n" not in str(hook_refusal.value) + str(overlap_refusal.value)

    ranks = run_gloo(_rank_job, WORLD, {m: c.to_dict() for m, c in configs.items()}, per_step, timeout_s=200)
    for m in methods:
        weights, losses = ranks[0][m]["real"]
        assert torch.equal(ranks[1][m]["real"][0], weights), m  # identical replicas
        assert len(losses) == ITERATIONS
        # the simulator's sequential path is bitwise the real ranks'; its batched ranks (a
        # vmapped forward/backward sums in another order) within float tolerance
        sim = simulate(configs[m].replace(simulator={"batched": "off"}))
        drivers = {"simulator": (sim.final_weights, _losses([r for r in sim.rows if r["rank"] == 0]))}
        batched = simulate(configs[m])
        assert batched.summary["batched_ranks"] is not get_method(m).local_steps, m
        torch.testing.assert_close(batched.final_weights, weights, rtol=1e-5, atol=1e-6)
        assert _losses([r for r in batched.rows if r["rank"] == 0]) == pytest.approx(losses, rel=1e-5), m
        if m in per_step:
            drivers.update({d: ranks[0][m][d] for d in ("ddp", "overlap")})
        for driver, (w, driver_losses) in drivers.items():
            assert torch.equal(w, weights), f"{m} through {driver}: {float((w - weights).abs().max())} off"
            assert driver_losses == losses, f"{m} through {driver}"
    assert not torch.allclose(ranks[0]["gtopk"]["real"][0], ranks[0]["dense"]["real"][0])  # not vacuous
    for m in ("dense", "gtopk"):
        torch.testing.assert_close(ranks[0][m]["real"][0], _oracle(configs[m], m), **ORACLE_TOLERANCE,
                                   msg=f"{m} against the oracle")


@pytest.mark.timeout(30)
def test_a_method_with_its_own_memory_is_refused_per_bucket() -> None:
    with pytest.raises(ValueError, match=r"^method='ef21' is invalid for the DDP hook with selection='bucket'"):
        SparseHookState(method="ef21", selection="bucket")
    SparseHookState(method="gtopk", selection="bucket")  # error feedback is kept per parameter


# --------------------------------------------------------------------------- calibration
class _CountingMemory:
    """Error feedback that records what it compensated (calibration must time this memory)."""

    calls: list[tuple[str, torch.Tensor]] = []

    def __init__(self, numel, rule, device):
        self.residual = torch.zeros(numel, device=device)

    def compensate(self, g):
        acc = g.reshape(-1) + self.residual
        _CountingMemory.calls.append(("compensate", acc))
        return acc

    def update(self, acc, values, indices, result):
        _CountingMemory.calls.append(("update", acc))
        self.residual = acc.clone()
        self.residual[indices.long()] = 0.0

    def state_dict(self):
        return {"residual": self.residual.clone()}

    def load_state_dict(self, state):
        self.residual = state["residual"].clone()


def _first_k(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A callable selector (not a registered name): the first k entries."""
    _CountingMemory.calls.append(("select", x, k))
    idx = torch.arange(k)
    return x[idx], idx


@pytest.mark.timeout(60)
def test_calibration_times_the_methods_own_memory_and_selector() -> None:
    from gtopk_lab.methods import Method, register_method, unregister_method
    from gtopk_lab.training.compute_time import measure_iteration_times

    register_method(Method(name="test-counted", selector=_first_k, collective="allgather",
                           memory=_CountingMemory))
    try:
        _CountingMemory.calls.clear()
        config = _config("test-counted")
        times = measure_iteration_times(config, repeats=3, warmup=1)
    finally:
        unregister_method("test-counted")
    calls = _CountingMemory.calls
    assert [c[0] for c in calls] == ["compensate", "select", "update"] * 4  # warm-up + 3 timed passes
    assert times["k"] == k_for(400, config.density) and all(c[2] == times["k"] for c in calls if c[0] == "select")
    for compensated, selected in zip(calls[0::3], calls[1::3]):  # the selector saw the memory's acc
        assert selected[1] is compensated[1]
