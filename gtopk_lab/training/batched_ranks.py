"""The simulator's P gradients in one batched call: ``vmap`` of ``grad`` over the ranks' shards.

In synchronous SGD every virtual rank holds the same weights, so the P forward/backward
passes of an iteration differ only in their data. Run one after the other (the sequential
path of :mod:`~gtopk_lab.training.simulator`), a small model pays P times the per-call
overhead of autograd and of every kernel launch; batched, it pays it once:

1. ``loss(params, x, y)``: the replica's model as a function of its parameters
   (``torch.func.functional_call``, tied weights kept tied) and its loss;
2. ``vmap(grad_and_value(loss), in_dims=(None, 0, 0))`` over the stacked shards
   ``x: [P, B, ...]``, ``y: [P, B, ...]`` with the shared weights: every rank's gradient and loss in
   one call;
3. the gradients flattened in the replica's flat-buffer order into one ``[P, d]`` tensor:
   row r is rank r's ``g``, handed to its own training step (``RankStep.begin``) as the
   sequential path hands it the replica's buffer.

A model of ``nn.Linear`` / ``nn.Conv1d`` layers takes steps 1-3 as one plain forward and
backward instead (:mod:`~gtopk_lab.training.layer_grads`: each layer's per-rank weight
gradient from its inputs and output gradients; the MNIST-1D CNN, its wide variant and the
MLP), checked on the run's first batch against vmap (:meth:`BatchedGradients.check`, float
tolerance), which stays for the run where they differ; ``rule`` says which ran.

Each row equals the sequential gradient to float tolerance (vmapped GEMMs may sum in
another order: measured 2e-8 on gradients of 0.27 for the MNIST-1D CNN, bitwise for the MLP).

Where it cannot stand in for the sequential path, :func:`batched_refusal` says why in one
line: a model with buffers (BatchNorm: each rank keeps its own running statistics, which
the sequential path swaps in), a model with dropout (each rank draws from its own
generator), a local-steps method (DiLoCo-shaped: each rank's weights diverge between
synchronisations). ``simulator.batched="auto"`` then falls back to the sequential path,
``"on"`` raises ``ValueError`` with that line.

Cost per iteration: one vmapped forward/backward over P * B samples (memory: P
activations of one batch and the ``[P, d]`` gradients, 4 P d bytes), against P calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from gtopk_lab.config_options import SIM_BATCHED
from gtopk_lab.training.layer_grads import LayerGradients, layer_grads_refusal
from gtopk_lab.training.replica import Replica
from gtopk_lab.training.step_settings import StepSettings

__all__ = ["BatchedGradients", "batched_refusal", "use_batched"]


def _dropout_of(module: nn.Module) -> float:
    """The dropout probability a module applies in training (0 for none)."""
    if isinstance(module, nn.modules.dropout._DropoutNd):
        return float(module.p)
    if isinstance(module, nn.RNNBase):
        return float(module.dropout)
    # modules that pass a probability to a functional call (the GPT's attention)
    p = getattr(module, "dropout", 0.0)
    return float(p) if isinstance(p, (int, float)) and not isinstance(p, bool) else 0.0


def batched_refusal(settings: StepSettings, model: nn.Module) -> str | None:
    """Why the batched gradients cannot replace the sequential path for this run, in one
    line, or None when they can (see the module docstring)."""
    method = settings.method
    if settings.local_steps:
        return (f"method {method.name!r} takes local steps: each virtual rank's weights diverge between "
                "synchronisations")
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        return (f"the model has buffers ({buffers[0]}, ...): each virtual rank keeps its own BatchNorm "
                "statistics")
    dropped = [name or type(model).__name__ for name, m in model.named_modules() if _dropout_of(m) > 0]
    if dropped:
        return f"the model has dropout ({dropped[0]}): each virtual rank draws its own dropout masks"
    return None


def use_batched(option: str | None, refusal: str | None, world: int = 2, slower: str | None = None) -> bool:
    """Whether the simulator batches: ``option`` ("auto"/None, "on", "off") against the
    run's :func:`batched_refusal`. ``"on"`` with a refusal raises ``ValueError`` with it.
    ``"auto"`` leaves one rank (``world`` 1) sequential: nothing to batch, and the vmapped
    call costs more than a plain backward (measured 4.8 ms against 2.5 ms, MNIST-1D CNN), and
    so does a model whose ``ModelSpec.batched_slower`` (``slower``) says why batching is slower."""
    option = "auto" if option is None else option
    if option not in SIM_BATCHED:
        raise ValueError(f"simulator.batched={option!r} is invalid: expected one of {', '.join(SIM_BATCHED)}")
    if option == "off":
        return False
    if option == "on" and refusal is not None:
        raise ValueError(f"simulator.batched='on' is invalid for this run: {refusal}")
    return refusal is None and (option == "on" or (world > 1 and slower is None))


class BatchedGradients:
    """Every virtual rank's gradient and loss in one call (steps 1-3 of the module docstring).

    ``replica``: the simulator's shared replica (its model, loss and flat-buffer order).
    Calling it with ``xs`` / ``ys`` (one batch per rank, or those stacked: ``[P, B, ...]``)
    returns ``(grads, losses)``: ``grads`` ``[P, d]`` (row r: rank r's flat gradient),
    ``losses`` ``[P]``.
    """

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        model = replica.model
        by_id = {id(p): name for name, p in model.named_parameters()}
        # the flat buffer's order is replica.params'; functional_call takes them by name
        self.names: list[str] = [by_id[id(p)] for p in replica.params]
        loss_of = replica.loss

        def loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return loss_of(functional_call(model, params, (x,)), y)

        self._grads: Callable[..., Any] = vmap(grad_and_value(loss), in_dims=(None, 0, 0))
        # per-layer gradients where the model allows, checked once against vmap (check())
        self.rule_refusal = layer_grads_refusal(model, replica.params)
        self._layers = (LayerGradients(model, replica.params, loss_of, replica.rank_losses)
                        if self.rule_refusal is None else None)
        self.checked = self._layers is None

    @property
    def rule(self) -> str:
        """How the gradients are computed: ``"layers"`` (:mod:`~gtopk_lab.training.layer_grads`)
        or ``"vmap"`` (why not: ``rule_refusal``)."""
        return "layers" if self._layers is not None else "vmap"

    def how(self) -> tuple[str, str | None]:
        """``(rule, rule_refusal)`` for the run's summary."""
        return self.rule, self.rule_refusal

    def _inputs(self, xs: Sequence[torch.Tensor] | torch.Tensor,
                ys: Sequence[torch.Tensor] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.replica.model.train()
        dev = self.replica.device
        x = (xs if isinstance(xs, torch.Tensor) else torch.stack(list(xs))).to(dev, non_blocking=True)
        y = (ys if isinstance(ys, torch.Tensor) else torch.stack(list(ys))).to(dev, non_blocking=True)
        return x, y

    def _vmapped(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        params = {name: p.detach() for name, p in zip(self.names, self.replica.params)}
        grads, losses = self._grads(params, x, y)
        world = x.shape[0]
        flat = torch.cat([grads[name].reshape(world, -1) for name in self.names], dim=1)
        return flat, losses.detach()

    def check(self, xs: Sequence[torch.Tensor] | torch.Tensor, ys: Sequence[torch.Tensor] | torch.Tensor) -> None:
        """Once per run, before the first call is timed: the per-layer gradients of this batch
        against vmap's (float tolerance); where they differ or fail, vmap for the rest of the
        run (``rule_refusal`` says why). The model's RNG state is left as it was."""
        if self.checked:
            return
        self.checked = True
        assert self._layers is not None
        x, y = self._inputs(xs, ys)
        rng = torch.get_rng_state()
        want = self._vmapped(x, y)
        try:
            got = self._layers(x, y)
        except (ValueError, RuntimeError) as exc:
            self._layers, self.rule_refusal = None, f"per-layer gradients failed: {exc}"
            return
        finally:
            torch.set_rng_state(rng)
        scale = float(want[0].abs().max()) or 1.0
        if not (torch.allclose(got[0], want[0], rtol=1e-4, atol=1e-5 * scale)
                and torch.allclose(got[1], want[1], rtol=1e-5, atol=1e-6)):
            worst = float((got[0] - want[0]).abs().max())
            self._layers, self.rule_refusal = None, f"per-layer gradients differ from vmap's by {worst:.3g}"

    def __call__(self, xs: Sequence[torch.Tensor] | torch.Tensor,
                 ys: Sequence[torch.Tensor] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.check(xs, ys)
        x, y = self._inputs(xs, ys)
        if self._layers is not None:
            return self._layers(x, y)
        return self._vmapped(x, y)
