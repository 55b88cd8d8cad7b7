"""Gradient clipping where the references clip (issue 16 item 4).

``grad_clip_mode="aggregated"`` (default) scales the synchronised update G / P to L2 norm
<= grad_clip, as hclhkbu/gtopkssgd and GaussianK-SGD call ``clip_grad_norm_`` after
``synchronize()``; ``"local"`` clips each rank's gradient at grad_clip / sqrt(P) before error
feedback, as DGC. Oracles are written out by hand below; real gloo ranks equal the simulator.
"""

from __future__ import annotations

import math

import pytest
import torch

from gtopk_lab.comm.launch import run_gloo
from gtopk_lab.config import RunConfig
from gtopk_lab.methods import get_method
from gtopk_lab.orchestration.run_files import config_hash
from gtopk_lab.training.optim import recipe
from gtopk_lab.training.simulator import simulate
from gtopk_lab.training.step import RankStep, communicate_simulated

#: two ranks' gradients: ||g0|| = 5, ||g1|| = 10, disjoint supports
G0 = torch.tensor([3.0, 4.0, 0.0, 0.0, 0.0, 0.0])
G1 = torch.tensor([0.0, 0.0, 0.0, 0.0, 6.0, 8.0])


def _updates(method: str, clip: float | None, mode: str, k: int = 6) -> list[torch.Tensor]:
    """G / P on each of two virtual ranks after one step of ``method`` on G0, G1."""
    m = get_method(method)
    steps = [RankStep(m, 6, torch.device("cpu"), rank=r, grad_clip=clip, grad_clip_mode=mode, world=2)
             for r in range(2)]
    contributions = [s.prepare(g.clone(), k) for s, g in zip(steps, (G0, G1))]
    results = communicate_simulated(m, contributions, steps[0].call(k))
    out = []
    for s, c, res in zip(steps, contributions, results):
        s.finish(c, res)
        out.append(s.aggregate(res, torch.device("cpu")) / 2)
    return out


@pytest.mark.timeout(30)
def test_clipping_modes_against_hand_computed_oracles() -> None:
    mean = (G0 + G1) / 2  # [1.5, 2, 0, 0, 3, 4], norm sqrt(31.25)
    norm = math.sqrt(31.25)
    # aggregated: the mean is scaled by clip / (||mean|| + 1e-6), identically on both ranks
    for update in _updates("dense", 1.0, "aggregated"):
        torch.testing.assert_close(update, mean * (1.0 / (norm + 1e-6)), rtol=1e-6, atol=0)
        assert float(update.norm()) == pytest.approx(1.0, rel=1e-5)
    # local: each rank at 1 / sqrt(2): g0 * (0.7071 / 5), g1 * (0.7071 / 10), then the mean
    c = 1.0 / math.sqrt(2)
    expected_local = (G0 * (c / 5.0) + G1 * (c / 10.0)) / 2
    for update in _updates("dense", 1.0, "local"):
        torch.testing.assert_close(update, expected_local, rtol=1e-6, atol=0)
    # a threshold that does not bind changes nothing, in either mode
    for mode in ("aggregated", "local"):
        for update in _updates("dense", 100.0, mode):
            torch.testing.assert_close(update, mean, rtol=0, atol=0)
    # gTop-k, k = 2: local top-2 are {0, 1} and {4, 5}; the global top-2 of the sum is {4, 5}
    # (6, 8), so G / P = [0, 0, 0, 0, 3, 4] (norm 5), clipped to norm 0.5
    for update in _updates("gtopk", 0.5, "aggregated", k=2):
        expected = torch.tensor([0.0, 0.0, 0.0, 0.0, 3.0, 4.0]) * (0.5 / (5.0 + 1e-6))
        torch.testing.assert_close(update, expected, rtol=1e-6, atol=0)


@pytest.mark.timeout(30)
def test_clip_mode_field_flag_hash_and_recipe() -> None:
    with pytest.raises(ValueError, match=r"^grad_clip_mode='global' is invalid: expected one of aggregated, local"):
        RunConfig(grad_clip_mode="global")
    assert RunConfig().grad_clip_mode == "aggregated"
    lstm = recipe("lstm-ptb", workers=4)
    assert (lstm.grad_clip, lstm.grad_clip_mode, lstm.lr_warmup_epochs) == (0.25, "aggregated", 0.0)
    # without a clip the mode changes nothing, so it is not hashed: stored runs keep their hash
    base = RunConfig(method="dense", workers=2)
    stored = {k: v for k, v in base.to_dict().items() if k not in ("grad_clip_mode", "density_schedule", "preset")}
    assert config_hash(stored) == config_hash(base) == config_hash(base.replace(grad_clip_mode="local"))
    # with a clip, where it acts is what the run computes
    clipped = base.replace(grad_clip=1.0)
    assert config_hash(clipped) != config_hash(clipped.replace(grad_clip_mode="local"))
    assert config_hash(clipped) != config_hash({**stored, "grad_clip": 1.0})  # the earlier local rule


def _config(**kw) -> RunConfig:
    base = dict(method="gtopk", workers=2, model="mlp", dataset="mnist1d", train_samples=160, test_samples=32,
                batch_size=8, epochs=1, max_iterations=8, density=0.05, lr=0.05, momentum=0.9,
                bandwidth="1GbE", sink_every=4, extra={"return_weights": True})
    base.update(kw)
    return RunConfig(**base)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_clipping_real_gloo_ranks_equal_the_simulator_bitwise() -> None:
    from gtopk_lab.training.loop import gloo_runs_entry

    configs = [_config(grad_clip=0.05, grad_clip_mode="aggregated"), _config(grad_clip=0.3, grad_clip_mode="local"),
               _config(method="dense", grad_clip=0.05)]
    real = run_gloo(gloo_runs_entry, 2, [c.to_dict() for c in configs], timeout_s=150)
    unclipped = simulate(_config()).final_weights
    for i, config in enumerate(configs):
        sim = simulate(config)
        assert torch.equal(real[0][i].final_weights, real[1][i].final_weights), config.grad_clip_mode
        assert torch.equal(sim.final_weights, real[0][i].final_weights), (config.method, config.grad_clip_mode)
        if config.method == "gtopk":  # the clip bound: the run differs from the unclipped one
            assert not torch.allclose(sim.final_weights, unclipped, atol=1e-6), config.grad_clip_mode
        assert sim.summary["grad_clip_mode"] == config.grad_clip_mode
