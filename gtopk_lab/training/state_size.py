"""What a method keeps per parameter: the bytes of its step's state, counted from the state.

A method's memory overhead is the state one rank keeps beyond its model and its (inner)
optimiser: the residual of error feedback, DGC's velocity, PowerSGD's error and warm-start
factors, EF21's estimate and running sum, DiLoCo's anchor and outer momentum, SparseLoCo's
decayed buffer, a collective's state. It is counted, never kept in a table:

1. take the step's checkpoint state (``RankStep.state_dict()``: memory, velocity, collective
   state) and, for local-steps methods, ``LocalSteps.state_dict()`` (anchor, outer optimiser);
2. add ``numel * element_size`` of every tensor in them (nested dicts, lists, tuples);
3. divide by the parameter count d.

:func:`state_bytes_per_parameter` does it for a run's own rank 0 (run summaries record it as
``state_bytes_per_param``); :func:`method_state_bytes_per_parameter` runs a method's step for a
few iterations on random gradients over a small registered model's layout first, so that
state created on first use (EF21-SGDM's momentum, PowerSGD's factors, an outer optimiser's
momentum) is there (``gtopk-lab methods`` shows it). Cost: O(state) to count; the latter
also ``iterations`` steps of P ranks on the model's d.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gtopk_lab.config import RunConfig, k_for
from gtopk_lab.methods import get_method
from gtopk_lab.training.models import build_model
from gtopk_lab.training.step import RankStep, communicate_simulated
from gtopk_lab.training.step_settings import StepSettings

__all__ = ["tensor_bytes", "state_bytes_per_parameter", "method_state_bytes_per_parameter"]


def tensor_bytes(state: Any) -> int:
    """Bytes of every tensor in ``state`` (tensors, and dicts / lists / tuples of them; other
    values count 0). O(entries)."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, Mapping):
        return sum(tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(v) for v in state)
    return 0


def state_bytes_per_parameter(step: RankStep, numel: int) -> float:
    """Bytes per parameter of one rank's method state (steps 1-3 of the module docstring):
    ``step.state_dict()`` and, for a local-steps method, ``step.local.state_dict()``."""
    if numel < 1:
        raise ValueError(f"numel={numel!r} is invalid: expected an integer >= 1")
    local = step.local
    total = tensor_bytes(step.state_dict()) + (tensor_bytes(local.state_dict()) if local is not None else 0)
    return total / numel


def method_state_bytes_per_parameter(method: str, *, model: str = "cnn", world: int = 2, density: float = 0.01,
                                     iterations: int = 3, seed: int = 0) -> float:
    """Bytes per parameter rank 0 of ``world`` keeps for ``method`` on ``model``'s layout after
    ``iterations`` synchronisations on random gradients (default settings of the method).

    Rank 0 holds the model's parameters and an optimiser (a local-steps method's inner and
    outer steps need them); the other ranks contribute their parts of each collective only.
    ``ValueError`` names a bad ``world`` or ``iterations``; an unknown method or model raises
    the registry's error."""
    for name, value in (("world", world), ("iterations", iterations)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} is invalid: expected an integer >= 1")
    entry = get_method(method)
    config = RunConfig(method=method, model=model, workers=world, density=density)
    settings = StepSettings.from_config(config, world)
    net = build_model(model)
    params = [p for p in net.parameters() if p.requires_grad]
    layout = tuple(tuple(p.shape) for p in params)
    numel = sum(p.numel() for p in params)
    for p in params:
        p.grad = torch.zeros_like(p)
    device = torch.device("cpu")
    optimizer = torch.optim.SGD(params, lr=config.lr)
    steps = [RankStep(settings, numel, device, rank=r, layout=layout,
                      params=params if r == 0 else None, optimizer=optimizer if r == 0 else None)
             for r in range(world)]
    gen = torch.Generator().manual_seed(seed)
    k = k_for(numel, density)
    for it in range(iterations):
        contributions = [s.prepare(torch.randn(numel, generator=gen), k, it) for s in steps]
        results = communicate_simulated(entry, contributions, steps[0].call(k, it))
        totals = []
        for s, c, r in zip(steps, contributions, results):
            s.finish(c, r)
            totals.append(s.aggregate(r, device))
        if steps[0].local is not None:
            steps[0].local.outer_step(totals[0], world)
    return state_bytes_per_parameter(steps[0], numel)
