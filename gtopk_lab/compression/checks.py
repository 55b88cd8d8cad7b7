"""Argument checks and the output convention shared by every selector."""

from __future__ import annotations

import torch

from gtopk_lab.compression.merge import index_dtype

__all__ = ["check_selection", "selection_result"]


def check_selection(x: torch.Tensor, k: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x has type {type(x).__name__}: expected torch.Tensor")
    if x.dim() != 1:
        raise ValueError(f"x has shape {tuple(x.shape)}: expected a flat 1-D tensor")
    if not x.dtype.is_floating_point:
        raise TypeError(f"x dtype {x.dtype} is invalid: expected a floating dtype")
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k={k!r} has type {type(k).__name__}: expected int")
    if not 1 <= k <= x.numel():
        raise ValueError(f"k={k!r} is invalid: expected 1 <= k <= numel={x.numel()}")


def selection_result(x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    idx = idx.to(index_dtype(x.numel()))
    return x[idx], idx
