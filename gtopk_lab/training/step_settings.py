"""What a training step is built from: one frozen :class:`StepSettings` per run or per hook.

Every driver of the step (real ranks, the simulator, the DDP hook, wait-free overlap,
calibration) builds its :class:`~gtopk_lab.training.step.RankStep` s from one of these:
``StepSettings.from_config(config, world)`` for a run, or ``StepSettings(method, world=P,
...)`` from a hook's arguments. Building one validates everything a step will use, so a bad
option fails when the driver is configured, not at the first synchronisation:

1. the method (a registered name or a resolved :class:`~gtopk_lab.methods.base.Method`), its
   declared options read from ``options`` (:meth:`~gtopk_lab.methods.base.Method.run_options`)
2. the selector override (:func:`~gtopk_lab.methods.registry.selector_for`: a collective
   that needs exactly k refuses a selector that does not promise it), the pattern
   (``Collective.algorithm_for``), ``collective_options`` against the collective's state
3. the clip mode, the residual rule and P

:meth:`StepSettings.check_driver` refuses, with one line naming the method and the driver,
what a driver cannot run: a local-steps method (``Method.local_steps``) in the DDP hook or
overlap, which synchronise every backward pass; a method with its own memory in the DDP
hook's per-bucket scope, whose parameter sets change when DDP rebuilds its buckets.
Cost: O(1) plus the method's option checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gtopk_lab.compression.residual import RESIDUAL_RULES
from gtopk_lab.config import RunConfig
from gtopk_lab.config_checks import GRAD_CLIP_MODES
from gtopk_lab.methods import get_collective, get_method
from gtopk_lab.methods.base import Method
from gtopk_lab.methods.registry import selector_for

__all__ = ["StepSettings", "DRIVERS", "GRAD_CLIP_MODES"]

#: The drivers of the step, as :meth:`StepSettings.check_driver` names them in its refusals.
DRIVERS: dict[str, str] = {"ranks": "real ranks", "simulator": "the simulator", "ddp_hook": "the DDP hook",
                           "overlap": "wait-free overlap", "calibration": "calibration"}
#: Drivers that synchronise once per backward pass, so they cannot take local steps.
_PER_STEP_DRIVERS = ("ddp_hook", "overlap")


@dataclass(frozen=True)
class StepSettings:
    """The run-wide settings of a method's training step (validated; see the module docstring).

    ``method``: a registered name or a :class:`Method`. ``world``: P (memories with
    ``needs_world`` and the local clip scale with it). ``selector``: a registered selector name
    overriding the method's (``RunConfig.selector``). ``algorithm``: the run's pattern, used
    when the method fixes none. ``grad_clip`` / ``grad_clip_mode``: see
    :class:`~gtopk_lab.training.step.RankStep`. ``momentum_correction`` / ``momentum``: DGC's
    local velocity (sparse methods only). ``options``: the run's ``method_options`` (the method
    reads its declared options from it; the collective gets the whole mapping). ``collective_options``:
    keywords of the collective's ``make_state``. ``config``: the run's
    :class:`~gtopk_lab.config.RunConfig`, which a local-steps method's ``outer_optimizer``
    factory is given (None outside a run).
    """

    method: Method
    world: int = 1
    #: None: the method's own default (``Method.config_defaults["residual_rule"]``), else "mass"
    residual_rule: str | None = None
    selector: str | None = None
    algorithm: str | None = None
    grad_clip: float | None = None
    grad_clip_mode: str = "aggregated"
    momentum_correction: bool = False
    momentum: float = 0.0
    options: Mapping[str, Any] | None = field(default_factory=dict)
    collective_options: Mapping[str, Any] | None = None
    config: RunConfig | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        method = get_method(self.method) if isinstance(self.method, str) else self.method
        if not isinstance(method, Method):
            raise TypeError(f"method={self.method!r} has type {type(self.method).__name__}: expected a "
                            "registered method name or a Method")
        object.__setattr__(self, "method", method)
        world = self.world
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ValueError(f"world={world!r} is invalid: expected an integer >= 1")
        if self.grad_clip_mode not in GRAD_CLIP_MODES:
            raise ValueError(f"grad_clip_mode={self.grad_clip_mode!r} is invalid: expected aggregated or local")
        if self.residual_rule is None:
            object.__setattr__(self, "residual_rule", method.config_defaults.get("residual_rule", "mass"))
        if self.residual_rule not in RESIDUAL_RULES:
            raise ValueError(f"residual_rule={self.residual_rule!r} is invalid: expected one of "
                             f"{', '.join(RESIDUAL_RULES)}")
        if self.options is None:
            object.__setattr__(self, "options", {})
        if not isinstance(self.options, Mapping):
            raise TypeError(f"options={self.options!r} has type {type(self.options).__name__}: expected a mapping")
        object.__setattr__(self, "options", dict(self.options))
        method.run_options(self.options)  # its ValueError names the option, the value and the type
        selector_for(method, self.selector)
        method.pattern_for(self.algorithm)
        if self.collective_options and method.comm.make_state is None:
            raise ValueError(f"collective_options={dict(self.collective_options)!r} is invalid for method "
                             f"{method.name!r}: its collective keeps no state to configure")

    @classmethod
    def from_config(cls, config: RunConfig, world: int | None = None) -> "StepSettings":
        """The settings of run ``config`` with P = ``world`` (default ``config.workers``)."""
        if not isinstance(config, RunConfig):
            raise TypeError(f"config has type {type(config).__name__}: expected RunConfig")
        return cls(method=get_method(config.method), world=config.workers if world is None else world,
                   residual_rule=config.residual_rule, selector=config.selector, algorithm=config.algorithm,
                   grad_clip=config.grad_clip, grad_clip_mode=config.grad_clip_mode,
                   momentum_correction=config.momentum_correction, momentum=config.momentum,
                   options=config.method_options, collective_options=config.collective_options,
                   config=config)

    # --- what the settings say about the step ------------------------------------------------
    @property
    def local_steps(self) -> bool:
        """True when ranks take local optimiser steps between synchronisations (DiLoCo-shaped)."""
        return self.method.local_steps

    @property
    def sync_every(self) -> int:
        """H: iterations per synchronisation (the run's ``sync_every`` option of a local-steps
        method, else 1)."""
        return int(self.method.run_options(self.options)["sync_every"]) if self.local_steps else 1

    @property
    def own_memory(self) -> bool:
        """True when the method brings its own memory factory (EF21, CLT-k, PowerSGD, ...)."""
        return self.method.memory not in ("residual", None)

    @property
    def plain_mean(self) -> bool:
        """True when every rank's update is the plain mean of the raw gradients: a memory-free
        dense method on the registered dense allreduce, every step, no clip. Any allreduce
        then computes the update (the DDP hook leaves it to DDP's own, bucket by bucket)."""
        method = self.method
        return (not method.sparse and method.memory is None and not self.local_steps
                and self.grad_clip is None and method.comm is get_collective("allreduce"))

    def check_driver(self, driver: str, *, scope: str | None = None) -> None:
        """Refuse (one-line ``ValueError`` naming the method and the driver) a ``driver`` of
        :data:`DRIVERS` that cannot run this method; ``scope``: the driver's selection scope
        (the DDP hook's ``selection``, overlap's ``scope``)."""
        if driver not in DRIVERS:
            raise ValueError(f"driver={driver!r} is invalid: expected one of {', '.join(DRIVERS)}")
        name = self.method.name
        if driver in _PER_STEP_DRIVERS and self.local_steps:
            raise ValueError(f"method={name!r} is invalid for {DRIVERS[driver]}: it takes local steps "
                             f"(sync_every={self.sync_every}, an outer optimiser) and {DRIVERS[driver]} "
                             "synchronises every backward pass; expected a per-step method (real ranks "
                             "and the simulator run this one)")
        if driver == "ddp_hook" and scope == "bucket" and self.own_memory:
            raise ValueError(f"method={name!r} is invalid for the DDP hook with selection='bucket': its own "
                             "memory is kept for one fixed parameter set and DDP rebuilds its buckets; "
                             "expected selection='model'")
