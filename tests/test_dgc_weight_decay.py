"""DGC momentum correction keeps the weight decay inside the momentum (DGC's DGCSGD.step):
u = m u + (g + wd w), against a hand-computed two-step example and torch's own gradient."""

from __future__ import annotations

import pytest
import torch

from gtopk_lab.comm.stats import CollectiveResult, CommStats
from gtopk_lab.config import RunConfig
from gtopk_lab.methods import get_method
from gtopk_lab.training.replica import Replica
from gtopk_lab.training.step import RankStep


@pytest.mark.timeout(30)
def test_two_steps_by_hand_decay_gets_the_momentum() -> None:
    lr, m, wd = 0.1, 0.9, 0.1
    step = RankStep(get_method("topk"), 2, torch.device("cpu"), momentum_correction=True, momentum=m,
                    residual_rule="paper")
    w = torch.tensor([2.0, 4.0])
    g = torch.tensor([1.0, 0.5])
    sent = []
    for _ in range(2):
        local = step.prepare(g + wd * w, k=1)          # what the replica hands the step
        dense = torch.zeros(2).index_add_(0, local.indices.long(), local.values)
        result = CollectiveResult(local.values, local.indices, CommStats("test", "one-rank"))
        step.finish(local, result)
        sent.append(dense.clone())
        w = w - lr * dense                                # the optimiser adds no decay
    # by hand: u1 = [1.2, 0.9], entry 0 sent and masked; w1 = [1.88, 4];
    # u2 = 0.9 * [0, 0.9] + [1 + 0.188, 0.5 + 0.4] = [1.188, 1.71]; acc2 = [1.188, 0.9 + 1.71]
    assert sent[0].tolist() == pytest.approx([1.2, 0.0])
    assert sent[1].tolist() == pytest.approx([0.0, 2.61])
    assert w.tolist() == pytest.approx([1.88, 4.0 - 0.261])


@pytest.mark.timeout(30)
def test_replica_adds_the_decay_to_the_gradient_and_the_optimiser_none() -> None:
    config = RunConfig(method="gtopk", model="mlp", momentum_correction=True, momentum=0.9,
                       weight_decay=0.01, lr=0.1)
    replica = Replica(config, 1, torch.device("cpu"))
    assert all(group["weight_decay"] == 0.0 and group["momentum"] == 0.0
               for group in replica.optimizer.param_groups)
    x, y = torch.randn(8, 40, generator=torch.Generator().manual_seed(1)), torch.arange(8) % 10
    replica.forward_backward(x, y)
    oracle = Replica(config.replace(momentum_correction=False), 1, torch.device("cpu"))
    oracle.forward_backward(x, y)  # plain autograd gradient of the same weights and batch
    expected = oracle.grad + 0.01 * oracle.flat_weights()
    assert torch.allclose(replica.grad, expected, rtol=1e-6, atol=1e-7)
    assert oracle.optimizer.param_groups[0]["weight_decay"] == 0.01  # without DGC: the optimiser's
