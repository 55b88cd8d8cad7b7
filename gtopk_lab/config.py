"""One validated configuration for a training run.

``RunConfig`` is the single description of a run that travels from the notebook or
CLI, through Dask, to every rank and into ``<out>/<run_id>/config.json``. It is a
plain dataclass of JSON-friendly fields so it pickles, serialises and diffs easily.
Every field is validated at construction: a bad value raises ``ValueError`` (or
``TypeError`` for a wrong type) whose message names the field, the value and what
is allowed (the plain fields' checks: :mod:`gtopk_lab.config_checks`). The platform settings (simulator, compute charge, optimiser, model, output,
collective and method options) are typed groups of :mod:`gtopk_lab.config_options`; the
legacy ``extra={...}`` dict is still accepted and mapped onto them (unknown keys refused).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any

# the field checks; the lists they check against re-exported for importers of this module
from gtopk_lab.config_checks import (  # noqa: F401
    DATA_SPLITS, DEVICES, GRAD_CLIP_MODES, MAX_WORKERS, check_types, check_values, invalid,
)
from gtopk_lab.config_options import (
    OPTION_FIELDS, OPTION_TYPES, ComputeOptions, ModelOptions, OptimiserOptions, OutputOptions,
    SimulatorOptions, check_option_dicts, coerce_options, legacy_extra, with_legacy_extra,
)
from gtopk_lab.compression.selection import available_selectors
from gtopk_lab.config_presets import (
    method_field_values, preset_values, with_preset_options, without_preset_options,
)
from gtopk_lab.methods import available_methods, get_method
from gtopk_lab.methods.registry import selector_for
from gtopk_lab.network.model import DEFAULT_NETWORK
from gtopk_lab.recipe_defaults import check_recipe, recipe_values

#: Fields that say how a run is carried out when something fails, not what it computes:
#: ``config_hash`` leaves them out, so changing them never makes a sweep point look new.
POLICY_FIELDS: tuple[str, ...] = ("max_restarts", "scheduler_timeout_s")
#: Fields added after runs were stored, with the value that leaves a run as it was:
#: ``config_hash`` leaves such a field out while it has that value, so stored runs keep
#: their hash. ``grad_clip_mode`` is left out only while ``grad_clip`` is None (with a
#: clip set, the default changed what the run computes, and its hash changes with it).
LATER_FIELDS: dict[str, Any] = {"density_schedule": None, "grad_clip_mode": "aggregated"}
#: Fields that say how the other fields were chosen, not what is computed: not hashed
#: (a preset's run and the same fields typed out are one sweep point).
DERIVED_FIELDS: tuple[str, ...] = ("preset", "recipe")


def _remember_given(cls: type) -> type:
    """Wrap the dataclass ``__init__`` so each instance knows which fields its caller gave
    (``_given``): a preset fills only the others, and :meth:`RunConfig.replace` re-derives them."""
    init = cls.__init__
    names = [f.name for f in dataclasses.fields(cls) if f.init]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if "extra" in kwargs:  # the legacy dict: mapped onto the typed option fields
            kwargs = with_legacy_extra(kwargs)
        object.__setattr__(self, "_given", frozenset(names[:len(args)]) | frozenset(kwargs))
        object.__setattr__(self, "_derived", {})
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]
    return cls


@_remember_given
@dataclass
class RunConfig:
    """A training run: method, sizes, network and recipe.

    Example::

        cfg = RunConfig(method="gtopk", workers=4, density=0.001, bandwidth="1Gbps")
    """

    # --- what is compared -------------------------------------------------------
    #: A registered method (gtopk_lab.methods; ``gtopk-lab methods`` lists them).
    method: str = "gtopk"
    #: gTop-k pattern: "butterfly" (recursive doubling) or "tree" (paper's reduce+bcast).
    algorithm: str = "butterfly"
    #: Selector name from gtopk_lab.compression.selection's registry; None = the method's.
    selector: str | None = None
    #: Error-feedback rule: "mass" (mass-conserving) or "paper" (the reference codes'); a
    #: method may have its own default (``Method.config_defaults``: ``oktopk`` takes "paper").
    residual_rule: str = "mass"
    #: Fraction rho of model parameters each worker selects, 0 < rho <= 1; k = max(1, floor(rho*d)).
    density: float = 0.01
    #: Density warm-up: (0.004, 1) means density 0.004 for the first 1 epoch(s). None: off.
    density_warmup: tuple[float, int] | None = None
    #: Density per epoch before ``density``: (0.015625, 0.004) is GaussianK-SGD's
    #: [0.015625, 0.004, 0.001] with density 0.001 (epoch e < len uses entry e). None: off.
    #: density_warmup (rho0, E) is the schedule (rho0,) * E; the two are not set together.
    density_schedule: tuple[float, ...] | None = None
    workers: int = 4

    # --- model and data ------------------------------------------------------------
    model: str = "cnn"
    dataset: str = "mnist1d"
    data_dir: str | None = None
    train_samples: int = 4000
    test_samples: int = 1000
    #: "iid" or "dirichlet": each rank's class proportions drawn from a Dirichlet of
    #: concentration ``dirichlet_alpha`` (non-IID label skew; equal shard sizes).
    data_split: str = "iid"
    #: Dirichlet concentration per class (> 0): small = few classes per rank, large = IID.
    dirichlet_alpha: float = 0.5

    # --- optimiser recipe ------------------------------------------------------------
    epochs: int = 2
    #: Stop after this many iterations in total (for CI / quick looks). None: all epochs.
    max_iterations: int | None = None
    batch_size: int = 32  # per worker
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    #: Linear LR warm-up from lr/P to lr over this many epochs (0: off).
    lr_warmup_epochs: float = 0.0
    #: Epochs at which the LR is multiplied by lr_decay.
    lr_milestones: tuple[int, ...] = ()
    lr_decay: float = 0.1
    #: L2-norm clip threshold (None: off); where it acts is ``grad_clip_mode``.
    grad_clip: float | None = None
    #: "aggregated": clip the synchronised update G / P (the references'); "local": each
    #: rank's gradient before error feedback at grad_clip / sqrt(P) (DGC's).
    grad_clip_mode: str = "aggregated"
    momentum_correction: bool = False
    seed: int = 0
    #: A named configuration (config_presets.PRESETS): "paper" is the seed paper's gTop-k
    #: (tree, paper residual rule, density warm-up, the model's recipe) plus the method's own
    #: settings (``Method.preset_options``: Ok-Topk's dense warm-up in
    #: ``collective_options``); fields and options given win.
    preset: str | None = None
    #: The training recipe that fills the fields the caller did not give
    #: (gtopk_lab.recipe_defaults): "auto" = the recipe of ``model`` on ``dataset`` (the CNN
    #: on MNIST-1D: ``cnn-mnist1d``), a name of config_presets.RECIPES, or None (off).
    recipe: str | None = "auto"

    # --- network ---------------------------------------------------------------------
    #: Link bandwidth as users type it ("1Gbps", "10GbE", "none": no communication cost);
    #: default the paper's 1GbE (network.DEFAULT_NETWORK: 889 Mbit/s, 0.436 ms latency).
    bandwidth: str = DEFAULT_NETWORK
    #: Per-message latency ("0.5ms", "50us"); None: the preset's / calibrated value.
    latency: str | None = None
    #: Sleep so that every collective lasts at least its modelled time on `bandwidth`.
    throttle: bool = False
    #: Virtual time charges the CPU time of the merges (gTop-k, Ok-Topk) and of the
    #: allgather's assembly inside each sparse collective: alpha-beta-gamma, the rank's own
    #: work on the critical path. False: modelled communication only. The per-iteration
    #: ``comm_model_s`` column is alpha-beta either way. (The simulator's fixed-compute
    #: mode never charges merges, so its virtual time stays exactly reproducible.)
    virtual_merge_cpu: bool = True

    # --- execution -------------------------------------------------------------------
    device: str = "auto"
    #: Evaluate on the test split every this many epochs (and always at the end).
    eval_every_epochs: int = 1
    #: Metric rows are flushed to the sink every this many iterations.
    sink_every: int = 10
    checkpoint: bool = False
    #: Dask runs: restarts of a run whose worker leaves or dies during it (``dask worker``
    #: stopped with SIGTERM, retired, killed, OOM-killed), each from the newest complete
    #: checkpoint (with ``checkpoint``; else from iteration 0) on free workers. A rank's own
    #: exception never restarts the run. 0: such a run fails, naming the lost rank.
    max_restarts: int = 0
    #: Dask runs: seconds a rank keeps training on a worker that runs without a scheduler
    #: connection before it stops on its own (``gtopk_lab.worker.faults.SchedulerWatchdog``;
    #: a worker that shuts down, as Dask workers do when their scheduler dies, stops its
    #: rank at the next sink call).
    scheduler_timeout_s: float = 10.0
    run_id: str | None = None

    # --- platform options (gtopk_lab.config_options; each accepts a dict of its fields) ---
    simulator: SimulatorOptions = field(default_factory=SimulatorOptions)
    compute_charge: ComputeOptions = field(default_factory=ComputeOptions)
    optimiser: OptimiserOptions = field(default_factory=OptimiserOptions)
    model_options: ModelOptions = field(default_factory=ModelOptions)
    output: OutputOptions = field(default_factory=OutputOptions)
    #: Keywords of the collective's state (Ok-Topk's ``warmup``, ``tau``, ...); None: none.
    collective_options: dict[str, Any] | None = None
    #: The method's declared options (``Method.options``: ``sync_every``, ``ef_decay``, ...).
    method_options: dict[str, Any] = field(default_factory=dict)
    #: Free settings of a custom training function (``Lab(train_fn=...)``); never read here.
    custom: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.preset is not None:
            if not isinstance(self.preset, str):
                raise TypeError(f"preset={self.preset!r} has type {type(self.preset).__name__}: expected str")
            derived = preset_values(self.preset, self.model if isinstance(self.model, str) else "",
                                    getattr(self, "_given", frozenset()))
            for name, value in derived.items():
                setattr(self, name, value)
            object.__setattr__(self, "_derived", dict(derived))
        check_recipe(self.recipe)
        # the model's recipe: the training fields neither the caller nor the preset set
        name, supplied = recipe_values(self.recipe, self.model if isinstance(self.model, str) else "",
                                       self.dataset if isinstance(self.dataset, str) else "", self.density,
                                       set(getattr(self, "_given", ())) | set(getattr(self, "_derived", {})),
                                       self.max_iterations, self.epochs)
        for key, value in supplied.items():
            setattr(self, key, value)
        object.__setattr__(self, "_derived", {**getattr(self, "_derived", {}), **supplied})
        object.__setattr__(self, "_recipe", (name, tuple(sorted(supplied))))
        for name in OPTION_TYPES:  # a dict of a group's fields becomes the group (validated)
            setattr(self, name, coerce_options(name, getattr(self, name)))
        check_types(self)
        if self.method not in available_methods():
            raise invalid("method", self.method, f"one of {', '.join(available_methods())}")
        method = get_method(self.method)
        # the method's own defaults (EF21's plain step) and, under "paper", its paper's selector
        by_method = method_field_values(method, self.preset, getattr(self, "_given", frozenset()),
                                        {f.name for f in dataclasses.fields(self)})
        if by_method:
            for name, value in by_method.items():
                setattr(self, name, value)
            object.__setattr__(self, "_derived", {**getattr(self, "_derived", {}), **by_method})
            # a field the method set is the method's, not the recipe's
            recipe, supplied_fields = self.applied_recipe
            object.__setattr__(self, "_recipe", (recipe, tuple(f for f in supplied_fields if f not in by_method)))
            check_types(self)
        if method.preset_options is not None:
            # the method's own settings for this model and preset (Ok-Topk's bands for language
            # models, its warm-up under "paper"): collective options below the run's; replace()
            # takes them out again
            options = dict(method.preset_options(self.preset, self.model if isinstance(self.model, str) else ""))
            given = {} if self.collective_options is None else {"collective_options": self.collective_options}
            merged, applied = with_preset_options(given, options)
            self.collective_options = merged.get("collective_options")
            object.__setattr__(self, "_preset_options", applied)
        if self.selector is not None:
            if self.selector not in available_selectors():
                raise invalid("selector", self.selector, f"one of {', '.join(available_selectors())} or None")
            selector_for(method, self.selector)
        check_option_dicts(self, method)
        check_values(self)

    # ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict (tuples become lists)."""
        return dataclasses.asdict(self)

    @property
    def extra(self) -> dict[str, Any]:
        """The option fields as the legacy ``extra`` dict (read-only; ``custom`` aside): what
        ``RunConfig(extra=...)`` maps back onto this config's options."""
        return legacy_extra({name: getattr(self, name) for name in OPTION_FIELDS if name != "custom"})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError`` naming them. A stored
        config of before the typed options (an ``extra`` dict) loads through the legacy mapping;
        its keys that are no option were a custom training function's and go to ``custom``."""
        names = {f.name for f in dataclasses.fields(cls)} | {"extra"}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown config field(s): {', '.join(unknown)}")
        data = dict(data)
        if data.get("lr_milestones") is not None:
            data["lr_milestones"] = tuple(data["lr_milestones"])
        if data.get("density_warmup") is not None:
            data["density_warmup"] = tuple(data["density_warmup"])
        if isinstance(data.get("density_schedule"), list):
            data["density_schedule"] = tuple(data["density_schedule"])
        if "extra" in data:
            data = with_legacy_extra(data, stored=True)
        return cls(**data)

    def replace(self, **changes: Any) -> "RunConfig":
        """A copy with some fields changed (validated again).

        The copy is built from the fields this config's caller gave (and any it changed
        since), plus ``changes``; the others are derived again, so a preset's fields follow
        a changed ``model`` or ``preset`` (``replace(preset=None)`` drops them).
        """
        names = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(changes) - set(names) - {"extra"})
        if unknown:
            raise TypeError(f"unknown config field(s): {', '.join(unknown)}")
        if "extra" in changes:  # legacy: the whole extra replaced; the options it does not set reset
            changes = with_legacy_extra(changes, reset=True)
        given = getattr(self, "_given", None)
        derived = getattr(self, "_derived", {})
        defaults = {f.name: f.default for f in dataclasses.fields(self)
                    if f.default is not dataclasses.MISSING}
        keep = {name: getattr(self, name) for name in names
                if given is None or name in given or name not in defaults  # extra: a factory default
                or getattr(self, name) != derived.get(name, defaults[name])}  # set after construction
        if keep.get("collective_options") is not None:  # a method's preset options are derived too
            stripped = without_preset_options({"collective_options": keep["collective_options"]},
                                              getattr(self, "_preset_options", {}))
            keep["collective_options"] = stripped.get("collective_options")
        return type(self)(**{**keep, **changes})

    @property
    def applied_recipe(self) -> tuple[str | None, tuple[str, ...]]:
        """``(name, fields)``: the recipe this run uses (None: none) and the fields it supplied."""
        return getattr(self, "_recipe", (None, ()))

    @property
    def default_selector(self) -> str | None:
        """The selector this run uses: ``selector`` if set, else the method's default."""
        method = get_method(self.method)
        if not method.selects:
            return None
        if self.selector is not None:
            return self.selector
        return method.selector if isinstance(method.selector, str) else None


def hashed_fields(data: dict[str, Any]) -> dict[str, Any]:
    """What ``config_hash`` hashes of a config dict: all but ``run_id``, ``POLICY_FIELDS``,
    ``DERIVED_FIELDS`` and the ``LATER_FIELDS`` at their earlier value; the option fields as
    the legacy ``extra`` dict (so a run keeps the hash it had before they were typed). O(fields)."""
    out = dict(data)
    for name in ("run_id", "config_hash", *POLICY_FIELDS, *DERIVED_FIELDS):
        out.pop(name, None)
    for name, value in LATER_FIELDS.items():
        if name in out and out[name] == value and not (name == "grad_clip_mode" and out.get("grad_clip")):
            out.pop(name)
    if out.get("grad_clip") is None:
        out.pop("grad_clip_mode", None)  # no clip: where it would act changes nothing
    if any(name in out for name in OPTION_FIELDS):  # hashed as the legacy extra dict they replace
        options = {name: out.pop(name) for name in OPTION_FIELDS if name in out}
        out["extra"] = {**(out.get("extra") or {}), **legacy_extra(options)}
    return out


def k_for(numel: int, density: float) -> int:
    """k = max(1, floor(density * numel)), the number of entries each worker selects."""
    if numel < 1:
        raise ValueError(f"numel={numel!r} is invalid: expected an integer >= 1")
    if not (0.0 < density <= 1.0):
        raise ValueError(f"density={density!r} is invalid: expected a number in (0, 1]")
    return max(1, int(math.floor(density * numel)))
