"""gTop-k (and Top-k, Ok-Topk) sparsification as a PyTorch DDP communication hook.

Drop-in for ``torch.nn.parallel.DistributedDataParallel``::

    model = DistributedDataParallel(net)
    state = SparseHookState(density=0.01, method="gtopk", algorithm="butterfly",
                            residual_rule="mass", warmup_iterations=1)
    model.register_comm_hook(state, gtopk_hook)

The hook runs the project's one training step underneath
(:class:`~gtopk_lab.training.step.RankStep`, built from the hook's
:class:`~gtopk_lab.training.step_settings.StepSettings`: the method's memory, selector and
collective from the registry, :mod:`gtopk_lab.methods`), so a DDP model trained with it follows
the same trajectory as ``gtopk_lab.training.loop.train_rank`` with the same method
(tests/test_ddp_hook.py, tests/test_step_conformance.py check it). Every registered per-step
method works, a plugin's too; a local-steps one (``Method.local_steps``: DiLoCo, SparseLoCo)
is refused with one line when the state is built. ``options`` carries a method's settings as
a run's ``method_options`` would, and the step sees the parameters' shapes, so PowerSGD runs per layer::

    state = SparseHookState(method="powersgd", warmup_iterations=2,
                            options={"powersgd_rank": 2, "powersgd_min_compression_rate": 1.0})

(on one bucket, bitwise equal to torch's ``powerSGD_hook`` with the same rank, seed and
``start_powerSGD_iter=2``: tests/test_ddp_hook.py).

Algorithm of one backward pass (``selection="model"``, the paper's whole-model top-k):

1. DDP calls the hook once per gradient bucket as buckets become ready. Buckets before the
   last are parked: the hook returns a not-yet-completed ``torch.futures.Future``.
2. At the last bucket (``bucket.is_last()``) the gradients of all parameters are
   concatenated in a fixed per-parameter order (order of first appearance, which does not
   change when DDP rebuilds its buckets after iteration 1) into one flat ``g`` of d floats.
3. The parameter set's step (one per set, kept across calls) begins its synchronisation:
   ``acc = g + residual`` (or the method's memory); ``values, indices = selector(acc, k)``
   with ``k = max(1, floor(density * d))``.
4. The collective (identical result on every rank); the step's finish updates the memory
   (rule "paper" or "mass") and returns the dense ``G / P`` (after the memory's aggregate).
5. ``G / P`` (DDP's averaging convention, which is also the project's update
   ``w -= lr * G / P``) is written back into every bucket buffer and all futures complete.

``selection="bucket"`` selects ``k_b = max(1, floor(density * d_b))`` per bucket and
communicates each bucket in its own hook call (layer-wise top-k: different selection
semantics, see docs/beyond_papers.md). During the first ``warmup_iterations`` backward
passes the hook is a dense allreduce (``dense_allreduce`` then ``/ P``), which also lets DDP
rebuild its buckets before sparse communication starts.

Cost per iteration: the collective's (see :mod:`gtopk_lab.comm`), plus O(d) copies for
flattening and writing back; residuals take d floats per rank. Works with gloo (CPU) and
NCCL (the collectives move to the tensor's GPU for NCCL).

Parameters are keyed by their position in order of first appearance. With
``selection="bucket"`` a bucket DDP rebuilt gets a new step that takes over its parameters'
residuals from the steps that held them (a method with its own memory is refused for this
scope). When the state is pickled the process group and the parameter keys are left out;
every step's state is kept (``RankStep.state_dict``) and taken up when its parameter set
comes again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from gtopk_lab.comm.schedules import SPARSE_ALGORITHMS
from gtopk_lab.comm.torch_dist import dense_allreduce
from gtopk_lab.compression.residual import RESIDUAL_RULES
from gtopk_lab.compression.selection import available_selectors
from gtopk_lab.config import k_for
from gtopk_lab.methods import available_methods, get_method
from gtopk_lab.training.step import RankStep
from gtopk_lab.training.step_settings import StepSettings

__all__ = ["SparseHookState", "gtopk_hook", "hook_methods", "SELECTION_SCOPES"]

SELECTION_SCOPES: tuple[str, ...] = ("model", "bucket")


def hook_methods() -> tuple[str, ...]:
    """Registered methods that synchronise every step (what a DDP hook can run)."""
    return tuple(m for m in available_methods() if not get_method(m).local_steps)


@dataclass
class SparseHookState:
    """State of :func:`gtopk_hook`: hyper-parameters (validated) and the training steps.

    Tuned by the user: ``density`` (0 < rho <= 1), ``method`` (a per-step registered method:
    :func:`hook_methods`; a local-steps one is refused with one line), ``algorithm`` (gTop-k
    pattern: butterfly | tree), ``residual_rule`` (paper | mass; None: the method's, e.g. Ok-Topk's
    reference rule, else mass), ``warmup_iterations`` (dense
    iterations first, >= 0), ``selection`` (model | bucket), ``selector`` (registry name; None:
    the method's), ``process_group`` (None: default), ``options`` (the method's options, as in a
    run's ``method_options``; checked by the method). Internal state: ``iteration`` (completed backward
    passes), one :class:`~gtopk_lab.training.step.RankStep` per parameter set (the whole model,
    or one per bucket) kept across calls, ``last_stats`` (CommStats of the last sparse
    collective).
    """

    # tuned by the user
    density: float = 0.01
    method: str = "gtopk"
    algorithm: str = "butterfly"
    residual_rule: str | None = None
    warmup_iterations: int = 1
    selection: str = "model"
    selector: str | None = None
    process_group: Any = None
    #: the method's options as a run's ``method_options`` holds them (e.g. ``powersgd_rank``)
    options: dict[str, Any] = field(default_factory=dict)
    # internal state
    iteration: int = 0
    last_stats: Any = None
    _slots: dict[int, int] = field(default_factory=dict, repr=False)
    _sizes: dict[int, int] = field(default_factory=dict, repr=False)
    #: the step of each parameter set, keyed by its slots in flat order
    _steps: dict[tuple[int, ...], RankStep] = field(default_factory=dict, repr=False)
    #: steps' state_dicts from a pickle, taken up when their parameter set comes again
    _saved_steps: dict[tuple[int, ...], dict[str, Any]] = field(default_factory=dict, repr=False)
    #: per parameter slot, the residual of a retired step (DDP rebuilt its bucket), until taken
    _loose: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    _parked: list[tuple[Any, torch.futures.Future]] = field(default_factory=list, repr=False)
    _settings: StepSettings | None = field(default=None, repr=False)
    #: a memory-free dense method: its update is the plain mean, DDP's own allreduce computes it
    _plain_mean: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.density, bool) or not isinstance(self.density, (int, float)):
            raise TypeError(f"density={self.density!r} has type {type(self.density).__name__}: expected float")
        if not 0.0 < float(self.density) <= 1.0:
            raise ValueError(f"density={self.density!r} is invalid: expected a number in (0, 1]")
        self.density = float(self.density)
        for name, allowed in (("method", available_methods()), ("algorithm", SPARSE_ALGORITHMS),
                              ("residual_rule", (None, *RESIDUAL_RULES)), ("selection", SELECTION_SCOPES),
                              ("selector", (None, *available_selectors()))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: expected one of "
                                 f"{', '.join(str(a) for a in allowed)}")
        w = self.warmup_iterations
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"warmup_iterations={w!r} is invalid: expected an integer >= 0")
        if not isinstance(self.options, dict):
            raise TypeError(f"options={self.options!r} has type {type(self.options).__name__}: expected dict")
        settings = self._step_settings(world=1)
        settings.check_driver("ddp_hook", scope=self.selection)
        self._plain_mean = settings.plain_mean

    def _step_settings(self, world: int) -> StepSettings:
        """The hook's :class:`StepSettings` at P = ``world`` (validates method, options, selector)."""
        return StepSettings(get_method(self.method), world=world, residual_rule=self.residual_rule,
                            selector=self.selector, algorithm=self.algorithm, options=self.options)

    # --- pickling: the process group, parameter keys and steps' objects stay behind ---------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["process_group"] = None
        state["_slots"] = {}
        state["_parked"] = []
        state["_settings"] = None
        state["_saved_steps"] = {**self._saved_steps, **{key: step.state_dict() for key, step in self._steps.items()}}
        state["_steps"] = {}
        return state

    # --- one step per parameter set -----------------------------------------------------------
    def _slot(self, param: torch.Tensor) -> int:
        """The parameter's position in order of first appearance (survives bucket rebuilds)."""
        key = id(param)
        if key not in self._slots:
            self._slots[key] = len(self._slots)
            self._sizes[self._slots[key]] = param.numel()
        return self._slots[key]

    def _step_for(self, key: tuple[int, ...], shapes: list[tuple[int, ...]], device: torch.device) -> RankStep:
        """The step of the parameter set ``key``: kept across calls; a new set (the first call,
        or a bucket DDP rebuilt) starts from a pickled state of it, else takes over the error
        feedback of its parameters from the sets they were in."""
        step = self._steps.get(key)
        if step is not None:
            return step
        if self._settings is None:
            self._settings = self._step_settings(world=_world(self))
        for old in [k for k in self._steps if set(k) & set(key)]:  # their parameters moved
            self._loose.update(_residual_pieces(self, old, self._steps.pop(old)))
        step = RankStep(self._settings, sum(self._sizes[s] for s in key), device,
                        rank=dist.get_rank(self.process_group), layout=shapes)
        saved = self._saved_steps.pop(key, None)
        if saved is not None:
            step.load_state_dict(saved)
        elif any(s in self._loose for s in key):
            _take_residuals(self, key, step)
        self._steps[key] = step
        return step


def _residual_pieces(state: SparseHookState, key: tuple[int, ...], step: RankStep) -> dict[int, torch.Tensor]:
    """The error-feedback residual of ``step`` (memory "residual", the only memory a rebuilt
    bucket may have; none: {}) per parameter slot, through its checkpoint state."""
    saved = step.state_dict()["memory"]
    if saved is None:
        return {}
    pieces, offset = {}, 0
    for slot in key:
        n = state._sizes[slot]
        pieces[slot] = saved["residual"][offset:offset + n]
        offset += n
    return pieces


def _take_residuals(state: SparseHookState, key: tuple[int, ...], step: RankStep) -> None:
    """Seed ``step``'s residual with its parameters' pieces from retired steps (new ones: 0)."""
    mine = step.state_dict()
    like = mine["memory"]["residual"]
    carried = [state._loose.pop(s) if s in state._loose else
               torch.zeros(state._sizes[s], dtype=like.dtype, device=like.device) for s in key]
    mine["memory"] = {**mine["memory"], "residual": torch.cat(carried)}
    step.load_state_dict(mine)


def _world(state: SparseHookState) -> int:
    return dist.get_world_size(state.process_group)


def _sparse_step(state: SparseHookState, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Steps 2-5 of the module docstring for the (parameter, gradient view) ``pairs``.

    The gradient views are overwritten with ``G / P``.
    """
    slots = [state._slot(p) for p, _g in pairs]
    order = sorted(range(len(pairs)), key=lambda j: slots[j])  # fixed order: survives rebuilds
    grads = [pairs[j][1] for j in order]
    flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads])
    # the parameters' shapes in flat order: a per-layer method (PowerSGD) compresses each one
    step = state._step_for(tuple(slots[j] for j in order), [tuple(g.shape) for g in grads], flat.device)
    k = k_for(flat.numel(), state.density)
    sync = step.begin(flat, k, state.iteration, group=state.process_group)
    assert sync is not None  # a per-step method synchronises every call
    result = step.collective.run(sync.contribution, sync.call)
    update = sync.finish(result)
    assert update is not None
    state.last_stats = result.stats
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(update[offset:offset + n].view_as(g))
        offset += n


def _done(tensor: torch.Tensor) -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def gtopk_hook(state: SparseHookState, bucket: dist.GradBucket) -> torch.futures.Future:
    """DDP communication hook: sparsified aggregation of ``bucket`` (see the module docstring).

    Returns a ``torch.futures.Future`` whose value is the bucket buffer holding the averaged
    aggregate ``G / P``. With ``selection="model"`` futures of buckets before the last one
    complete when the last bucket arrives (DDP waits for all of them at the end of backward).

    Example::

        model.register_comm_hook(SparseHookState(density=0.001), gtopk_hook)
    """
    if not isinstance(state, SparseHookState):
        raise TypeError(f"state has type {type(state).__name__}: expected SparseHookState")
    buffer = bucket.buffer()
    last = bucket.is_last()
    try:
        if state._plain_mean or state.iteration < state.warmup_iterations:
            dense_allreduce(buffer, group=state.process_group)
            buffer.div_(_world(state))
            return _done(buffer)
        pairs = list(zip(bucket.parameters(), bucket.gradients()))
        if state.selection == "bucket":
            _sparse_step(state, pairs)
            return _done(buffer)
        fut: torch.futures.Future = torch.futures.Future()
        state._parked.append(((pairs, buffer), fut))
        if last:
            parked, state._parked = state._parked, []
            try:
                _sparse_step(state, [pg for (ps, _b), _f in parked for pg in ps])
            except BaseException as exc:  # never leave DDP waiting on a parked bucket
                for _pb, f in parked[:-1]:
                    f.set_exception(exc)
                raise
            for (_ps, buf), f in parked:
                f.set_result(buf)
        return fut
    finally:
        if last:
            state.iteration += 1


# DDP checks the hook's annotations with inspect.signature (no string evaluation), and this
# module's ``from __future__ import annotations`` turns them into strings: give it the objects.
gtopk_hook.__annotations__ = {"state": SparseHookState, "bucket": dist.GradBucket,
                              "return": torch.futures.Future[torch.Tensor]}
