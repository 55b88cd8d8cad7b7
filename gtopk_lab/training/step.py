"""The one training step of a method on one rank: compensate, select, communicate, update.

Used by real ranks (:func:`~gtopk_lab.training.loop.train_rank`), the simulator (P
:class:`RankStep` s, one in-process collective), the DDP hook and wait-free overlap
(:mod:`gtopk_lab.integrations`). One iteration of rank i of P:

1. ``g`` = the flat gradient; with ``grad_clip_mode="local"`` clipped at ``c = clip / sqrt(P)``
   (DGC's scaling: ``g *= c / ||g||`` when ``||g|| > c``) and, with ``momentum_correction``
   (DGC), local velocity ``u = m u + g`` replacing ``g``
2. ``acc = memory.compensate(g)`` (error feedback: ``g + residual``; no memory: ``g``)
3. ``values, indices = selector(acc, k)`` for sparse collectives (a :class:`Contribution`)
4. the method's collective: ``Collective.run`` on real ranks, ``Collective.simulate`` for
   virtual ranks (:func:`communicate` / :func:`communicate_simulated`), giving the sum G
5. ``memory.update(acc, values, indices, result)``; the velocity is zeroed at the rank's own
   selection (DGC's momentum factor masking)
6. the caller writes ``G / P`` into the gradient buffer and steps its optimiser
   (:meth:`RankStep.aggregate` gives G; a memory may map it, e.g. EF21's running mean; with
   ``grad_clip_mode="aggregated"`` G is scaled so that ``||G / P|| <= clip``, as the
   references' ``clip_grad_norm_`` after synchronisation: :func:`clip_aggregate`)

Infrequent synchronisation (``Method.sync_every`` = H > 1, DiLoCo-shaped) wraps this in
:class:`LocalSteps`: H local optimiser steps on the rank's own gradient, then steps 1-5 on
the pseudo-gradient ``anchor - w`` and an outer optimiser step from the anchor.

Cost: O(d) for compensation and update (clipping: one more O(d) norm), plus the selector's
and the collective's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from gtopk_lab.comm.stats import CollectiveResult
from gtopk_lab.compression.residual import ErrorFeedback
from gtopk_lab.methods.base import CommCall, Contribution, Method
from gtopk_lab.methods.registry import selector_for

__all__ = ["RankStep", "LocalSteps", "communicate", "communicate_simulated", "aggregate_dense",
           "clip_aggregate", "flat_params", "load_flat_params"]


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


class RankStep:
    """What one (real or virtual) rank keeps between iterations for its method, and steps 1-5.

    ``selector``: a registered selector name overriding the method's (``RunConfig.selector``).
    ``layout``: parameter shapes in flat-buffer order (handed to the collective).
    ``world``: P (given to memory factories with ``needs_world``; the clip scales with it).
    ``grad_clip`` / ``grad_clip_mode``: see steps 1 and 6 (``RunConfig.grad_clip_mode``).
    ``options``: the run's ``config.extra``; the method's declared options are read from it
    (:meth:`~gtopk_lab.methods.base.Method.run_options`) and handed to its memory factory
    (keyword ``options``, only for methods that declare options) and to every ``CommCall``.
    """

    def __init__(self, method: Method, numel: int, device: torch.device, *, rank: int = 0,
                 residual_rule: str = "mass", selector: str | None = None, grad_clip: float | None = None,
                 grad_clip_mode: str = "aggregated", momentum_correction: bool = False,
                 momentum: float = 0.0, algorithm: str | None = None,
                 layout: Sequence[tuple[int, ...]] = (), world: int = 1,
                 options: Mapping[str, Any] | None = None,
                 collective_options: dict[str, Any] | None = None) -> None:
        self.method, self.numel, self.rank = method, numel, rank
        # the whole extra (a collective may read its own keys, e.g. powersgd_rank) with the
        # method's declared options and their defaults on top
        self.options = {**dict(options or {}), **method.run_options(options)}
        self.select, self.exact_k = selector_for(method, selector)
        self.algorithm = method.comm.algorithm_for(method.algorithm or algorithm)
        if grad_clip_mode not in ("aggregated", "local"):
            raise ValueError(f"grad_clip_mode={grad_clip_mode!r} is invalid: expected aggregated or local")
        self.grad_clip, self.grad_clip_mode, self.momentum = grad_clip, grad_clip_mode, momentum
        self.world = world
        memory = method.memory
        if memory == "residual":
            self.memory: Any = ErrorFeedback(numel, rule=residual_rule, device=device)
        elif memory is None:
            self.memory = None
        elif getattr(memory, "needs_world", False):  # its error is against the mean G / P
            self.memory = memory(numel, residual_rule, device, world=world)
        elif method.options:  # hyper-parameters reach the factory (older factories take three)
            self.memory = memory(numel, residual_rule, device, options=self.options)
        else:
            self.memory = memory(numel, residual_rule, device)
        # DGC momentum correction means something only where entries stay behind
        self.velocity = torch.zeros(numel, device=device) if momentum_correction and method.sparse else None
        make_state = method.comm.make_state
        if collective_options and make_state is None:
            raise ValueError(f"collective_options={collective_options!r} is invalid for method "
                             f"{method.name!r}: its collective keeps no state to configure")
        self.collective_state = make_state(**(collective_options or {})) if make_state is not None else None
        self.layout = tuple(tuple(s) for s in layout)

    def prepare(self, g: torch.Tensor, k: int) -> Contribution:
        """Steps 1-3: clip, momentum correction, compensation, selection."""
        if self.grad_clip is not None and self.grad_clip_mode == "local":
            # DGC clips each of the P local gradients at clip / sqrt(P), so that their sum's
            # norm stays near what one worker's clip would allow on the whole batch
            threshold = self.grad_clip / math.sqrt(self.world)
            norm = float(torch.linalg.vector_norm(g))
            if norm > threshold:
                g = g * (threshold / (norm + 1e-12))
        if self.velocity is not None:
            self.velocity.mul_(self.momentum).add_(g)
            g = self.velocity
        acc = self.memory.compensate(g) if self.memory is not None else g
        if not self.method.sparse:
            return Contribution(gradient=g, acc=acc)
        values, indices = self.select(acc, k)
        return Contribution(gradient=g, acc=acc, values=values, indices=indices)

    def describe(self) -> dict[str, Any]:
        """What a run summary records of the collective's settings (e.g. Ok-Topk's
        ``oktopk_tau``), from its state's ``describe()``; {} without one."""
        describe = getattr(self.collective_state, "describe", None)
        return dict(describe()) if callable(describe) else {}

    def call(self, k: int, iteration: int = 0, group: Any = None) -> CommCall:
        """The :class:`CommCall` of this rank's next collective."""
        return CommCall(numel=self.numel, k=k, exact_k=self.exact_k, algorithm=self.algorithm,
                        state=self.collective_state, iteration=iteration, layout=self.layout, group=group,
                        options=self.options)

    def finish(self, contribution: Contribution, result: CollectiveResult) -> None:
        """Step 5: memory update and momentum factor masking at the local selection S_i.

        Masking at the global index set instead would zero the velocity of entries this
        rank never sent (their mass still sits in its residual) whenever another rank's
        selection reached the global set.
        """
        if self.memory is not None:
            self.memory.update(contribution.acc, contribution.values, contribution.indices, result)
        if self.velocity is not None and contribution.indices is not None:
            self.velocity[contribution.indices.long()] = 0.0

    def aggregate(self, result: CollectiveResult, device: torch.device) -> torch.Tensor:
        """The dense sum G the update divides by P. A memory with ``aggregate(G) -> G'`` maps it
        first (EF21-shaped memories keep the running sum of the compressed differences)."""
        dense = aggregate_dense(result, self.numel, device)
        hook = getattr(self.memory, "aggregate", None)
        dense = hook(dense) if hook is not None else dense
        if self.grad_clip is not None and self.grad_clip_mode == "aggregated":
            dense = clip_aggregate(dense, self.grad_clip, self.world)
        return dense

    # --- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Memory, velocity and collective state (what a checkpoint keeps of this step)."""
        st = self.collective_state
        return {"memory": self.memory.state_dict() if self.memory is not None else None,
                "velocity": self.velocity.detach().cpu().clone() if self.velocity is not None else None,
                "collective_state": dataclasses.asdict(st) if dataclasses.is_dataclass(st) else st}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        if self.memory is not None and saved.get("memory") is not None:
            self.memory.load_state_dict(saved["memory"])
        if self.velocity is not None and saved.get("velocity") is not None:
            self.velocity.copy_(saved["velocity"].to(self.velocity.device))
        st = saved.get("collective_state")
        if st is not None and dataclasses.is_dataclass(self.collective_state):
            self.collective_state = type(self.collective_state)(**st)
        elif st is not None:
            self.collective_state = st


def communicate(method: Method, contribution: Contribution, call: CommCall) -> CollectiveResult:
    """Step 4 on a real rank (torch.distributed)."""
    return method.comm.run(contribution, call)


def communicate_simulated(method: Method, contributions: list[Contribution], call: CommCall
                          ) -> list[CollectiveResult]:
    """Step 4 for P virtual ranks in this process: one result per rank, bitwise as real ranks."""
    return method.comm.simulate(contributions, call)


def aggregate_dense(result: CollectiveResult, numel: int, device: torch.device) -> torch.Tensor:
    """The collective's result as a dense model-sized tensor G (sum over ranks)."""
    if result.indices is None:
        return result.values.reshape(-1)
    dense = torch.zeros(numel, dtype=result.values.dtype, device=device)
    dense[result.indices.long()] = result.values
    return dense


def clip_aggregate(total: torch.Tensor, max_norm: float, world: int) -> torch.Tensor:
    """``total`` (the sum G) scaled so that the update ``G / P`` has L2 norm <= ``max_norm``.

    1. ``n = ||G / P||``
    2. ``c = max_norm / (n + 1e-6)`` (``torch.nn.utils.clip_grad_norm_``'s rule, which both
       references call on the synchronised mean gradient)
    3. ``G * c`` when ``c < 1``, else ``G`` itself

    A new tensor when it scales (a memory's own buffer is never changed). Every rank holds
    the same G, so every rank scales alike. Cost: O(d).
    """
    norm = float(torch.linalg.vector_norm(total / world))
    coef = max_norm / (norm + 1e-6)
    return total * coef if coef < 1.0 else total


class LocalSteps:
    """Infrequent synchronisation (DiLoCo-shaped): the anchor and the outer optimiser.

    ``params`` are the model's parameters (the weights the outer step moves); ``anchor`` is
    their flat value after the last synchronisation. :meth:`due` says whether iteration
    ``it`` ends a round of ``sync_every`` local steps; :meth:`pseudo_gradient` is
    ``anchor - w``; :meth:`outer_step` resets the weights to the anchor, writes
    ``aggregate / P`` into the parameters' gradients, steps the outer optimiser and takes
    the new anchor. H is ``config.extra["sync_every"]`` when set, else ``method.sync_every``.
    """

    def __init__(self, method: Method, params: list[torch.nn.Parameter], config: Any) -> None:
        self.sync_every = method.run_options(config.extra)["sync_every"]
        self.params = params
        factory = method.outer_optimizer
        self.outer = (factory(params, config) if factory is not None
                      else torch.optim.SGD(params, lr=1.0, momentum=0.0))
        self.anchor = self.flat()  # torch.cat already copies

    def flat(self) -> torch.Tensor:
        return flat_params(self.params)

    def due(self, iteration: int) -> bool:
        return (iteration + 1) % self.sync_every == 0

    def pseudo_gradient(self) -> torch.Tensor:
        return self.anchor - self.flat()

    def outer_step(self, aggregate: torch.Tensor, world: int) -> None:
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
