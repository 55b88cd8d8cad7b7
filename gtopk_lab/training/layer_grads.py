"""Every virtual rank's gradient from one plain backward: each layer's per-rank weight
gradient from its inputs and output gradients.

``vmap`` over ``grad`` (:mod:`~gtopk_lab.training.batched_ranks`) runs the backward under
functorch's batching rules, which turn a convolution's per-rank weight gradient into a grouped
convolution backward, slow on the CPU (the MNIST-1D CNN at P = 64, B = 16: about half of
the batched call). For a model whose trainable parameters all belong to ``nn.Linear`` and
``nn.Conv1d`` layers, the P gradients follow from one ordinary forward and one backward that
forms no weight gradient at all:

1. forward hooks keep each layer's input ``a`` and output ``z``; the model runs once on the
   P B samples ``x`` ``[P B, ...]`` (rank-major) with the shared weights;
2. the P losses ``l_r = loss(out_r, y_r)`` (``vmap`` of the loss over the ranks' rows) and one
   backward of ``sum_r l_r`` for ``g = d/dz`` of every layer's output only;
3. per layer, each rank's gradient from its own rows (the other ranks' losses do not depend
   on them, so ``g`` there is ``d l_r / dz``): Linear ``W_r = sum_b g_b^T a_b`` (one ``bmm``
   over ranks), bias ``sum_b g_b``; Conv1d the input padded and unfolded into its kernel
   windows ``a_w[b, c, l, j]``, ``W_r[o, c, j] = sum_{b,l} g[b, o, l] a_w[b, c, l, j]`` (one
   ``einsum``), bias ``sum_{b,l} g``;
4. the ``[P, ...]`` gradients flattened in the replica's flat-buffer order: ``[P, d]``.

:func:`layer_grads_refusal` says in one line why a model cannot take this path (a parameter
outside those layers, grouped or non-zero-padded convolutions, a layer shared by two
parents); a layer the forward calls twice, or never, is found on the call and raises
``ValueError``. :class:`~gtopk_lab.training.batched_ranks.BatchedGradients` checks the first
call against ``vmap`` and keeps ``vmap`` for the run where they differ.

Cost: one forward and one input-gradient backward over P B samples, plus one ``bmm`` or
``einsum`` per layer over its inputs and output gradients (the FLOPs of the weight
gradients the sequential path forms), in a constant number of calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

__all__ = ["LayerGradients", "layer_grads_refusal"]

_LAYERS = (nn.Linear, nn.Conv1d)


def layer_grads_refusal(model: nn.Module, params: Sequence[torch.Tensor]) -> str | None:
    """Why ``model`` (trainable parameters ``params``) cannot take the per-layer path, in one
    line, or None (see the module docstring)."""
    owners: dict[int, str] = {}
    for name, module in model.named_modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        if not isinstance(module, _LAYERS):
            return (f"module {name or type(model).__name__!r} ({type(module).__name__}) has parameters: "
                    "not Linear or Conv1d")
        if isinstance(module, nn.Conv1d) and (module.groups != 1 or module.padding_mode != "zeros"
                                              or isinstance(module.padding, str)):
            return f"convolution {name!r} is grouped or not zero-padded by a number"
        for p in own:
            if id(p) in owners:
                return f"parameter of {name!r} is shared with {owners[id(p)]!r}"
            owners[id(p)] = name
    missing = [p for p in params if id(p) not in owners]
    if missing:
        return f"{len(missing)} trainable parameter(s) outside the model's layers"
    return None


def _conv1d_windows(a: torch.Tensor, layer: nn.Conv1d) -> torch.Tensor:
    """``a`` ``[N, C, L]`` padded and cut into the layer's kernel windows: ``[N, C, L_out, K]``."""
    (k,), (stride,), (dilation,) = layer.kernel_size, layer.stride, layer.dilation
    (pad,) = layer.padding  # type: ignore[misc]
    span = dilation * (k - 1) + 1
    windows = F.pad(a, (pad, pad)).unfold(2, span, stride)
    return windows[..., ::dilation] if dilation > 1 else windows


class LayerGradients:
    """Steps 1-4 of the module docstring for ``model`` (its trainable parameters ``params``,
    in flat-buffer order) and ``loss_of(output, target)``. Calling it with ``x`` / ``y``
    ``[P, B, ...]`` returns ``(grads [P, d], losses [P])``."""

    def __init__(self, model: nn.Module, params: Sequence[torch.Tensor],
                 loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        refusal = layer_grads_refusal(model, params)
        if refusal is not None:
            raise ValueError(f"LayerGradients is invalid for this model: {refusal}")
        self.model = model
        self.layers = [m for m in model.modules()
                       if isinstance(m, _LAYERS) and any(p.requires_grad for p in m.parameters(recurse=False))]
        self.params = list(params)
        self._losses = vmap(loss_of)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        world, batch = x.shape[0], x.shape[1]
        seen: dict[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]] = {m: [] for m in self.layers}

        def keep(module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
            seen[module].append((inputs[0], output))

        hooks = [m.register_forward_hook(keep) for m in self.layers]
        try:
            out = self.model(x.reshape(world * batch, *x.shape[2:]))
        finally:
            for h in hooks:
                h.remove()
        wrong = [(type(m).__name__, len(calls)) for m, calls in seen.items() if len(calls) != 1]
        if wrong:
            raise ValueError(f"a {wrong[0][0]} layer ran {wrong[0][1]} times in one forward: expected once "
                             "(per-layer gradients need each layer called once)")
        losses = self._losses(out.reshape(world, batch, *out.shape[1:]), y)
        outputs = [seen[m][0][1] for m in self.layers]
        grad_outputs = torch.autograd.grad(losses.sum(), outputs)
        by_param: dict[int, torch.Tensor] = {}
        for layer, g in zip(self.layers, grad_outputs):
            a = seen[layer][0][0].detach()
            if isinstance(layer, nn.Linear):
                a_r, g_r = a.reshape(world, -1, a.shape[-1]), g.reshape(world, -1, g.shape[-1])
                weight = torch.bmm(g_r.transpose(1, 2), a_r)
                bias = g_r.sum(1)
            else:
                windows = _conv1d_windows(a, layer)
                n, c, length, k = windows.shape
                g_r = g.reshape(world, n // world, g.shape[1], length)
                weight = torch.einsum("pbol,pbclk->pock", g_r, windows.reshape(world, n // world, c, length, k))
                bias = g_r.sum((1, 3))
            by_param[id(layer.weight)] = weight
            if layer.bias is not None:
                by_param[id(layer.bias)] = bias
        flat = torch.cat([by_param[id(p)].reshape(world, -1) for p in self.params], dim=1)
        return flat, losses.detach()
