"""The simulator's batched virtual ranks (gtopk_lab.training.batched_ranks) against its
sequential path: every registered method gives the same weights and losses within float
tolerance, or is refused with the one line that says why; refusals of models with buffers
or dropout; the compute charge of a batched call; the option's checks."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from gtopk_lab.config import RunConfig
from gtopk_lab.methods import available_methods, get_method
from gtopk_lab.training.batched_ranks import BatchedGradients, use_batched
from gtopk_lab.training.models import MODELS, ModelSpec
from gtopk_lab.training.replica import Replica
from gtopk_lab.training.simulator import simulate

WORLD = 4
ITERATIONS = 3


def _bn_model(num_classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(40, 16), nn.BatchNorm1d(16), nn.Linear(16, num_classes))


def _dropout_model(num_classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(40, 16), nn.Dropout(0.1), nn.Linear(16, num_classes))


@pytest.fixture(scope="module", autouse=True)
def test_models():
    MODELS.setdefault("batched_bn", ModelSpec("batched_bn", _bn_model, (40,), 10, ("mnist1d",),
                                              description="test: a BatchNorm layer"))
    MODELS.setdefault("batched_dropout", ModelSpec("batched_dropout", _dropout_model, (40,), 10, ("mnist1d",),
                                                   description="test: a dropout layer"))
    yield
    MODELS.pop("batched_bn", None)
    MODELS.pop("batched_dropout", None)


def _config(method: str, batched: str, model: str = "mlp", **kw) -> RunConfig:
    extra: dict = {"return_weights": True}
    if get_method(method).local_steps:
        extra["sync_every"] = 2
    fields = dict(method=method, workers=WORLD, model=model, dataset="mnist1d", train_samples=WORLD * 8 * 4,
                  test_samples=32, batch_size=8, epochs=10, max_iterations=ITERATIONS, density=0.05, lr=0.05,
                  momentum=0.9, bandwidth="1GbE", sink_every=ITERATIONS, simulator={"batched": batched},
                  extra=extra)
    return RunConfig(**{**fields, **kw})


def _losses(rows: list[dict]) -> list[tuple[int, int, float]]:
    return sorted((r["rank"], r["iteration"], r["train_loss"]) for r in rows if r["kind"] == "iter")


@pytest.mark.timeout(120)
def test_every_registered_method_batched_equals_sequential_or_is_refused() -> None:
    methods = available_methods()
    assert len(methods) >= 14
    batched_count = 0
    for m in methods:
        sequential = simulate(_config(m, "off"))
        assert sequential.summary["batched_ranks"] is False
        if get_method(m).local_steps:
            with pytest.raises(ValueError) as refusal:
                simulate(_config(m, "on"))
            assert str(refusal.value) == (f"simulator.batched='on' is invalid for this run: method {m!r} takes "
                                          "local steps: each virtual rank's weights diverge between synchronisations")
            auto = simulate(_config(m, "auto"))  # falls back: the sequential path, bitwise
            assert auto.summary["batched_ranks"] is False and "local steps" in auto.summary["batched_ranks_refusal"]
            assert torch.equal(auto.final_weights, sequential.final_weights), m
            continue
        batched = simulate(_config(m, "auto"))
        assert batched.summary["batched_ranks"] is True, m
        assert batched.summary["compute_s_attribution"] == "one_rank_call"
        torch.testing.assert_close(batched.final_weights, sequential.final_weights, rtol=1e-5, atol=1e-6,
                                   msg=lambda text, m=m: f"{m}: {text}")
        seq_losses, bat_losses = _losses(sequential.rows), _losses(batched.rows)
        assert [x[:2] for x in seq_losses] == [x[:2] for x in bat_losses]
        assert all(abs(a[2] - b[2]) <= 1e-5 * max(1.0, abs(a[2])) for a, b in zip(seq_losses, bat_losses)), m
        # the same bytes each rank sent: the same selections, so the same collectives
        assert ([r["bytes_sent"] for r in sequential.rows if r["kind"] == "iter"]
                == [r["bytes_sent"] for r in batched.rows if r["kind"] == "iter"]), m
        batched_count += 1
    assert batched_count >= 10  # not vacuous: most methods batch


@pytest.mark.timeout(60)
def test_batched_gradients_are_each_ranks_own_gradient() -> None:
    config = _config("dense", "on", model="cnn")
    replica = Replica(config, WORLD, torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(8, 40, generator=gen) for _ in range(WORLD)]
    ys = [torch.randint(0, 10, (8,), generator=gen) for _ in range(WORLD)]
    grads, losses = BatchedGradients(replica)(xs, ys)
    assert grads.shape == (WORLD, replica.numel) and losses.shape == (WORLD,)
    for r in range(WORLD):  # oracle: plain autograd, one rank at a time, in parameter order
        replica.model.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(replica.model(xs[r]), ys[r])
        own = torch.autograd.grad(loss, replica.params)
        torch.testing.assert_close(grads[r], torch.cat([g.reshape(-1) for g in own]), rtol=1e-5, atol=1e-7)
        assert abs(float(losses[r]) - float(loss.detach())) < 1e-6
    assert not torch.allclose(grads[0], grads[1])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("model", "reason"), [
    ("batched_bn", "the model has buffers (2.running_mean, ...): each virtual rank keeps its own BatchNorm "
                   "statistics"),
    ("batched_dropout", "the model has dropout (2): each virtual rank draws its own dropout masks"),
])
def test_models_with_buffers_or_dropout_are_refused_and_auto_falls_back(model: str, reason: str) -> None:
    with pytest.raises(ValueError, match="^simulator.batched='on' is invalid for this run: ") as refusal:
        simulate(_config("gtopk", "on", model=model))
    assert str(refusal.value).endswith(reason) and "\n" not in str(refusal.value)
    auto, off = simulate(_config("gtopk", "auto", model=model)), simulate(_config("gtopk", "off", model=model))
    assert auto.summary["batched_ranks"] is False and auto.summary["batched_ranks_refusal"] == reason
    assert auto.summary["compute_s_attribution"] == "per_rank"
    assert torch.equal(auto.final_weights, off.final_weights)


@pytest.mark.timeout(60)
def test_batched_call_is_charged_to_every_rank_alike_and_fixed_compute_wins() -> None:
    result = simulate(_config("gtopk", "on", model="cnn"))
    rows = [r for r in result.rows if r["kind"] == "iter"]
    for it in range(ITERATIONS):  # rank 0's own pass, every rank alike
        computes = {r["compute_s"] for r in rows if r["iteration"] == it}
        assert len(computes) == 1 and computes.pop() > 0
    fixed = simulate(_config("gtopk", "on", model="cnn", compute_charge={"compute_time_s": 0.01}))
    assert fixed.summary["compute_s_attribution"] == "fixed" and fixed.summary["batched_ranks"] is True
    assert all(r["compute_s"] == 0.01 for r in fixed.rows if r["kind"] == "iter")


def _spin_cpu_s(seconds: float) -> None:
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


@pytest.mark.timeout(120)
def test_a_batched_rank_is_charged_its_own_pass_not_a_pth_of_the_batched_call(monkeypatch) -> None:
    """Each rank pays its own forward/backward; the batched call pays the per-call overheads once
    for P ranks, so 1/P of it charged a virtual rank a third of a real one's pass (the CNN at
    P = 4). Oracle: rank 0's own pass made to cost 30 ms of CPU more (a spin inside
    ``Replica.forward_backward``, which the batched gradients never call), so every charged
    compute is at least 30 ms, while the batched call / P stays far below; the pass is made at
    the first 4 iterations and every 8th after (20 iterations: 4 + iterations 8 and 16)."""
    own = Replica.forward_backward
    calls = []

    def slow_own_pass(self, x, y):
        calls.append(tuple(x.shape))
        _spin_cpu_s(0.03)
        return own(self, x, y)

    monkeypatch.setattr(Replica, "forward_backward", slow_own_pass)
    result = simulate(_config("gtopk", "on", model="cnn", max_iterations=20, train_samples=WORLD * 8 * 21,
                              sink_every=20))
    assert result.summary["compute_s_attribution"] == "one_rank_call"
    assert len(calls) == 6 and all(shape == (8, 40) for shape in calls)  # one rank's batch
    rows = [r for r in result.rows if r["kind"] == "iter"]
    assert len(rows) == WORLD * 20
    assert min(r["compute_s"] for r in rows) >= 0.03
    assert max(r["compute_s"] for r in rows) < 0.03 + 1.0  # a median of spun passes, not a sum
    assert result.summary["compute_s_virtual"] >= 0.03  # per iteration


@pytest.mark.timeout(10)
def test_option_checks() -> None:
    with pytest.raises(ValueError, match=r"^simulator.batched='yes' is invalid: expected one of auto, on, off"):
        RunConfig(simulator={"batched": "yes"})
    assert RunConfig(extra={"sim_batched": "off"}).simulator.batched == "off"
    assert use_batched(None, None) and use_batched("auto", None) and not use_batched("off", None)
    assert not use_batched("auto", "a reason")
    assert not use_batched("auto", None, world=1) and use_batched("on", None, world=1)  # one rank: nothing to batch
    assert not use_batched("auto", None, slower="why") and use_batched("on", None, slower="why")


@pytest.mark.timeout(60)
def test_gpt_stays_sequential_under_auto_and_batches_when_asked() -> None:
    base = dict(model="gpt_tiny", dataset="text", train_samples=10**6, test_samples=8, batch_size=2)
    auto = simulate(_config("dense", "auto", **base).replace(max_iterations=2))
    assert auto.summary["batched_ranks"] is False
    assert auto.summary["batched_ranks_refusal"].startswith("model 'gpt_tiny': batched it is compute-bound")
    on = simulate(_config("dense", "on", **base).replace(max_iterations=2))
    assert on.summary["batched_ranks"] is True
    torch.testing.assert_close(on.final_weights, auto.final_weights, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="^simulator.batched='on' is invalid for this run: a reason$"):
        use_batched("on", "a reason")
