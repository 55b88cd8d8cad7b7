"""Optimiser, learning-rate and density schedules, and named training recipes.

Schedules are pure functions of the fractional epoch ``e`` (iteration / iterations per
epoch), so that every rank (and every virtual rank of the simulator) computes the same
value without communication:

- **learning rate**: linear warm-up from ``lr / P`` to ``lr`` over ``lr_warmup_epochs``
  (Goyal et al. 2017), then step decay ``lr * lr_decay ** #{milestones <= e}``.
- **density**: ``density_schedule = (rho_0, ..., rho_{n-1})`` uses ``rho_e`` in epoch
  ``e = floor(progress) < n``, then ``density`` (GaussianK-SGD's ``_dynamic_densities =
  [0.015625, 0.004, 0.001]`` is ``density_schedule=(0.015625, 0.004), density=0.001``);
  ``density_warmup = (rho0, E)`` is the schedule ``(rho0,) * E`` (the seed paper's code
  warms up with 0.004 for the first epoch). :func:`density_stages` gives the list.

Recipes (``RECIPES``, defined in :mod:`gtopk_lab.config_presets` so that the ``paper``
preset of ``RunConfig`` can use them) reproduce the references' configurations, LR
warm-up lengths included: 10 epochs for the CIFAR recipes, none for ``lstm-ptb``.

Example::

    cfg = recipe("resnet20-cifar10", data_dir="~/data", workers=4, method="gtopk")
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import torch
from torch import nn

from gtopk_lab.config import RunConfig
from gtopk_lab.config_options import OPTIMIZERS as _OPTIMIZERS
from gtopk_lab.config_presets import RECIPES
from gtopk_lab.methods import get_method

#: re-exported: the recipes live below config (the ``paper`` preset reads them)
__all__ = ["RECIPES", "DecayMomentumSGD"]


def recipe(name: str, **overrides: Any) -> RunConfig:
    """A validated ``RunConfig`` from recipe ``name`` with ``overrides`` applied on top."""
    if name not in RECIPES:
        raise ValueError(f"recipe={name!r} is invalid: expected one of {', '.join(RECIPES)}")
    return RunConfig(**{**RECIPES[name], "recipe": name, **overrides})


def lr_at(config: RunConfig, epoch: float, world_size: int | None = None) -> float:
    """Learning rate at fractional epoch ``epoch``: linear warm-up then step decay. O(log m)."""
    p = world_size if world_size is not None else config.workers
    lr = config.lr
    if config.lr_warmup_epochs > 0 and epoch < config.lr_warmup_epochs:
        start = config.lr / p
        lr = start + (config.lr - start) * (epoch / config.lr_warmup_epochs)
    decays = bisect.bisect_right(sorted(config.lr_milestones), epoch)
    return lr * config.lr_decay ** decays


def density_stages(config: RunConfig) -> tuple[float, ...]:
    """The densities of the first epochs, one per epoch, before ``density`` takes over:
    ``density_schedule``, or ``density_warmup = (rho0, E)`` as ``(rho0,) * E``, else ()."""
    if config.density_schedule is not None:
        return config.density_schedule
    if config.density_warmup is not None:
        warm_density, warm_epochs = config.density_warmup
        return (float(warm_density),) * int(warm_epochs)
    return ()


def density_at(config: RunConfig, epoch: float) -> float:
    """Density rho at fractional epoch ``epoch``: stage ``floor(epoch)`` of
    :func:`density_stages` while there is one, then ``density``. O(E) for E stages."""
    stages = density_stages(config)
    index = math.floor(epoch)
    return stages[index] if 0 <= index < len(stages) else config.density


#: Optimisers ``make_optimizer`` builds (``config_options.OPTIMIZERS``), chosen by
#: ``config.optimiser.name`` (default the method's, else "sgd").
OPTIMIZERS: tuple[str, ...] = _OPTIMIZERS
#: AdamW defaults (nanoGPT's betas); override with ``optimiser.betas`` / ``optimiser.eps``.
ADAMW_BETAS: tuple[float, float] = (0.9, 0.95)
ADAMW_EPS = 1e-8


def optimizer_name(config: RunConfig) -> str:
    """``config.optimiser.name``; when None the method's ``options["optimizer"]`` (DiLoCo's
    inner AdamW), else "sgd"; anything else raises ``ValueError``."""
    name = config.optimiser.name
    if name is None:
        name = get_method(config.method).options.get("optimizer", "sgd")
    if name not in OPTIMIZERS:
        raise ValueError(f"optimiser.name={name!r} is invalid: expected one of {', '.join(OPTIMIZERS)}")
    return name


def _adamw_hyper(config: RunConfig) -> tuple[tuple[float, float], float]:
    betas = config.optimiser.betas or ADAMW_BETAS
    try:
        b1, b2 = (float(b) for b in betas)
        ok = 0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"optimiser.betas={betas!r} is invalid for optimizer 'adamw': expected two numbers "
                         "in [0, 1), e.g. [0.9, 0.95]")
    eps = ADAMW_EPS if config.optimiser.eps is None else config.optimiser.eps
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"optimiser.eps={eps!r} is invalid for optimizer 'adamw': expected a number > 0")
    return (b1, b2), float(eps)


def make_optimizer(model: nn.Module, config: RunConfig) -> torch.optim.Optimizer:
    """SGD (default) or AdamW over the model's parameters, from ``config.optimiser.name``.

    SGD: with ``momentum_correction`` the velocity is kept per worker *before* sparsification
    (see :mod:`gtopk_lab.training.step`), so the gradient steps without momentum (dense runs
    ignore ``momentum_correction``: with nothing left out it would cancel momentum). Weight
    decay is applied by the optimiser to the aggregated update (identical on every rank);
    with momentum correction it gets a dense momentum buffer of its own, as DGC's
    ``DGCSGD.step`` (:class:`DecayMomentumSGD`), so it is neither sparsified nor delayed.
    The learning rate is overwritten each iteration from :func:`lr_at`.

    AdamW (``optimiser={"name": "adamw"}``): ``lr`` and ``weight_decay`` from the config,
    ``betas`` (default (0.9, 0.95)) and ``eps`` (default 1e-8) from ``optimiser``; ``momentum``
    is unused. As in nanoGPT, decoupled weight decay applies to parameters with >= 2
    dimensions (weight matrices, embeddings) and not to biases or LayerNorm gains. Like SGD
    it steps on the aggregated (sparse-summed) gradient, identically on every rank.
    ``momentum_correction`` is rejected: DGC's local velocity belongs to SGD momentum.
    """
    if optimizer_name(config) == "adamw":
        if config.momentum_correction and get_method(config.method).sparse:
            raise ValueError("momentum_correction=True is invalid with optimiser.name='adamw': DGC's "
                             "local velocity is an SGD-momentum scheme; expected momentum_correction=False")
        betas, eps = _adamw_hyper(config)
        params = [p for p in model.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": config.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr, betas=betas,
                                 eps=eps)
    if dgc_local_velocity(config):
        return DecayMomentumSGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                                weight_decay=config.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                           weight_decay=config.weight_decay)


class DecayMomentumSGD(torch.optim.Optimizer):
    """SGD for DGC's momentum correction: the gradient's momentum lives in each rank's
    velocity (before sparsification), the weight decay's in this optimiser, dense.

    Per parameter ``w`` with aggregated gradient ``G / P`` (the behaviour of DGC's
    ``DGCSGD.step``, synxlin/deep-gradient-compression ``dgc/optim/sgd.py``):

    1. ``b = m b + wd w`` (``b`` starts at 0, so the first step has ``b = wd w``);
    2. ``w = w - lr (b + G / P)``.

    Every coordinate decays every step, whatever was selected; with ``wd = 0`` it is plain
    SGD without momentum. Cost: O(d) per step and d floats of state (``b``, only with
    ``wd > 0``).
    """

    def __init__(self, params: Any, lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> None:
        if not lr >= 0.0:
            raise ValueError(f"lr={lr!r} is invalid: expected a number >= 0")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum={momentum!r} is invalid: expected a number in [0, 1)")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay={weight_decay!r} is invalid: expected a number >= 0")
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # noqa: D102 (the class docstring states it)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum, decay = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if decay:
                    state = self.state[p]
                    if "decay_buffer" not in state:
                        state["decay_buffer"] = torch.zeros_like(p)
                    buffer = state["decay_buffer"]
                    buffer.mul_(momentum).add_(p, alpha=decay)
                    p.add_(buffer, alpha=-lr)
                p.add_(p.grad, alpha=-lr)
        return loss


def dgc_local_velocity(config: RunConfig) -> bool:
    """Whether the run keeps DGC's velocity per rank (momentum correction of a sparse method)."""
    return bool(config.momentum_correction) and get_method(config.method).sparse


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Write ``lr`` into every parameter group."""
    for group in optimizer.param_groups:
        group["lr"] = lr
