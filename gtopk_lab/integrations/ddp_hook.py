"""gTop-k (and Top-k, Ok-Topk) sparsification as a PyTorch DDP communication hook.

Drop-in for ``torch.nn.parallel.DistributedDataParallel``::

    model = DistributedDataParallel(net)
    state = SparseHookState(density=0.01, method="gtopk", algorithm="butterfly",
                            residual_rule="mass", warmup_iterations=1)
    model.register_comm_hook(state, gtopk_hook)

The hook runs the project's one training step underneath
(:class:`~gtopk_lab.training.step.RankStep`: the method's memory, selector and collective
from the registry, :mod:`gtopk_lab.methods`), so a DDP model trained with it follows the same
trajectory as ``gtopk_lab.training.loop.train_rank`` with the same method
(tests/test_ddp_hook.py checks it). Every registered per-step method (``sync_every == 1``)
works, a plugin's too; ``options`` carries a method's settings as a run's ``extra`` would, and
the step sees the parameters' shapes, so PowerSGD runs per layer::

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
3. ``acc = g + residual``; ``values, indices = selector(acc, k)`` with ``k = max(1, floor(density * d))``.
4. The collective (identical result on every rank); ``ErrorFeedback.update`` keeps the
   residual (rule "paper" or "mass").
5. The dense ``G / P`` (DDP's averaging convention, which is also the project's update
   ``w -= lr * G / P``) is written back into every bucket buffer and all futures complete.

``selection="bucket"`` selects ``k_b = max(1, floor(density * d_b))`` per bucket and
communicates each bucket in its own hook call (layer-wise top-k: different selection
semantics, see docs/beyond_papers.md). During the first ``warmup_iterations`` backward
passes the hook is a dense allreduce (``dense_allreduce`` then ``/ P``), which also lets DDP
rebuild its buckets before sparse communication starts.

Cost per iteration: the collective's (see :mod:`gtopk_lab.comm`), plus O(d) copies for
flattening and writing back; residuals take d floats per rank. Works with gloo (CPU) and
NCCL (the collectives move to the tensor's GPU for NCCL).

Residuals are kept per parameter (keyed by the parameter's position in order of first
appearance), so they survive bucket rebuilds. When the state is pickled the process group
and the parameter keys are left out (residuals are kept, in slot order).
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
from gtopk_lab.methods import available_methods, get_collective, get_method
from gtopk_lab.training.step import RankStep, communicate

__all__ = ["SparseHookState", "gtopk_hook", "hook_methods", "SELECTION_SCOPES"]

SELECTION_SCOPES: tuple[str, ...] = ("model", "bucket")


def hook_methods() -> tuple[str, ...]:
    """Registered methods that synchronise every step (what a DDP hook can run)."""
    return tuple(m for m in available_methods() if not get_method(m).local_steps)


@dataclass
class SparseHookState:
    """State of :func:`gtopk_hook`: hyper-parameters (validated) and residuals.

    Tuned by the user: ``density`` (0 < rho <= 1), ``method`` (a per-step registered method:
    :func:`hook_methods`), ``algorithm`` (gTop-k pattern: butterfly | tree), ``residual_rule`` (paper |
    mass), ``warmup_iterations`` (dense iterations first, >= 0), ``selection`` (model |
    bucket), ``selector`` (registry name; None: the method's), ``process_group`` (None: default),
    ``options`` (the method's options, as in a run's ``extra``; checked by the method).
    Internal state: ``iteration`` (completed backward passes), per-parameter residuals,
    ``last_stats`` (CommStats of the last sparse collective).
    """

    # tuned by the user
    density: float = 0.01
    method: str = "gtopk"
    algorithm: str = "butterfly"
    residual_rule: str = "mass"
    warmup_iterations: int = 1
    selection: str = "model"
    selector: str | None = None
    process_group: Any = None
    #: the method's options as a run's ``extra`` holds them (e.g. ``powersgd_rank``)
    options: dict[str, Any] = field(default_factory=dict)
    # internal state
    iteration: int = 0
    last_stats: Any = None
    _slots: dict[int, int] = field(default_factory=dict, repr=False)
    _residuals: list[torch.Tensor] = field(default_factory=list, repr=False)
    _parked: list[tuple[Any, torch.futures.Future]] = field(default_factory=list, repr=False)
    _collective_state: Any = field(default=None, repr=False)
    #: a method's own memory (EF21's estimates, CLT-k's filtered memory), kept across calls
    _memories: dict[tuple[int, ...], Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.density, bool) or not isinstance(self.density, (int, float)):
            raise TypeError(f"density={self.density!r} has type {type(self.density).__name__}: expected float")
        if not 0.0 < float(self.density) <= 1.0:
            raise ValueError(f"density={self.density!r} is invalid: expected a number in (0, 1]")
        self.density = float(self.density)
        for name, allowed in (("method", hook_methods()), ("algorithm", SPARSE_ALGORITHMS),
                              ("residual_rule", RESIDUAL_RULES), ("selection", SELECTION_SCOPES),
                              ("selector", (None, *available_selectors()))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: expected one of {', '.join(allowed)}")
        w = self.warmup_iterations
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"warmup_iterations={w!r} is invalid: expected an integer >= 0")
        method = get_method(self.method)
        if not isinstance(self.options, dict):
            raise TypeError(f"options={self.options!r} has type {type(self.options).__name__}: expected dict")
        method.run_options(self.options)  # its ValueError names the option, the value and the type
        if self.selection == "bucket" and method.memory not in ("residual", None):
            raise ValueError(f"selection='bucket' is invalid with method {self.method!r}: its own memory is "
                             "kept for one fixed parameter set; expected selection='model'")
        make_state = method.comm.make_state
        self._collective_state = make_state() if make_state is not None else None

    # --- pickling: the process group and parameter keys stay behind -------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["process_group"] = None
        state["_slots"] = {}
        state["_parked"] = []
        return state

    # --- residual store ---------------------------------------------------------------------
    def _slot(self, param: torch.Tensor, like: torch.Tensor) -> int:
        key = id(param)
        if key not in self._slots:
            self._slots[key] = len(self._slots)
            self._residuals.append(torch.zeros(like.numel(), dtype=torch.float32, device=like.device))
        return self._slots[key]


def _world(state: SparseHookState) -> int:
    return dist.get_world_size(state.process_group)


def _sparse_step(state: SparseHookState, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Steps 2-5 of the module docstring for the (parameter, gradient view) ``pairs``.

    The gradient views are overwritten with ``G / P``.
    """
    slots = [state._slot(p, g) for p, g in pairs]
    order = sorted(range(len(pairs)), key=lambda j: slots[j])  # fixed order: survives rebuilds
    grads = [pairs[j][1] for j in order]
    slot_ids = [slots[j] for j in order]
    flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads])
    numel = flat.numel()
    method = get_method(state.method)
    # the parameters' shapes in flat order: a per-layer method (PowerSGD) compresses each one
    step = RankStep(method, numel, flat.device, residual_rule=state.residual_rule, selector=state.selector,
                    algorithm=state.algorithm, layout=[tuple(g.shape) for g in grads],
                    rank=dist.get_rank(state.process_group), world=_world(state), options=state.options)
    step.collective_state = state._collective_state
    residual = method.memory == "residual"
    if residual:  # the hook keeps residuals per parameter, across bucket rebuilds
        step.memory.residual = torch.cat([state._residuals[s] for s in slot_ids])
    elif step.memory is not None:  # a method's own memory lives on, for this parameter set
        step.memory = state._memories.setdefault(tuple(slot_ids), step.memory)
    k = k_for(numel, state.density)
    contribution = step.prepare(flat, k)
    result = communicate(method, contribution, step.call(k, state.iteration, group=state.process_group))
    step.finish(contribution, result)
    state.last_stats = result.stats
    dense = step.aggregate(result, flat.device).to(torch.float32)
    dense.div_(_world(state))
    ef = step.memory if residual else None
    offset = 0
    for g, s in zip(grads, slot_ids):
        n = g.numel()
        g.copy_(dense[offset:offset + n].view_as(g))
        if ef is not None:
            state._residuals[s] = ef.residual[offset:offset + n].clone()
        offset += n


def _plain_dense(method: Any) -> bool:
    """A memory-free method on the dense allreduce: DDP's own per-bucket allreduce is that method
    (other dense-input methods, e.g. CLT-k, go through the training step)."""
    return not method.sparse and method.memory is None and method.comm is get_collective("allreduce")


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
        if _plain_dense(get_method(state.method)) or state.iteration < state.warmup_iterations:
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
