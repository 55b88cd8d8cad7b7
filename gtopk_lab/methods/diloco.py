"""DiLoCo: H local AdamW steps, then an outer Nesterov step on the averaged pseudo-gradient.

Source: Douillard, Feng, Rusu, Chhaparia, Donchev, Kuncoro, Ranzato, Szlam, Shen,
"DiLoCo: Distributed Low-Communication Training of Language Models", arXiv:2311.08105.

One round (H iterations) on rank i of P, from the shared weights ``theta`` (the anchor):

1. H inner steps of the run's inner optimiser on rank i's own mini-batches, no communication
   (AdamW by default, the paper's choice: ``lr``, ``weight_decay`` and ``optimiser`` betas/eps of
   the run; ``optimiser={"name": "sgd"}`` for SGD);
2. the pseudo-gradient ``Delta_i = theta - theta_i`` (d floats);
3. a dense ring allreduce: ``Delta = (1/P) sum_i Delta_i``;
4. the outer step from the anchor: Nesterov SGD ``theta <- theta - lr_out (Delta + mu m)``
   with ``m <- mu m + Delta`` (``torch.optim.SGD(nesterov=True)``); the paper's lr_out = 0.7,
   mu = 0.9. Every rank then continues from the same new theta.

Options (``method_options``): ``sync_every`` = H, default 8 here (the paper synchronises every 500
steps on large models; 8 suits this project's small runs), ``outer_lr`` (0.7),
``outer_momentum`` (0.9; 0 gives plain SGD), ``optimizer`` ("adamw"). With H = 1, an inner
SGD and an outer SGD of lr 1 without momentum, DiLoCo is dense data-parallel SGD.

Cost per round: H local steps, one dense allreduce of d floats (``2 (P-1)/P * 4d`` bytes per
rank), i.e. 1/H of dense S-SGD's traffic per iteration; 3d floats more state (anchor, outer
momentum) and the inner optimiser's.
"""

from __future__ import annotations

from typing import Any

import torch

from gtopk_lab.methods.base import Method
from gtopk_lab.methods.registry import get_method, register_method

__all__ = ["nesterov_outer_optimizer", "DILOCO", "DILOCO_OPTIONS"]

#: DiLoCo's options and defaults (``method_options`` overrides them per run).
DILOCO_OPTIONS: dict[str, Any] = {"sync_every": 8, "outer_lr": 0.7, "outer_momentum": 0.9, "optimizer": "adamw"}


def nesterov_outer_optimizer(params: list[torch.nn.Parameter], config: Any) -> torch.optim.Optimizer:
    """Step 4's optimiser from the run's ``outer_lr`` / ``outer_momentum`` options (of the run's
    method, so other methods may reuse it with their own defaults)."""
    options = get_method(config.method).run_options(config.method_options)
    lr, mu = options["outer_lr"], options["outer_momentum"]
    if not lr > 0 or not 0.0 <= mu < 1.0:
        raise ValueError(f"method_options outer_lr={lr!r} / outer_momentum={mu!r} is invalid: expected lr > 0 "
                         "and momentum in [0, 1)")
    return torch.optim.SGD(params, lr=lr, momentum=mu, nesterov=mu > 0)


DILOCO = register_method(Method(
    name="diloco", selector=None, collective="allreduce", memory=None, color="#FF6692",
    sync_every=DILOCO_OPTIONS["sync_every"], outer_optimizer=nesterov_outer_optimizer, options=DILOCO_OPTIONS,
    description="DiLoCo (Douillard et al. 2023): H local AdamW steps, outer Nesterov on the mean pseudo-gradient",
    departures=(f"H = {DILOCO_OPTIONS['sync_every']} by default (the paper: 500 on its large models)",)))
