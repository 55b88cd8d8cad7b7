"""Error feedback (residual memory) for sparsified S-SGD.

Per iteration on rank i (docs/architecture.md, steps 2 and 5)::

    acc = ef.compensate(grad)                 # acc_i = g_i + residual_i
    values, indices = selector(acc, k)         # local selection S_i
    result = gtopk_allreduce(values, indices, numel, k)
    ef.update(acc, values, indices, result)    # new residual_i

Two rules decide which entries leave the residual:

- ``"paper"`` (the reference code's ``add_residuals(included_indexes)``):
  residual_i = acc_i with the entries of S_i whose index is in the global set I zeroed;
  entries of S_i outside I stay. An entry dropped at an intermediate merge whose index
  re-enters I through another subtree is zeroed on its owner although its value never
  reached G: that mass is **lost**, so sum_i residual_i + G != sum_i acc_i in general.
- ``"mass"`` (mass-conserving): residual_i = acc_i with all of S_i zeroed, plus the entries
  the collective's merges dropped and charged to this rank
  (``result.stats.dropped_values/indices``). Since every merge's kept + dropped equals its
  inputs' sum and each drop is charged to exactly one rank,
  sum_i residual_i + G == sum_i acc_i holds at every iteration, to rounding.

For exact collectives (Top-k AllGather) both rules give acc_i with S_i zeroed.
Cost: O(d) for compensate (one add) and update (one copy, one scatter of |S_i| entries,
plus an O(|S_i| log |I|) membership test for "paper").
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ErrorFeedback", "RESIDUAL_RULES"]

RESIDUAL_RULES: tuple[str, ...] = ("paper", "mass")


class ErrorFeedback:
    """Residual memory of one rank.

    Example::

        ef = ErrorFeedback(numel=grad.numel(), rule="mass")
        acc = ef.compensate(grad)
        ...
        ef.update(acc, values, indices, result)
    """

    def __init__(self, numel: int, rule: str = "mass", device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        if isinstance(numel, bool) or not isinstance(numel, int):
            raise TypeError(f"numel={numel!r} has type {type(numel).__name__}: expected int")
        if numel < 1:
            raise ValueError(f"numel={numel!r} is invalid: expected an integer >= 1")
        if rule not in RESIDUAL_RULES:
            raise ValueError(f"rule={rule!r} is invalid: expected one of {', '.join(RESIDUAL_RULES)}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype={dtype!r} is invalid: expected a floating torch.dtype")
        # tuned by the user
        self.numel = numel
        self.rule = rule
        # internal state
        self.residual = torch.zeros(numel, dtype=dtype, device=device)

    def compensate(self, grad: torch.Tensor) -> torch.Tensor:
        """acc = grad (flattened) + residual, as a new tensor (grad is not modified)."""
        if not isinstance(grad, torch.Tensor):
            raise TypeError(f"grad has type {type(grad).__name__}: expected torch.Tensor")
        if grad.numel() != self.numel:
            raise ValueError(f"grad has {grad.numel()} elements: expected numel={self.numel}")
        return grad.reshape(-1).to(self.residual.dtype) + self.residual

    def update(self, acc: torch.Tensor, local_values: torch.Tensor, local_indices: torch.Tensor,
               result: Any) -> None:
        """New residual from ``acc``, the local selection S_i and the collective's result.

        ``local_values`` is accepted for symmetry with the selector output (the rules only need
        the indices: S_i's values are acc's values there).
        """
        if acc.numel() != self.numel:
            raise ValueError(f"acc has {acc.numel()} elements: expected numel={self.numel}")
        if local_values.numel() != local_indices.numel():
            raise ValueError(f"local_values has {local_values.numel()} entries but local_indices has "
                             f"{local_indices.numel()}: expected the same length")
        residual = acc.reshape(-1).to(self.residual.dtype).clone()
        local = local_indices.to(device=residual.device, dtype=torch.int64)
        if self.rule == "paper" and result.indices is not None:
            global_idx = result.indices.to(device=residual.device, dtype=torch.int64)
            applied = local[torch.isin(local, global_idx)]
            residual[applied] = 0
        else:  # "mass", or any exact/dense collective under "paper"
            residual[local] = 0
        if self.rule == "mass" and result.stats.dropped_indices is not None:
            d_i = result.stats.dropped_indices
            if d_i.numel() > 0:
                residual.index_add_(0, d_i.to(device=residual.device, dtype=torch.int64),
                                    result.stats.dropped_values.to(device=residual.device,
                                                                   dtype=residual.dtype))
        self.residual = residual

    def reset(self) -> None:
        """Forget the residual (e.g. after a density change)."""
        self.residual.zero_()

    def state_dict(self) -> dict[str, object]:
        """Checkpointable state."""
        return {"numel": self.numel, "rule": self.rule, "residual": self.residual.clone()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict` output; sizes must match."""
        residual = state["residual"]
        if not isinstance(residual, torch.Tensor) or residual.numel() != self.numel:
            raise ValueError(f"state['residual'] is invalid: expected a tensor of numel={self.numel}")
        self.residual = residual.to(device=self.residual.device, dtype=self.residual.dtype).clone()
