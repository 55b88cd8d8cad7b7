"""gTop-k DDP communication hook (gtopk_lab.integrations.ddp_hook) on real gloo ranks.

One spawn per world size (2 and 3 ranks) trains the same small MLP three ways for 50 steps
and the parent compares final weights:

- DDP + ``gtopk_hook`` (gTop-k, density 0.05, whole-model selection, no warm-up) against the
  project's own S-SGD step on a plain model: flat gradient, ErrorFeedback("mass"), top-k
  selector, ``gtopk_allreduce``, update with ``G / P`` (training/loop.py's data flow);
- DDP + hook with density 1.0 (k = d, exact) against plain DDP (averaged allreduce);
- DDP + hook with per-bucket gTop-k (tree) selection and one dense warm-up iteration
  (buckets rebuilt after iteration 1): replicas stay identical and training makes progress;
  a short whole-model Ok-Topk run keeps replicas identical too;
- per-bucket selection across a bucket rebuild (one rank, the hook's step function called
  with regrouped parameters): each parameter's residual moves to its new bucket's step.
"""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gtopk_lab.collectives import gtopk_allreduce
from gtopk_lab.compression.residual import ErrorFeedback
from gtopk_lab.compression.selection import get_selector
from gtopk_lab.config import k_for
from gtopk_lab.integrations.ddp_hook import SparseHookState, gtopk_hook
from gtopk_lab.comm.launch import run_gloo

STEPS = 50
LR = 0.1
DENSITY = 0.05


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 5))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(16, 20, generator=gen)
    return x, (x[:, :5].sum(1) > 0).long() + (x[:, 5] > 1).long()


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _train_ddp(rank: int, state: SparseHookState | None, steps: int = STEPS) -> tuple[torch.Tensor, list[float]]:
    # small buckets: several per backward pass, so whole-model selection spans buckets
    model = DDP(_net(), bucket_cap_mb=0.002)
    if state is not None:
        model.register_comm_hook(state, gtopk_hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = _batch(rank, step)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return _flat(model.module), losses


def _train_reference(rank: int, world: int) -> torch.Tensor:
    """The project's S-SGD iteration (docs/architecture.md) with gTop-k, without DDP."""
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    numel = sum(p.numel() for p in model.parameters())
    ef = ErrorFeedback(numel, rule="mass")
    k = k_for(numel, DENSITY)
    for step in range(STEPS):
        x, y = _batch(rank, step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        acc = ef.compensate(g)
        values, indices = get_selector("topk")(acc, k)
        result = gtopk_allreduce(values, indices, numel, k, algorithm="butterfly")
        ef.update(acc, values, indices, result)
        dense = torch.zeros(numel)
        dense[result.indices.long()] = result.values
        dense /= world
        offset = 0
        for p in model.parameters():
            p.grad.copy_(dense[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        opt.step()
    return _flat(model)


def _rank_job(rank: int, world: int) -> dict:
    out: dict = {}
    state = SparseHookState(density=DENSITY, method="gtopk", warmup_iterations=0)
    out["hook"], _ = _train_ddp(rank, state)
    out["state_pickles"] = pickle.loads(pickle.dumps(state)).process_group is None
    out["reference"] = _train_reference(rank, world)
    out["hook_dense"], _ = _train_ddp(rank, SparseHookState(density=1.0, warmup_iterations=0))
    out["ddp"], _ = _train_ddp(rank, None)
    bucket_state = SparseHookState(density=0.2, method="gtopk", algorithm="tree", selection="bucket",
                                   warmup_iterations=1)
    out["bucket"], out["bucket_losses"] = _train_ddp(rank, bucket_state)
    out["bucket_iterations"] = bucket_state.iteration
    ok_state = SparseHookState(density=0.1, method="oktopk", warmup_iterations=1)
    out["oktopk"], _ = _train_ddp(rank, ok_state, steps=8)
    out["oktopk_collective"] = ok_state.last_stats.collective
    dist.barrier()
    return out


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", [2, 3])
def test_gtopk_hook_matches_project_step_and_ddp(world: int) -> None:
    results = run_gloo(_rank_job, world, timeout_s=90)
    for r in range(world):
        res = results[r]
        # same method, seed and collectives: the hook follows the project's trajectory
        torch.testing.assert_close(res["hook"], res["reference"], rtol=1e-4, atol=1e-5)
        # density 1.0: k = d, an exact sum; DDP averages, so does the hook (G / P)
        torch.testing.assert_close(res["hook_dense"], res["ddp"], rtol=1e-4, atol=1e-5)
        assert res["state_pickles"]
        assert res["bucket_iterations"] == STEPS
        assert torch.isfinite(res["bucket"]).all()
        torch.testing.assert_close(res["bucket"], results[0]["bucket"], rtol=0, atol=0)
        torch.testing.assert_close(res["hook"], results[0]["hook"], rtol=0, atol=0)
        torch.testing.assert_close(res["oktopk"], results[0]["oktopk"], rtol=0, atol=0)
        assert res["oktopk_collective"] == "oktopk_allreduce"
    losses = results[0]["bucket_losses"]
    assert sum(losses[-10:]) < sum(losses[:10])
    # sparse training is not dense training: the comparison above is not vacuous
    assert not torch.allclose(results[0]["hook"], results[0]["ddp"], atol=1e-4)


@pytest.mark.timeout(30)
def test_state_validation() -> None:
    with pytest.raises(ValueError, match="density=0"):
        SparseHookState(density=0.0)
    with pytest.raises(ValueError, match="method='foo'"):
        SparseHookState(method="foo")
    with pytest.raises(ValueError, match="selection='layer'"):
        SparseHookState(selection="layer")
    with pytest.raises(ValueError, match="warmup_iterations=-1"):
        SparseHookState(warmup_iterations=-1)
    with pytest.raises(ValueError, match="residual_rule"):
        SparseHookState(residual_rule="none")
    with pytest.raises(TypeError, match="options=.* expected dict"):
        SparseHookState(method="powersgd", options=[("powersgd_rank", 2)])


#: PowerSGD settings shared by torch's hook and ours: rank 2, every matrix compressed, warm
#: start, error feedback, two vanilla allreduces first (torch's start_powerSGD_iter; DDP
#: rebuilds its buckets after iteration 1)
POWERSGD = {"powersgd_rank": 2, "powersgd_min_compression_rate": 1.0, "powersgd_warm_start": True,
            "powersgd_seed": 3}
POWERSGD_STEPS = 10


def _powersgd_job(rank: int, world: int) -> dict:
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

    out: dict = {}
    for name in ("torch", "ours", "ddp"):
        model = DDP(_net(), bucket_cap_mb=100)  # one bucket: torch's hook compresses per bucket
        if name == "torch":
            model.register_comm_hook(PowerSGDState(
                process_group=None, matrix_approximation_rank=POWERSGD["powersgd_rank"], start_powerSGD_iter=2,
                min_compression_rate=POWERSGD["powersgd_min_compression_rate"], use_error_feedback=True,
                warm_start=POWERSGD["powersgd_warm_start"], random_seed=POWERSGD["powersgd_seed"]), powerSGD_hook)
        elif name == "ours":
            model.register_comm_hook(SparseHookState(method="powersgd", density=1.0, warmup_iterations=2,
                                                     options=dict(POWERSGD)), gtopk_hook)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        for step in range(POWERSGD_STEPS):
            x, y = _batch(rank, step)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        out[name] = _flat(model.module)
    return out


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_powersgd_hook_form_equals_torch_powersgd_hook() -> None:
    results = run_gloo(_powersgd_job, 2, timeout_s=90)
    for res in results:
        # W = 2: the same sums and power-of-two scaling, so torch's numbers up to float noise
        torch.testing.assert_close(res["ours"], res["torch"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(res["ours"], results[0]["ours"], rtol=0, atol=0)  # identical replicas
    assert not torch.allclose(results[0]["ours"], results[0]["ddp"], atol=1e-4)  # it did compress


def _residuals_by_parameter(state: SparseHookState, sizes: list[int]) -> dict[int, torch.Tensor]:
    """Each parameter slot's residual, read from its bucket's step (``RankStep.state_dict``)."""
    out = {}
    for key, step in state._steps.items():
        residual, offset = step.state_dict()["memory"]["residual"], 0
        for slot in key:
            out[slot] = residual[offset:offset + sizes[slot]]
            offset += sizes[slot]
    return out


def _rebucket_job(rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per-bucket selection, then the parameters regrouped as a DDP bucket rebuild would: with
    zero gradients the second round compresses exactly the residuals the first left."""
    from gtopk_lab.integrations.ddp_hook import _sparse_step

    gen = torch.Generator().manual_seed(5)
    sizes = [5, 7, 6]
    params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    state = SparseHookState(density=0.3, method="topk", selection="bucket", warmup_iterations=0)
    _sparse_step(state, [(params[0], torch.randn(5, generator=gen)), (params[1], torch.randn(7, generator=gen))])
    _sparse_step(state, [(params[2], torch.randn(6, generator=gen))])
    left = _residuals_by_parameter(state, sizes)
    sent = [torch.zeros(n) for n in sizes]  # zero gradients; the hook writes G into them
    _sparse_step(state, [(params[2], sent[2]), (params[0], sent[0])])  # the rebuilt buckets
    _sparse_step(state, [(params[1], sent[1])])
    kept = _residuals_by_parameter(state, sizes)
    return [(left[s], sent[s], kept[s]) for s in range(3)]


@pytest.mark.timeout(60)
def test_rebuilt_buckets_take_over_their_parameters_residuals() -> None:
    # P = 1: what a parameter sends after the rebuild plus what it keeps is what it had left
    for left, sent, kept in run_gloo(_rebucket_job, 1, timeout_s=40)[0]:
        assert left.abs().sum() > 0
        torch.testing.assert_close(sent + kept, left, rtol=0, atol=0)  # nothing lost, nothing added
