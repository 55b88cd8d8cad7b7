"""The one training step of a method on one rank: compensate, select, communicate, update.

Every driver runs it: real ranks (:func:`~gtopk_lab.training.loop.train_rank`), the simulator
(P :class:`RankStep` s, one in-process collective), the DDP hook and wait-free overlap
(:mod:`gtopk_lab.integrations`) and calibration (:mod:`~gtopk_lab.training.compute_time`),
each building its steps from one :class:`~gtopk_lab.training.step_settings.StepSettings`.
A synchronisation is a program, as the collectives are: :meth:`RankStep.sync` yields this
rank's :class:`Contribution` and :class:`CommCall`, is sent the :class:`CollectiveResult`
and returns the update ``G / P`` (:meth:`RankStep.begin` drives it to its yield and hands
back a :class:`Sync`). One synchronisation on rank i of P:

1. ``g`` = the flat gradient; with ``grad_clip_mode="local"`` clipped at ``c = clip / sqrt(P)``
   (DGC's scaling: ``g *= c / ||g||`` when ``||g|| > c``) and, with ``momentum_correction``
   (DGC), local velocity ``u = m u + g`` replacing ``g`` (:meth:`RankStep.prepare`)
2. ``acc = memory.compensate(g)`` (error feedback: ``g + residual``; no memory: ``g``)
3. ``values, indices = selector(acc, k)`` for sparse collectives (a :class:`Contribution`);
   for an ``input="leader"`` collective (CLT-k) on the call's leader only, so that its
   selection is timed and charged as every other method's
4. the driver runs the method's collective: ``Collective.run`` on a real rank,
   ``Collective.simulate`` over all P contributions for virtual ranks, giving the sum G
5. ``memory.update(acc, values, indices, result)``; the velocity is zeroed at the rank's own
   selection (DGC's momentum factor masking) (:meth:`RankStep.finish`)
6. the dense G (:meth:`RankStep.aggregate`): a memory with ``aggregate(G) -> G'`` maps it
   (EF21's running sum); with ``grad_clip_mode="aggregated"`` G is scaled so that
   ``||G / P|| <= clip``, as the references' ``clip_grad_norm_`` after synchronisation
   (:func:`clip_aggregate`); the step returns ``G / P`` and the driver writes it into its
   gradients and steps its optimiser

Local-steps methods (``Method.sync_every`` = H > 1 or an outer optimiser, DiLoCo-shaped): the
step holds their :class:`~gtopk_lab.training.local_steps.LocalSteps`. :meth:`RankStep.local_step`
takes the inner optimiser step every iteration (a no-op for per-step methods); the program
synchronises only on the last iteration of a round (otherwise it returns at once, without a
collective), on the pseudo-gradient ``anchor - w``, and ends with the outer step from the
anchor instead of returning an update (it returns None: nothing is left to write).

Cost: O(d) for compensation and update (clipping: one more O(d) norm; the update: one
O(d) division), plus the selector's and the collective's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gtopk_lab.comm.stats import CollectiveResult
from gtopk_lab.compression.residual import ErrorFeedback
from gtopk_lab.methods.base import Collective, CommCall, Contribution, Method
from gtopk_lab.methods.registry import selector_for
from gtopk_lab.training.local_steps import LocalSteps
from gtopk_lab.training.step_settings import StepSettings

__all__ = ["RankStep", "Sync", "SyncProgram", "communicate", "communicate_simulated", "aggregate_dense",
           "clip_aggregate"]

#: :meth:`RankStep.sync`: yields (contribution, call), is sent the result, returns G / P or None.
SyncProgram = Generator[tuple[Contribution, CommCall], CollectiveResult, "torch.Tensor | None"]


@dataclass
class Sync:
    """One rank's synchronisation waiting for its collective (:meth:`RankStep.begin`).

    ``contribution`` and ``call`` go to the collective; :meth:`finish` takes its result and
    returns what the driver writes (``G / P``, or None after a local-steps outer step).
    """

    contribution: Contribution
    call: CommCall
    program: SyncProgram
    #: the collective compresses the input itself (``Collective.compresses``: PowerSGD)
    compresses: bool = False

    @property
    def selected(self) -> bool:
        """Whether this rank pays a selection, which the drivers charge: step 3 ran on it (every
        rank of a sparse method, the call's leader of an ``input="leader"`` collective) or its
        collective compresses its input."""
        return self.contribution.indices is not None or self.compresses

    def finish(self, result: CollectiveResult) -> torch.Tensor | None:
        try:
            self.program.send(result)
        except StopIteration as done:
            return done.value
        raise RuntimeError("RankStep.sync yielded twice: a synchronisation has one collective")


class RankStep:
    """What one (real or virtual) rank keeps between iterations for its method, and steps 1-6.

    ``settings``: the run's :class:`StepSettings` (or a :class:`Method`, with the settings'
    fields as keywords: ``RankStep(method, d, device, world=4)`` is
    ``RankStep(StepSettings(method, world=4), d, device)``). ``numel``: d, the flat buffer's
    length; ``layout``: parameter shapes in flat-buffer order (handed to the collective, e.g.
    PowerSGD's per-layer plan). ``params`` / ``optimizer``: the model's parameters and the
    rank's optimiser, needed by local-steps methods only (inner and outer steps move them;
    without them such a step has its parts, :meth:`prepare` to :meth:`aggregate`, only).
    The method's declared options (:meth:`~gtopk_lab.methods.base.Method.run_options`) reach
    its memory factory (keyword ``options``, only for methods that declare options) and every
    ``CommCall`` (with the rest of the settings' ``options``).
    """

    def __init__(self, settings: StepSettings | Method, numel: int, device: torch.device, *, rank: int = 0,
                 layout: Sequence[tuple[int, ...]] = (), params: Sequence[torch.nn.Parameter] | None = None,
                 optimizer: torch.optim.Optimizer | None = None, **fields: Any) -> None:
        if isinstance(settings, Method):
            settings = StepSettings(settings, **fields)
        elif fields:
            raise TypeError(f"RankStep got settings and the fields {sorted(fields)}: give one or the other")
        method = settings.method
        self.settings, self.method, self.numel, self.rank = settings, method, numel, rank
        self.world = settings.world
        # the whole extra (a collective may read its own keys, e.g. powersgd_rank) with the
        # method's declared options and their defaults on top
        self.options = {**settings.options, **method.run_options(settings.options)}
        self.select, self.exact_k = selector_for(method, settings.selector)
        self.algorithm = method.pattern_for(settings.algorithm)
        self.memory: Any = _make_memory(settings, numel, device)
        # DGC momentum correction means something only where entries stay behind
        self.velocity = (torch.zeros(numel, device=device) if settings.momentum_correction and method.sparse
                         else None)
        make_state = method.comm.make_state
        self.collective_state = (make_state(**(settings.collective_options or {})) if make_state is not None
                                 else None)
        self.layout = tuple(tuple(s) for s in layout)
        # without the model a local-steps step has its parts (prepare ... aggregate) only
        self.local: LocalSteps | None = None
        if settings.local_steps and params is not None and optimizer is not None:
            self.local = LocalSteps(settings, list(params), optimizer)

    @property
    def collective(self) -> Collective:
        """The method's collective (``run`` on a real rank, ``simulate`` for virtual ranks)."""
        return self.method.comm

    # --- one iteration ------------------------------------------------------------------------
    def local_step(self, lr: float) -> None:
        """The rank's own optimiser step between synchronisations: one inner step at ``lr`` on
        the gradients in the parameters' ``.grad`` for local-steps methods; nothing otherwise."""
        self._check_local()
        if self.local is not None:
            self.local.inner_step(lr)

    def sync(self, g: torch.Tensor, k: int, iteration: int = 0, group: Any = None, *,
             shared_buffer: bool = False) -> SyncProgram:
        """This rank's synchronisation of iteration ``iteration`` as a program (steps 1-6).

        ``g``: the flat gradient (a local-steps method synchronises its pseudo-gradient instead,
        and only on the last iteration of a round: otherwise the program returns None without
        yielding). ``group``: the process group of a real rank. ``shared_buffer``: the caller
        overwrites ``g`` before the collective runs (the simulator's ranks share one gradient
        buffer), so a contribution that would alias ``g`` holds a copy instead.
        """
        self._check_local()
        if self.local is not None:
            if not self.local.due(iteration):
                return None
            g = self.local.pseudo_gradient()
        contribution = self.prepare(g, k, iteration)
        if shared_buffer and contribution.acc is g:
            acc = g.clone()
            contribution = dataclasses.replace(contribution, gradient=acc, acc=acc)
        result = yield contribution, self.call(k, iteration, group)
        self.finish(contribution, result)
        total = self.aggregate(result, g.device)
        if self.local is not None:
            self.local.outer_step(total, self.world)
            return None
        return torch.div(total, self.world)

    def begin(self, g: torch.Tensor, k: int, iteration: int = 0, group: Any = None, *,
              shared_buffer: bool = False) -> Sync | None:
        """:meth:`sync` run to its collective: a :class:`Sync`, or None when this iteration does
        not synchronise (a local-steps method between synchronisations)."""
        program = self.sync(g, k, iteration, group, shared_buffer=shared_buffer)
        try:
            contribution, call = next(program)
        except StopIteration:
            return None
        return Sync(contribution, call, program, compresses=self.method.comm.compresses)

    def _check_local(self) -> None:
        if self.settings.local_steps and self.local is None:
            raise ValueError(f"method={self.method.name!r} takes local steps: its RankStep needs the model's "
                             "params and the rank's optimizer to synchronise")

    # --- the parts of a synchronisation ----------------------------------------------------------
    def prepare(self, g: torch.Tensor, k: int, iteration: int = 0) -> Contribution:
        """Steps 1-3: clip, momentum correction, compensation, selection (on every rank, or for
        an ``input="leader"`` collective on the rank it names for ``iteration`` only)."""
        if self.settings.grad_clip is not None and self.settings.grad_clip_mode == "local":
            # DGC clips each of the P local gradients at clip / sqrt(P), so that their sum's
            # norm stays near what one worker's clip would allow on the whole batch
            threshold = self.settings.grad_clip / math.sqrt(self.world)
            norm = float(torch.linalg.vector_norm(g))
            if norm > threshold:
                g = g * (threshold / (norm + 1e-12))
        if self.velocity is not None:  # DGC's momentum correction: u = m u + g is what is sent
            self.velocity.mul_(self.settings.momentum).add_(g)
            g = self.velocity
        acc = self.memory.compensate(g) if self.memory is not None else g
        if not self.selects_at(iteration):
            return Contribution(gradient=g, acc=acc)
        values, indices = self.select(acc, k)
        return Contribution(gradient=g, acc=acc, values=values, indices=indices)

    def selects_at(self, iteration: int) -> bool:
        """Whether this rank selects in ``iteration``: every rank of a sparse method; the
        leader the collective names (``Collective.leader``) of an ``input="leader"`` one."""
        comm = self.method.comm
        if comm.input == "leader":
            return comm.leader(iteration, self.world) == self.rank
        return comm.input == "sparse"

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
        """Step 6's dense sum G (the update divides it by P). A memory with
        ``aggregate(G) -> G'`` maps it first (EF21-shaped memories keep the running sum of the
        compressed differences)."""
        dense = aggregate_dense(result, self.numel, device)
        hook = getattr(self.memory, "aggregate", None)
        dense = hook(dense) if hook is not None else dense
        if self.settings.grad_clip is not None and self.settings.grad_clip_mode == "aggregated":
            dense = clip_aggregate(dense, self.settings.grad_clip, self.world)
        return dense

    def describe(self) -> dict[str, Any]:
        """What a run summary records of the collective's settings (e.g. Ok-Topk's
        ``oktopk_tau``), from its state's ``describe()``; {} without one."""
        describe = getattr(self.collective_state, "describe", None)
        return dict(describe()) if callable(describe) else {}

    # --- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Memory, velocity and collective state (what a checkpoint keeps of this step; a
        local-steps method's anchor and outer optimiser are ``self.local.state_dict()``)."""
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


def _make_memory(settings: StepSettings, numel: int, device: torch.device) -> Any:
    """The method's memory: the project's error feedback, none, or the method's factory (given
    ``world`` when it ``needs_world``, its options when the method declares any)."""
    method, rule = settings.method, settings.residual_rule
    memory = method.memory
    if memory == "residual":
        return ErrorFeedback(numel, rule=rule, device=device)
    if memory is None:
        return None
    if getattr(memory, "needs_world", False):  # its error is against the mean G / P
        return memory(numel, rule, device, world=settings.world)
    if method.options:  # hyper-parameters reach the factory (older factories take three)
        return memory(numel, rule, device, options={**settings.options, **method.run_options(settings.options)})
    return memory(numel, rule, device)


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
