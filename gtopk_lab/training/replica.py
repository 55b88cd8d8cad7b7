"""One model replica: the model, its optimiser and the one flat gradient buffer every ``.grad`` views.

In a real run each rank holds one :class:`Replica`; the simulator holds one for all its
virtual ranks (their weights are identical in synchronous SGD; what differs per rank lives in
:class:`~gtopk_lab.training.rank_state.RankState`). Per iteration:

1. :meth:`Replica.forward_backward`: zero the flat buffer, forward, backward (the plain
   gradient: weight decay is the optimiser's, with DGC in a dense buffer of its own)
2. the training step reads the flat buffer as the gradient ``g`` (no copy) and returns the
   update ``G / P``
3. :meth:`Replica.apply`: the update is written into the flat buffer and the optimiser steps

Also :meth:`Replica.evaluate` (test loss, accuracy, perplexity) and the flat view of the
weights (:func:`flat_params`, :func:`load_flat_params`). Cost per iteration: one forward and
backward, O(d) for the write and the optimiser step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from gtopk_lab.config import RunConfig
from gtopk_lab.training.data import Dataset
from gtopk_lab.training.models import build_model, count_parameters, get_model_spec
from gtopk_lab.training.optim import make_optimizer, set_lr
from gtopk_lab.training.shards import eval_batches

__all__ = ["Replica", "flat_params", "load_flat_params"]


def flat_params(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """A copy of ``params`` as one flat tensor, in order."""
    return torch.cat([p.detach().reshape(-1) for p in params])


@torch.no_grad()
def load_flat_params(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy ``flat`` into ``params`` in place (so parameters keep their ``.grad`` views)."""
    offset = 0
    for p in params:
        n = p.numel()
        p.copy_(flat[offset:offset + n].view_as(p))
        offset += n


class Replica:
    """Model, optimiser and the one flat gradient buffer that every ``.grad`` views.

    In a real run each rank holds one replica; the simulator holds one for all its
    virtual ranks (weights are identical across ranks in synchronous SGD).
    """

    def __init__(self, config: RunConfig, world_size: int, device: torch.device) -> None:
        self.config = config
        self.world_size = world_size
        self.device = device
        self.spec = get_model_spec(config.model)
        model_kwargs = dict(config.model_options.kwargs or {})
        torch.manual_seed(config.seed)  # identical initial weights on every rank
        self.model: nn.Module = build_model(config.model, **model_kwargs).to(device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.numel = count_parameters(self.model)
        self.grad = torch.zeros(self.numel, dtype=torch.float32, device=device)
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = self.grad[offset:offset + n].view_as(p)
            offset += n
        self.optimizer = make_optimizer(self.model, config)
        #: parameter shapes in flat-buffer order (per-layer collectives reshape with it)
        self.layout = tuple(tuple(p.shape) for p in self.params)
        self.language_model = self.spec.task == "language_model"

    def flat_weights(self) -> torch.Tensor:
        """A copy of all parameters as one flat tensor (tests compare these)."""
        return flat_params(self.params)

    def _cross_entropy(self, output: torch.Tensor, target: torch.Tensor, reduction: str) -> torch.Tensor:
        # a language model's logits [B, T, V] score every token: one row per token
        if self.language_model:
            return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1), reduction=reduction)
        return F.cross_entropy(output, target, reduction=reduction)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self._cross_entropy(output, target, "mean")

    def rank_losses(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``loss`` of each of P ranks at once: ``output`` ``[P B, ...]`` (rows rank-major),
        ``target`` ``[P, B, ...]``; returns ``[P]``. Every sample's (token's) cross entropy in
        one call, averaged over each rank's own, as ``loss`` averages one rank's."""
        each = self._cross_entropy(output, target.reshape(-1, *target.shape[2:]), "none")
        return each.view(target.shape[0], -1).mean(1)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Zero the flat buffer, forward, backward; returns the mini-batch loss."""
        self.model.train()
        self.grad.zero_()
        x = x.to(self.device, non_blocking=True)
        y = y.to(self.device, non_blocking=True)
        loss = self.loss(self.model(x), y)
        loss.backward()
        return float(loss.detach())

    def load_flat(self, flat: torch.Tensor) -> None:
        """Copy a flat tensor into the parameters in place (they keep their ``.grad`` views)."""
        load_flat_params(self.params, flat)

    def apply(self, update: torch.Tensor, lr: float) -> None:
        """Write ``update`` (the step's ``G / P``) into the gradient buffer and take one
        optimiser step at learning rate ``lr``."""
        self.grad.copy_(update)
        set_lr(self.optimizer, lr)
        self.optimizer.step()

    @torch.no_grad()
    def evaluate(self, dataset: Dataset, batch_size: int = 1000) -> dict[str, float]:
        """Mean test loss, accuracy (fraction; per token for LMs) and perplexity (LMs)."""
        self.model.eval()
        total_loss, correct, count = 0.0, 0, 0
        for x, y in eval_batches(dataset, batch_size):
            x, y = x.to(self.device), y.to(self.device)
            out = self.model(x)
            n = y.numel()
            total_loss += float(self.loss(out, y)) * n
            correct += int((out.argmax(-1) == y).sum())
            count += n
        self.model.train()
        loss = total_loss / max(count, 1)
        return {"test_loss": loss, "test_accuracy": correct / max(count, 1),
                "test_perplexity": math.exp(min(loss, 700.0)) if self.language_model else math.nan,
                # nats per token -> bits per token: bits per byte for the byte tokenizer
                "test_bits_per_token": loss / math.log(2) if self.language_model else math.nan}
