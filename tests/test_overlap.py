"""Wait-free backprop (gtopk_lab.integrations.overlap) on 2 real gloo ranks, plus its timeline helpers.

One spawn trains a small MLP for a few steps three ways: per-layer gTop-k overlapped with
backward, the same without overlap (must give bitwise identical weights: overlap changes
timing, not arithmetic), and whole-model selection after backward (the papers' semantics).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from gtopk_lab.comm.launch import run_gloo
from gtopk_lab.network.model import NetworkModel
from gtopk_lab.integrations.overlap import WaitFreeBackprop, hidden_time_s, link_timeline

STEPS = 8


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def _train(rank: int, **kwargs) -> tuple[torch.Tensor, list]:
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    reports = []
    with WaitFreeBackprop(model, density=0.05, method="gtopk",
                          network=NetworkModel.from_strings("100Mbps", "50us"), **kwargs) as wfbp:
        for step in range(STEPS):
            gen = torch.Generator().manual_seed(100 * rank + step)
            x = torch.randn(32, 40, generator=gen)
            y = torch.randint(0, 10, (32,), generator=gen)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            reports.append(wfbp.finish())
            opt.step()
        groups = len(wfbp.groups)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), reports, groups


def _rank_job(rank: int, world: int) -> dict:
    out = {}
    out["overlap"] = _train(rank, overlap=True)
    out["serial"] = _train(rank, overlap=False)
    out["model"] = _train(rank, scope="model")
    out["merged"] = _train(rank, overlap=True, min_group_numel=3000)  # fewer, larger groups
    dist.barrier()
    return out


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_wait_free_backprop_two_ranks() -> None:
    results = run_gloo(_rank_job, 2, timeout_s=90)
    for r in range(2):
        w_overlap, rep_overlap, groups = results[r]["overlap"]
        w_serial, rep_serial, _ = results[r]["serial"]
        assert groups == 3  # one group per Linear layer
        assert torch.equal(w_overlap, w_serial)  # same arithmetic, different timing
        assert torch.equal(w_overlap, results[0]["overlap"][0])  # replicas identical
        w_model, rep_model, groups_model = results[r]["model"]
        assert groups_model == 1 and torch.isfinite(w_model).all()
        assert not torch.equal(w_model, w_overlap)  # per-layer top-k is a different selection
        assert results[r]["merged"][2] == 2  # min_group_numel merges the two small layers
        for rep in rep_overlap:
            assert [t.group for t in rep.groups] == [0, 1, 2]
            assert 0.0 <= rep.hidden_s <= rep.comm_s + 1e-9
            assert 0.0 <= rep.hidden_model_s <= rep.comm_model_s + 1e-12
            assert rep.comm_model_s > 0 and all(t.bytes_sent > 0 for t in rep.groups)
            # groups become ready in backward order: last layer first
            assert rep.groups[0].ready_s <= rep.groups[-1].ready_s
        for rep in rep_serial + rep_model:
            assert rep.hidden_s == 0.0 and rep.hidden_model_s == 0.0
            assert rep.exposed_model_s == pytest.approx(rep.comm_model_s)


@pytest.mark.timeout(30)
def test_timeline_helpers_and_validation() -> None:
    assert link_timeline([0.0, 0.1, 0.5], [0.3, 0.3, 0.1]) == [(0.0, 0.3), (0.3, 0.6), (0.6, 0.7)]
    assert hidden_time_s([(0.0, 0.3), (0.3, 0.6), (0.6, 0.7)], 0.5) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="scope='bucket'"):
        WaitFreeBackprop(_net(), density=0.1, scope="bucket")
    with pytest.raises(ValueError, match="density=0"):
        WaitFreeBackprop(_net(), density=0)
    with pytest.raises(ValueError, match="min_group_numel=-1"):
        WaitFreeBackprop(_net(), density=0.1, min_group_numel=-1)
