"""EF21 and EF21-SGDM: error feedback through a per-rank gradient estimate, server-free.

Sources: Richtarik, Sokolov, Fatkhullin, "EF21: A New, Simpler, Theoretically Better, and
Practically Faster Error Feedback", NeurIPS 2021 (arXiv:2106.05203); the momentum variant
from Fatkhullin, Tyurin, Richtarik, "Momentum Provably Improves Error Feedback!", NeurIPS
2023 (arXiv:2305.15155).

Every rank i keeps its estimate ``g_i`` of its own gradient and every rank keeps the same
running sum ``S = sum_i g_i`` (no server: the sum is maintained by aggregating the compressed
differences *exactly*). One iteration on rank i of P (C = the method's selector, Top-k):

1. ``v_i = grad f_i(x)``; EF21-SGDM instead keeps a momentum estimate
   ``v_i <- (1 - eta) v_i + eta grad f_i(x)`` (``v_i`` starts at the first gradient);
2. ``c_i = C(v_i - g_i)`` (k pairs);
3. an exact collective sums the c_i (default: the Top-k allgather; ``register_method``
   refuses a lossy one such as gTop-k through ``requires_lossless``): ``c = sum_i c_i``;
4. ``g_i <- g_i + c_i``; ``S <- S + c`` (so S stays ``sum_i g_i`` on every rank, to rounding);
5. the step applies ``S / P`` -- the mean of the estimates -- as the gradient:
   ``x <- x - lr S / P``, the papers' plain step. Both methods default to ``momentum = 0``
   (``Method.config_defaults``, over a recipe's 0.9: SGD momentum on top would give
   EF21-SGDM its momentum twice); a run that gives ``momentum`` gets it.

The project's residual memory is off: EF21's memory *is* ``g_i``. Initial state
(the papers leave ``g_i^0`` free): ``g_i^0 = 0`` and ``S^0 = 0``, so the first round sends
``C(grad f_i(x^0))``; since this implementation computes the new estimate before the step,
it equals the papers' scheme started from ``g_i^0 = C(grad f_i(x^0))`` without a dense first
round. ``eta`` (option ``ef21_momentum``) defaults to 0.1 for ``ef21-sgdm`` (the momentum
paper's analysis takes a small eta; 0.1 is this project's default) and is 1 (no momentum)
for ``ef21``.

Cost per rank: O(d) for the memory, the selector's, the collective's (allgather: (P-1) k
pairs sent); d floats more memory than plain Top-k for S (and d for v_i with momentum).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gtopk_lab.methods.base import Collective, Method
from gtopk_lab.methods.registry import register_method

__all__ = ["EF21Memory", "ef21_method", "EF21", "EF21_SGDM", "DEFAULT_EF21_MOMENTUM"]

#: EF21-SGDM's eta (this project's default; the module docstring says why).
DEFAULT_EF21_MOMENTUM = 0.1


class EF21Memory:
    """``g_i`` (this rank's estimate), ``S`` (the sum of all estimates) and, with momentum
    ``eta < 1``, the momentum estimate ``v_i``. Steps 1, 2 (what to compress), 4 and 5."""

    def __init__(self, numel: int, rule: str, device: torch.device | str | None,
                 options: Mapping[str, Any] | None = None) -> None:
        eta = float((options or {}).get("ef21_momentum", 1.0))
        if not 0.0 < eta <= 1.0:
            raise ValueError(f"method_options ef21_momentum={eta!r} is invalid: expected a number in (0, 1]")
        self.eta = eta
        self.estimate = torch.zeros(numel, device=device)
        self.total = torch.zeros(numel, device=device)
        self.velocity: torch.Tensor | None = None

    def compensate(self, g: torch.Tensor) -> torch.Tensor:
        """``v_i - g_i``: what this round compresses."""
        g = g.reshape(-1)
        if self.eta < 1.0:
            if self.velocity is None:  # v_i^0 = the first gradient (no bias toward 0)
                self.velocity = g.detach().clone()
            else:
                self.velocity.mul_(1.0 - self.eta).add_(g, alpha=self.eta)
            g = self.velocity
        return g - self.estimate

    def update(self, acc: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, result: Any) -> None:
        """``g_i += c_i`` at this rank's own selection."""
        self.estimate.index_add_(0, indices.long(), values.to(self.estimate.dtype))

    def aggregate(self, dense: torch.Tensor) -> torch.Tensor:
        """``S += c``; returns a copy of S (the step divides it by P)."""
        self.total += dense
        return self.total.clone()

    def state_dict(self) -> dict[str, Any]:
        return {"estimate": self.estimate.detach().cpu().clone(), "total": self.total.detach().cpu().clone(),
                "velocity": None if self.velocity is None else self.velocity.detach().cpu().clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        device = self.estimate.device
        self.estimate = state["estimate"].to(device).clone()
        self.total = state["total"].to(device).clone()
        v = state.get("velocity")
        self.velocity = None if v is None else v.to(device).clone()


#: Where ``ef21`` departs from its paper (``ef21-sgdm`` adds its eta).
EF21_DEPARTURES: tuple[str, ...] = ("g_i and S start at 0 (the first round sends C(grad f_i(x0)), no dense "
                                    "first round)",)


def ef21_method(name: str, *, collective: str | Collective = "allgather", selector: str = "topk",
                momentum: float | None = None, description: str = "",
                departures: tuple[str, ...] = EF21_DEPARTURES, **display: Any) -> Method:
    """An EF21 :class:`Method` (not registered): ``momentum`` = EF21-SGDM's eta (None: plain EF21).

    The optimiser takes the papers' plain step (``config_defaults``: SGD momentum 0 unless
    the run gives one). ``register_method`` refuses it with a lossy ``collective``
    (``requires_lossless``). ``display``: its display facts (``family``, ``color``, ...).
    """
    options = {} if momentum is None else {"ef21_momentum": float(momentum)}
    return Method(name=name, selector=selector, collective=collective, memory=EF21Memory,
                  requires_lossless=True, options=options, description=description,
                  config_defaults={"momentum": 0.0}, departures=departures, **display)


EF21 = register_method(ef21_method(
    "ef21", color="#B6E880", description="EF21 (Richtarik et al., NeurIPS'21): Top-k of grad - g_i, exact allgather"))
EF21_SGDM = register_method(ef21_method(
    "ef21-sgdm", momentum=DEFAULT_EF21_MOMENTUM, family="ef21", color="#637939",
    description="EF21-SGDM (Fatkhullin et al., NeurIPS'23): EF21 on a momentum estimate",
    departures=EF21_DEPARTURES + (f"eta = {DEFAULT_EF21_MOMENTUM} is this project's choice",)))
