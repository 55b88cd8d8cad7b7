"""Infrequent synchronisation (DiLoCo-shaped): the inner steps, the anchor and the outer step.

A method with ``sync_every`` = H > 1 or an ``outer_optimizer`` (``Method.local_steps``)
synchronises its pseudo-gradient instead of its gradient. Per round of H iterations on one
rank (the :class:`~gtopk_lab.training.step.RankStep` of that method holds a
:class:`LocalSteps` and calls it; no driver does):

1. every iteration: one inner optimiser step (the run's optimiser, on the rank's own gradient
   in the parameters' ``.grad``): :meth:`LocalSteps.inner_step`
2. on the last iteration of a round (:meth:`LocalSteps.due`): the pseudo-gradient
   ``anchor - w`` goes through the step's memory, selector and collective
3. the outer step (:meth:`LocalSteps.outer_step`): the weights return to the anchor,
   ``G / P`` is written into the parameters' gradients, the outer optimiser steps
   (``Method.outer_optimizer(params, config)``; default SGD with lr 1, i.e. the averaged
   update) and the new weights are the next anchor

H is the run's ``sync_every`` option (``RunConfig.method_options["sync_every"]``, default ``Method.sync_every``).
Cost per round: H inner steps, one O(d) pseudo-gradient, one outer step; d floats for the
anchor plus the outer optimiser's state.
"""

from __future__ import annotations

from typing import Any

import torch

from gtopk_lab.training.optim import set_lr
from gtopk_lab.training.replica import flat_params, load_flat_params
from gtopk_lab.training.step_settings import StepSettings

__all__ = ["LocalSteps"]


class LocalSteps:
    """Steps 1-3 of the module docstring for one rank.

    ``params``: the model's parameters (what the inner and outer steps move); ``optimizer``:
    the rank's inner optimiser over them. A virtual rank whose weights live outside the shared
    replica between its turns must have them loaded while any method here runs.
    """

    def __init__(self, settings: StepSettings, params: list[torch.nn.Parameter],
                 optimizer: torch.optim.Optimizer) -> None:
        self.sync_every = settings.sync_every
        self.params, self.optimizer = params, optimizer
        factory = settings.method.outer_optimizer
        self.outer = (factory(params, settings.config) if factory is not None
                      else torch.optim.SGD(params, lr=1.0, momentum=0.0))
        self.anchor = self.flat()  # torch.cat already copies

    def flat(self) -> torch.Tensor:
        return flat_params(self.params)

    def due(self, iteration: int) -> bool:
        """Whether iteration ``iteration`` ends a round (and so synchronises)."""
        return (iteration + 1) % self.sync_every == 0

    def inner_step(self, lr: float) -> None:
        """Step 1: the inner optimiser at learning rate ``lr`` on the gradients in ``.grad``."""
        set_lr(self.optimizer, lr)
        self.optimizer.step()

    def pseudo_gradient(self) -> torch.Tensor:
        """Step 2: ``anchor - w``."""
        return self.anchor - self.flat()

    def outer_step(self, aggregate: torch.Tensor, world: int) -> None:
        """Step 3 with the round's aggregate G (the sum over the P ranks)."""
        load_flat_params(self.params, self.anchor)
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad.copy_((aggregate[offset:offset + n] / world).view_as(p))
            offset += n
        self.outer.step()
        self.anchor = self.flat()  # torch.cat already copies

    def state_dict(self) -> dict[str, Any]:
        return {"anchor": self.anchor.detach().cpu().clone(), "outer": self.outer.state_dict()}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.anchor = saved["anchor"].to(self.anchor.device).clone()
        self.outer.load_state_dict(saved["outer"])
