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
   over ranks), bias ``sum_b g_b``; Conv1d ``W_r[o, c, j] = sum_{b,l} g[b, o, l]
   a_pad[b, c, s l + d j]`` (stride s, dilation d) and bias ``sum_{b,l} g``
   (:func:`conv1d_rank_grads`, below);
4. the ``[P, ...]`` gradients flattened in the replica's flat-buffer order: ``[P, d]``.

A Conv1d's sum has two forms. By default the padded input is cut into its kernel windows
``a_w[b, c, l, j]`` and one ``einsum`` contracts (b, l) (with fewer than 8 columns C K, as one
``bmm`` of the windows' transpose with the output gradients': the product is then formed
``[C K, O]``, wide enough for the GEMM's vectors). With 8 or more input channels and
``O <= B L / 2`` (``_phases_pay``) copying the windows (K times the input, a 6-d gather) costs
more than their product and the reordering below, so the input is split into its s stride
phases, each laid out ``[B, U, C]`` per rank (one copy of the input): tap j reads phase
``d j mod s`` shifted by ``d j div s`` rows, a strided view of that buffer in which (b, l) is
one dimension, and ``W_r[:, :, j]`` is one ``bmm`` with the output gradients laid out
``[P, O, B U]`` (zero for ``l >= L``, so a window that runs into the next sample's rows adds
nothing). The bias sums read that contiguous layout. At P = 64, B = 16 the MNIST-1D CNN's
25-channel layers take 0.63-0.82x of the windows' time this way.

:func:`layer_grads_refusal` says in one line why a model cannot take this path (a parameter
outside those layers, grouped or non-zero-padded convolutions, a layer shared by two
parents); a layer the forward calls twice, or never, is found on the call and raises
``ValueError``. :class:`~gtopk_lab.training.batched_ranks.BatchedGradients` checks the first
call against ``vmap`` and keeps ``vmap`` for the run where they differ.

Cost: one forward and one input-gradient backward over P B samples, plus per layer one
``bmm`` (Linear), one ``einsum`` or K ``bmm`` s (Conv1d) over its inputs and output gradients
(the FLOPs of the weight gradients the sequential path forms), in a constant number of calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

__all__ = ["LayerGradients", "conv1d_rank_grads", "layer_grads_refusal"]

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


#: below this many input channels a Conv1d takes the windows' einsum (a tap's product would
#: be a matrix-vector product, which the batched GEMM runs slowly, and the windows are small)
_PHASES_MIN_CHANNELS = 8


#: below this many columns (C K) the windows' product is formed transposed: a GEMM whose output
#: rows are shorter than one 256-bit register of fp32 runs at a fraction of its speed (the
#: MNIST-1D CNN's first layer, C K = 5, O = 25 at P = 64, B = 16: 0.72 ms against 1.02; at
#: C K = 20 the einsum's form was the faster, 1.21 against 1.39 ms)
_NARROW_COLUMNS = 8


def _phases_pay(channels: int, out_channels: int, batch: int, length: int) -> bool:
    """Whether the stride-phase form beats the windows' einsum for a Conv1d (module docstring):
    its taps come out ``[K, P, O, C]`` and are reordered to ``[P, O, C, K]`` (P O C K
    elements), which pays while that is at most half the windows' P B L C K (``O <= B L / 2``;
    measured on a grid of C, O from 25 to 192 at P = 64, B = 16: 0.63-0.83x of the windows'
    time inside that line, 0.95-1.24x outside)."""
    return channels >= _PHASES_MIN_CHANNELS and 2 * out_channels <= batch * length


def _conv1d_windows(a: torch.Tensor, layer: nn.Conv1d) -> torch.Tensor:
    """``a`` ``[N, C, L]`` padded and cut into the layer's kernel windows: ``[N, C, L_out, K]``."""
    (k,), (stride,), (dilation,) = layer.kernel_size, layer.stride, layer.dilation
    (pad,) = layer.padding  # type: ignore[misc]
    span = dilation * (k - 1) + 1
    windows = F.pad(a, (pad, pad)).unfold(2, span, stride)
    return windows[..., ::dilation] if dilation > 1 else windows


def _conv1d_by_phases(a: torch.Tensor, g: torch.Tensor, layer: nn.Conv1d,
                      world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The stride-phase form (module docstring): ``(W [P, O, C, K], bias [P, O])``."""
    (k,), (stride,), (dilation,) = layer.kernel_size, layer.stride, layer.dilation
    (pad,) = layer.padding  # type: ignore[misc]
    n, c, length_in = a.shape
    out_ch, length = g.shape[1], g.shape[2]
    batch = n // world
    phase = [(j * dilation) % stride for j in range(k)]
    shift = [(j * dilation) // stride for j in range(k)]
    rows = length + max(shift)  # U: rows l + shift of every tap, l < L, within one sample
    # plus a zero tail: the last sample's windows run up to max(shift) rows past its end
    phases = a.new_empty(stride, n * rows + rows, c)
    phases[:, n * rows:].zero_()
    body = phases[:, :n * rows].view(stride, n, rows, c)
    for p in sorted(set(phase)):
        # row u of phase p is padded position u s + p, input position u s + p - pad
        first = max(0, -((p - pad) // stride))
        start = first * stride + p - pad
        count = max(0, min(rows - first, -(-(length_in - start) // stride)))
        if count:
            body[p, :, first:first + count].copy_(
                a[:, :, start:start + stride * (count - 1) + 1:stride].transpose(1, 2))
        body[p, :, :first].zero_()
        body[p, :, first + count:].zero_()
    g_rows = g.new_empty(world, out_ch, batch, rows)
    g_rows[..., length:].zero_()
    g_rows[..., :length].copy_(g.reshape(world, batch, out_ch, length).transpose(1, 2))
    g_rows = g_rows.view(world, out_ch, batch * rows)
    taps = a.new_empty(k, world, out_ch, c)
    for j in range(k):
        base = phases[phase[j]]
        window = base.as_strided((world, batch * rows, c), (batch * rows * c, c, 1),
                                 base.storage_offset() + shift[j] * c)
        torch.bmm(g_rows, window, out=taps[j])
    return taps.permute(1, 2, 3, 0), g_rows.sum(2)


def conv1d_rank_grads(a: torch.Tensor, g: torch.Tensor, layer: nn.Conv1d,
                      world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's weight and bias gradient of ``layer`` (zero padding by a number, one
    group) from its input ``a`` ``[P B, C, L_in]`` and output gradient ``g`` ``[P B, O, L]``,
    rows rank-major: ``(W [P, O, C, K], bias [P, O])`` (the module docstring's two forms)."""
    if _phases_pay(a.shape[1], g.shape[1], a.shape[0] // world, g.shape[2]):
        return _conv1d_by_phases(a, g, layer, world)
    windows = _conv1d_windows(a, layer)
    n, c, length, k = windows.shape
    g_r = g.reshape(world, n // world, g.shape[1], length)
    if c * k < _NARROW_COLUMNS:
        # the einsum's product would write C K columns, too few for the GEMM's vector width;
        # transposed, it writes O: W_r^T = windows_r^T [C K, B L] @ g_r^T [B L, O]
        rows = n // world * length
        x = windows.permute(0, 2, 1, 3).reshape(world, rows, c * k)
        g_t = g.transpose(1, 2).reshape(world, rows, g.shape[1])
        weight = torch.bmm(x.transpose(1, 2), g_t).view(world, c, k, -1).permute(0, 3, 1, 2)
        return weight, g_r.sum(3).sum(1)
    weight = torch.einsum("pbol,pbclk->pock", g_r, windows.reshape(world, n // world, c, length, k))
    return weight, g_r.sum(3).sum(1)


class LayerGradients:
    """Steps 1-4 of the module docstring for ``model`` (its trainable parameters ``params``,
    in flat-buffer order) and ``loss_of(output, target)``; ``rank_losses(output [P B, ...],
    target [P, B, ...]) -> [P]``, where given, forms the P losses in one call instead of a
    ``vmap`` of ``loss_of`` (:meth:`~gtopk_lab.training.replica.Replica.rank_losses`).
    Calling it with ``x`` / ``y`` ``[P, B, ...]`` returns ``(grads [P, d], losses [P])``."""

    def __init__(self, model: nn.Module, params: Sequence[torch.Tensor],
                 loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 rank_losses: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> None:
        refusal = layer_grads_refusal(model, params)
        if refusal is not None:
            raise ValueError(f"LayerGradients is invalid for this model: {refusal}")
        self.model = model
        self.layers = [m for m in model.modules()
                       if isinstance(m, _LAYERS) and any(p.requires_grad for p in m.parameters(recurse=False))]
        self.params = list(params)
        if rank_losses is None:
            per_rank = vmap(loss_of)

            def rank_losses(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                return per_rank(out.reshape(y.shape[0], y.shape[1], *out.shape[1:]), y)
        self._rank_losses = rank_losses

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
        losses = self._rank_losses(out, y)
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
                weight, bias = conv1d_rank_grads(a, g, layer, world)
            by_param[id(layer.weight)] = weight
            if layer.bias is not None:
                by_param[id(layer.bias)] = bias
        flat = torch.cat([by_param[id(p)].reshape(world, -1) for p in self.params], dim=1)
        return flat, losses.detach()
