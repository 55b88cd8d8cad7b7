"""Per-layer gradients of P virtual ranks from one plain backward
(gtopk_lab.training.layer_grads) against plain autograd run one rank at a time, written here:
the registered Linear / Conv1d models and a model with dilation, strides and a Linear over
3-D activations; each Conv1d form (windows, stride phases) against ``conv1d_weight`` per rank;
the refusals; a layer called twice; and the batched call's fallback to vmap where the model
uses a layer's weight outside the layer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gtopk_lab.config import RunConfig
from gtopk_lab.training.batched_ranks import BatchedGradients
from gtopk_lab.training import layer_grads
from gtopk_lab.training.layer_grads import LayerGradients, conv1d_rank_grads, layer_grads_refusal
from gtopk_lab.training.models import build_model
from gtopk_lab.training.replica import Replica
from gtopk_lab.training.simulator import simulate


class _Dilated(nn.Module):
    """Conv1d with dilation, stride and padding 2, no bias on one layer, and a Linear applied
    to [N, C, L] activations (over the last dimension)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv1d(1, 6, 3, stride=1, padding=2, dilation=2)
        self.b = nn.Conv1d(6, 5, 4, stride=3, padding=0, bias=False)
        self.mix = nn.Linear(13, 7)
        self.out = nn.Linear(5 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.b(torch.relu(self.a(x.view(x.shape[0], 1, -1)))))
        return self.out(torch.relu(self.mix(h)).flatten(1))


class _Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(40, 40)
        self.out = nn.Linear(40, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.fc(torch.relu(self.fc(x))))


class _WeightOutside(_Twice):
    """Calls each layer once, and also reads ``fc.weight`` directly: hooks cannot see that."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc(x)) + x @ self.fc.weight)


def _per_rank_oracle(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    grads, losses = [], []
    for r in range(x.shape[0]):
        loss = F.cross_entropy(model(x[r]), y[r])
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
        losses.append(loss.detach())
    return torch.stack(grads), torch.stack(losses)


def _batch(world: int, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(world, batch, 40, generator=gen), torch.randint(0, 10, (world, batch), generator=gen)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["mlp", "cnn", "cnn_wide", "dilated"])
def test_each_ranks_gradient_equals_its_own_backward(name: str) -> None:
    torch.manual_seed(1)
    model = _Dilated() if name == "dilated" else build_model(name)
    params = [p for p in model.parameters() if p.requires_grad]
    assert layer_grads_refusal(model, params) is None
    x, y = _batch(world=5, batch=6)
    grads, losses = LayerGradients(model, params, F.cross_entropy)(x, y)
    want_g, want_l = _per_rank_oracle(model, x, y)
    assert grads.shape == (5, sum(p.numel() for p in params))
    torch.testing.assert_close(grads, want_g, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(losses, want_l, rtol=1e-6, atol=1e-6)
    assert all(p.grad is None for p in params)  # no weight gradient was formed


@pytest.mark.timeout(60)
@pytest.mark.parametrize("form", ["windows", "phases"])
@pytest.mark.parametrize("channels", [1, 3, 8, 25])
@pytest.mark.parametrize("kernel,stride,padding,dilation,length_in", [
    (3, 2, 1, 1, 19), (5, 2, 1, 1, 40), (3, 1, 0, 2, 17), (4, 3, 2, 2, 23), (2, 1, 3, 1, 9),
    (5, 2, 4, 3, 6), (1, 2, 0, 1, 11), (7, 4, 7, 1, 3)])
def test_conv1d_rank_grads_equal_conv1d_weight_rank_by_rank(
        monkeypatch: pytest.MonkeyPatch, form: str, channels: int, kernel: int, stride: int, padding: int,
        dilation: int, length_in: int) -> None:
    """Both forms (the kernel windows' einsum, or its transposed bmm below 8 columns C K, as
    channels 1 and 3 give with short kernels; the stride phases' bmms), strides and
    dilations whose taps land in every phase, padding wider than the kernel's reach and a
    kernel as long as the padded input."""
    monkeypatch.setattr(layer_grads, "_phases_pay", lambda *_: form == "phases")
    world, batch = 3, 4
    layer = nn.Conv1d(channels, 5, kernel, stride=stride, padding=padding, dilation=dilation)
    gen = torch.Generator().manual_seed(channels * 100 + kernel)
    a = torch.randn(world * batch, channels, length_in, generator=gen)
    length = (length_in + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    g = torch.randn(world * batch, 5, length, generator=gen)
    if channels == 8:  # an output gradient autograd hands over transposed: the same values
        g = g.transpose(1, 2).contiguous().transpose(1, 2)
    weight, bias = conv1d_rank_grads(a, g, layer, world)
    for r in range(world):
        rows = slice(r * batch, (r + 1) * batch)
        want = torch.nn.grad.conv1d_weight(a[rows], layer.weight.shape, g[rows], stride=stride,
                                           padding=padding, dilation=dilation)
        torch.testing.assert_close(weight[r], want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(bias[r], g[rows].sum((0, 2)), rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(30)
def test_phases_are_taken_where_they_pay() -> None:
    """The MNIST-1D CNN's 25-channel layers at B = 16 take the phases; its first layer (one
    input channel) and the wide CNN's 192-channel layers the windows (measured, module doc)."""
    assert layer_grads._phases_pay(25, 25, 16, 10) and layer_grads._phases_pay(25, 25, 16, 5)
    assert not layer_grads._phases_pay(1, 25, 16, 19)
    assert not layer_grads._phases_pay(192, 192, 16, 10) and not layer_grads._phases_pay(192, 192, 16, 5)


@pytest.mark.timeout(30)
def test_refusals_name_the_module_and_a_layer_called_twice_is_one_line() -> None:
    bn = nn.Sequential(nn.Linear(40, 8), nn.BatchNorm1d(8), nn.Linear(8, 10))
    assert "module '1' (BatchNorm1d) has parameters" in layer_grads_refusal(bn, list(bn.parameters()))
    grouped = nn.Sequential(nn.Unflatten(1, (4, 10)), nn.Conv1d(4, 4, 3, groups=2), nn.Flatten(), nn.Linear(32, 10))
    assert "grouped" in layer_grads_refusal(grouped, list(grouped.parameters()))
    tied = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10))
    tied[1].weight = tied[0].weight
    assert "shared with '0'" in layer_grads_refusal(tied, list(tied.parameters()))
    extra = nn.Parameter(torch.zeros(3))
    assert "outside the model's layers" in layer_grads_refusal(nn.Linear(3, 3), [extra])
    twice = _Twice()
    with pytest.raises(ValueError, match="a Linear layer ran 2 times in one forward: expected once"):
        LayerGradients(twice, list(twice.parameters()), F.cross_entropy)(*_batch(2, 3))
    with pytest.raises(ValueError, match="LayerGradients is invalid for this model: module '1'"):
        LayerGradients(bn, list(bn.parameters()), F.cross_entropy)


def _replica_with(model: nn.Module) -> Replica:
    replica = Replica(RunConfig(model="mlp", workers=2, dataset="mnist1d"), 2, torch.device("cpu"))
    replica.model = model
    replica.params = [p for p in model.parameters() if p.requires_grad]
    return replica


@pytest.mark.timeout(60)
@pytest.mark.parametrize("model, rule, why", [
    (_Dilated, "layers", None),
    (_WeightOutside, "vmap", "per-layer gradients differ from vmap's by"),
    (_Twice, "vmap", "per-layer gradients failed: a Linear layer ran 2 times"),
])
def test_the_batched_call_checks_layers_against_vmap_once_and_keeps_vmap_where_they_differ(
        model: type, rule: str, why: str | None) -> None:
    torch.manual_seed(2)
    net = model()
    batched = BatchedGradients(_replica_with(net))
    x, y = _batch(3, 4, seed=5)
    grads, losses = batched(x, y)
    assert batched.rule == rule and (why is None) == (batched.rule_refusal is None)
    if why is not None:
        assert batched.rule_refusal.startswith(why), batched.rule_refusal
    want_g, want_l = _per_rank_oracle(net, x, y)
    torch.testing.assert_close(grads, want_g, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(losses, want_l, rtol=1e-6, atol=1e-6)
    again, _ = batched(*_batch(3, 4, seed=6))  # checked once: the second call takes the chosen path
    assert batched.rule == rule and again.shape == grads.shape


@pytest.mark.timeout(60)
def test_simulated_cnn_run_says_it_took_the_layers_and_equals_the_sequential_run() -> None:
    fields = dict(method="gtopk", workers=4, model="cnn", dataset="mnist1d", train_samples=4 * 8 * 3,
                  test_samples=32, batch_size=8, epochs=1, max_iterations=3, density=0.05,
                  sink_every=3, extra={"return_weights": True})
    on = simulate(RunConfig(**fields, simulator={"batched": "on"}))
    off = simulate(RunConfig(**fields, simulator={"batched": "off"}))
    assert on.summary["batched_gradients"] == "layers" and on.summary["batched_gradients_refusal"] is None
    assert off.summary["batched_gradients"] is None
    torch.testing.assert_close(on.final_weights, off.final_weights, rtol=1e-4, atol=1e-6)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("model,dataset", [("mlp", "mnist1d"), ("gpt_tiny", "text")])
def test_rank_losses_equal_each_ranks_own_loss(model: str, dataset: str) -> None:
    """Replica.rank_losses (the per-layer path's P losses in one call) against Replica.loss
    on each rank's rows alone: a classifier and a language model (tokens per sample)."""
    replica = Replica(RunConfig(model=model, workers=3, dataset=dataset), 3, torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    if replica.language_model:
        vocab = 50
        out, y = torch.randn(3 * 2, 7, vocab, generator=gen), torch.randint(0, vocab, (3, 2, 7), generator=gen)
    else:
        out, y = torch.randn(3 * 4, 10, generator=gen), torch.randint(0, 10, (3, 4), generator=gen)
    want = torch.stack([replica.loss(out[r * y.shape[1]:(r + 1) * y.shape[1]], y[r]) for r in range(3)])
    torch.testing.assert_close(replica.rank_losses(out, y), want, rtol=1e-6, atol=1e-6)
