"""DGC momentum correction with weight decay as DGC's reference runs it: the gradient's momentum
in each rank's velocity (sparsified, masked), the decay's in a dense buffer of the optimiser
(``b = m b + wd w``, every coordinate, every step; synxlin/deep-gradient-compression,
``dgc/optim/sgd.py`` with ``dgc/memory.py``'s DGCSGDMemory and ``dgc/compression.py``).

The oracle is a port of the reference's step written here, run on a P = 2 quadratic for
30 steps next to the project's optimiser and training step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gtopk_lab.config import RunConfig
from gtopk_lab.methods import get_method
from gtopk_lab.training.optim import make_optimizer
from gtopk_lab.training.replica import Replica
from gtopk_lab.training.step import RankStep, communicate_simulated

P, D, K, STEPS = 2, 8, 2, 30
LR, M, WD = 0.05, 0.9, 0.1


def _problem() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank i's loss 0.5 * sum_j a_ij (w_j - c_ij)^2 (the oracle runs in float64)."""
    gen = torch.Generator().manual_seed(7)
    a = 0.5 + torch.rand(P, D, generator=gen, dtype=torch.float64)
    c = 4.0 * torch.randn(P, D, generator=gen, dtype=torch.float64)
    w0 = torch.randn(D, generator=gen, dtype=torch.float64)
    return a, c, w0


def _reference_dgc(a: torch.Tensor, c: torch.Tensor, w0: torch.Tensor, *, decay_in_velocity: bool = False
                   ) -> list[torch.Tensor]:
    """The reference's iteration, per rank i (momentum masking on, no Nesterov):

    1. ``mmt_i = m mmt_i + g_i``; ``vec_i += mmt_i`` (DGCSGDMemory.compensate)
    2. threshold = the smallest of the k largest |vec_i| (all entries are sampled when
       d <= 2 / ratio); keep |vec_i| >= threshold (DGCCompressor._sparsify)
    3. zero mmt_i and vec_i at the kept indices (DGCSGDMemory.update)
    4. sum the ranks' pairs and divide by P (decompress with Average)
    5. DGCSGD.step: ``buf = m buf + wd w`` (buf = wd w at the first step); ``w -= lr (buf + G/P)``

    ``decay_in_velocity``: the rule the project had before (wd w added to g_i in step 1 and
    no decay in step 5), for telling the two apart.
    """
    w = w0.clone()
    mmt = torch.zeros(P, D, dtype=torch.float64)
    vec = torch.zeros(P, D, dtype=torch.float64)
    buf = None
    path = []
    for _ in range(STEPS):
        total = torch.zeros(D, dtype=torch.float64)
        for i in range(P):
            g = a[i] * (w - c[i])
            if decay_in_velocity:
                g = g + WD * w
            mmt[i] = M * mmt[i] + g
            vec[i] += mmt[i]
            importance = vec[i].abs()
            threshold = importance.topk(K).values.min()
            kept = (importance >= threshold).nonzero().view(-1)[:K]
            total[kept] += vec[i][kept]
            mmt[i][kept] = 0.0
            vec[i][kept] = 0.0
        step = total / P
        if not decay_in_velocity:
            decay = WD * w
            buf = decay.clone() if buf is None else buf.mul_(M).add_(decay)
            step = step + buf
        w = w - LR * step
        path.append(w.clone())
    return path


class _Weights(nn.Module):
    def __init__(self, w0: torch.Tensor) -> None:
        super().__init__()
        self.w = nn.Parameter(w0.clone())


def _project_dgc(a: torch.Tensor, c: torch.Tensor, w0: torch.Tensor) -> list[torch.Tensor]:
    """The project's optimiser and training step on the same problem: each rank's plain
    gradient (autograd) through RankStep, the simulated allgather, G / P, optimizer.step()."""
    config = RunConfig(method="topk", momentum_correction=True, momentum=M, weight_decay=WD, lr=LR,
                       residual_rule="paper")
    method = get_method("topk")
    model = _Weights(w0.float())  # the step keeps float32 state, as in training
    a, c = a.float(), c.float()
    optimizer = make_optimizer(model, config)
    steps = [RankStep(method, D, torch.device("cpu"), rank=i, residual_rule="paper", momentum_correction=True,
                      momentum=M, world=P) for i in range(P)]
    path = []
    for iteration in range(STEPS):
        contributions = []
        for i in range(P):
            model.zero_grad()
            (0.5 * (a[i] * (model.w - c[i]) ** 2).sum()).backward()
            contributions.append(steps[i].prepare(model.w.grad.detach().clone(), K))
        results = communicate_simulated(method, contributions, steps[0].call(K, iteration))
        for step, contribution, result in zip(steps, contributions, results):
            step.finish(contribution, result)
        model.w.grad = steps[0].aggregate(results[0], torch.device("cpu")) / P
        optimizer.step()
        path.append(model.w.detach().clone())
    return path


@pytest.mark.timeout(30)
def test_thirty_steps_follow_a_port_of_the_reference() -> None:
    a, c, w0 = _problem()
    reference = _reference_dgc(a, c, w0)
    ours = _project_dgc(a, c, w0)
    for t, (want, got) in enumerate(zip(reference, ours)):
        assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5), f"step {t + 1}: {got} != {want}"
    # the case tells the rules apart: the decay inside the sparsified velocity goes elsewhere
    before = _reference_dgc(a, c, w0, decay_in_velocity=True)
    apart = float((before[-1] - reference[-1]).norm() / (reference[-1] - w0).norm())
    assert apart > 0.2


@pytest.mark.timeout(30)
def test_first_step_by_hand() -> None:
    """One rank, d = 2, k = 1: w = [2, 4], g = [1, 0.5] (fixed). Velocity u1 = g; entry 0
    sent; buf = wd w = [0.2, 0.4]; w1 = w - lr (buf + [1, 0]) = [2 - 0.12, 4 - 0.04]."""
    config = RunConfig(method="topk", workers=1, momentum_correction=True, momentum=0.9, weight_decay=0.1,
                       lr=0.1, residual_rule="paper")
    model = _Weights(torch.tensor([2.0, 4.0]))
    optimizer = make_optimizer(model, config)
    step = RankStep(get_method("topk"), 2, torch.device("cpu"), momentum_correction=True, momentum=0.9,
                    residual_rule="paper")
    local = step.prepare(torch.tensor([1.0, 0.5]), 1)
    [result] = communicate_simulated(get_method("topk"), [local], step.call(1))
    step.finish(local, result)
    model.w.grad = step.aggregate(result, torch.device("cpu"))
    optimizer.step()
    assert model.w.detach().tolist() == pytest.approx([1.88, 3.96])
    # second step, same g: buf = 0.9 [0.2, 0.4] + 0.1 [1.88, 3.96] = [0.368, 0.756];
    # u2 = 0.9 [0, 0.5] + g = [1, 0.95]; acc = [1, 0.5 + 0.95]: entry 1 (1.45) sent
    local = step.prepare(torch.tensor([1.0, 0.5]), 1)
    [result] = communicate_simulated(get_method("topk"), [local], step.call(1, 1))
    step.finish(local, result)
    model.w.grad = step.aggregate(result, torch.device("cpu"))
    optimizer.step()
    assert model.w.detach().tolist() == pytest.approx([1.88 - 0.0368, 3.96 - 0.1 * (0.756 + 1.45)])


@pytest.mark.timeout(30)
def test_replica_hands_the_step_the_plain_gradient() -> None:
    """The decay stays out of each rank's gradient (it would be sparsified and delayed there)."""
    config = RunConfig(method="gtopk", model="mlp", momentum_correction=True, momentum=0.9,
                       weight_decay=0.01, lr=0.1)
    replica = Replica(config, 1, torch.device("cpu"))
    x, y = torch.randn(8, 40, generator=torch.Generator().manual_seed(1)), torch.arange(8) % 10
    replica.forward_backward(x, y)
    oracle = Replica(config.replace(weight_decay=0.0), 1, torch.device("cpu"))
    oracle.forward_backward(x, y)  # the same weights and batch without any decay
    assert torch.equal(replica.grad, oracle.grad)


@pytest.mark.timeout(30)
def test_decay_buffer_survives_a_checkpoint() -> None:
    """The optimiser's dense decay buffer is state: a restored optimiser continues the path."""
    config = RunConfig(method="topk", momentum_correction=True, momentum=0.9, weight_decay=0.1, lr=0.1)
    first, second = _Weights(torch.ones(3)), _Weights(torch.ones(3))
    opt_a, opt_b = make_optimizer(first, config), make_optimizer(second, config)
    for _ in range(3):
        for model, opt in ((first, opt_a), (second, opt_b)):
            model.w.grad = torch.full((3,), 0.5)
            opt.step()
    resumed_model = _Weights(first.w.detach())
    resumed = make_optimizer(resumed_model, config)
    resumed.load_state_dict(opt_a.state_dict())
    for model, opt in ((second, opt_b), (resumed_model, resumed)):
        model.w.grad = torch.full((3,), 0.5)
        opt.step()
    assert torch.equal(resumed_model.w, second.w)
