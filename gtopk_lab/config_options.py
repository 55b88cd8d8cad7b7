"""Typed run options: the platform settings of a run, one frozen dataclass per concern.

What ``RunConfig.extra`` used to carry as an untyped dict (where a misspelt key was silently
ignored) lives in typed fields of :class:`~gtopk_lab.config.RunConfig`, each validated when
the config is built:

- ``simulator`` (:class:`SimulatorOptions`): ``rows``, ``compute``, ``batched`` (legacy
  ``sim_rows``, ``sim_compute``, ``sim_batched``);
- ``compute_charge`` (:class:`ComputeOptions`): ``compute_time_s``, ``selection_time_s``,
  ``merge_gamma_s_per_element`` (the same legacy names), ``calibration``
  (``compute_calibration``);
- ``optimiser`` (:class:`OptimiserOptions`): ``name``, ``betas``, ``eps`` (``optimizer``,
  ``betas``, ``eps``);
- ``model_options`` (:class:`ModelOptions`): ``kwargs``, ``tokenizer``,
  ``validation_fraction`` (``model_kwargs``, ``tokenizer``, ``validation_fraction``);
- ``output`` (:class:`OutputOptions`): ``return_weights``, ``warmup_iterations`` (the same);
- ``collective_options`` (dict): keywords of the collective's state, Ok-Topk's ``warmup``,
  ``tau``, ... (the same), built once when the config is, so an unknown keyword fails then;
- ``method_options`` (dict): options a registered method declares (``Method.options``:
  ``sync_every``, ``ef_decay``, ``powersgd_rank``, ...), typed by the run's method;
- ``custom`` (dict): free settings of a custom training function (never read here; any
  other legacy key is refused, not put there).

Every attribute defaults to None, "not set": the code that reads it applies its default
(``sim_compute`` "median", ``optimizer`` the method's or "sgd", ...). None is kept apart
from the default's value so that a config keeps the hash it had as an ``extra`` dict
(:func:`legacy_extra` rebuilds that dict; ``config_hash`` hashes it).

:func:`options_from_extra` maps a legacy ``extra`` dict onto the fields: each key goes to
its attribute; a key some registered method declares goes to ``method_options``; any other
key is refused with one line naming it and the closest valid name. Cost: O(keys) per
config (plus the method registry's declared names, O(methods)).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gtopk_lab.methods import available_methods, get_method

__all__ = ["SimulatorOptions", "ComputeOptions", "OptimiserOptions", "ModelOptions", "OutputOptions",
           "OPTION_TYPES", "OPTION_FIELDS", "LEGACY_KEYS", "TOKENIZERS", "OPTIMIZERS", "SIM_ROWS", "SIM_BATCHED", "COMPUTE_CHARGES",
           "coerce_options", "options_from_extra", "legacy_extra", "method_option_names", "closest",
           "with_legacy_extra", "check_option_dicts"]

#: Tokenizers of the text dataset (gtopk_lab.training.text_data).
TOKENIZERS: tuple[str, ...] = ("byte", "char")
#: Optimisers ``training.optim.make_optimizer`` builds.
OPTIMIZERS: tuple[str, ...] = ("sgd", "adamw")
#: Which virtual ranks' iter rows the simulator emits.
SIM_ROWS: tuple[str, ...] = ("all", "rank0")
#: Whether the simulator computes its virtual ranks' gradients in one batched call
#: (training.batched_ranks): auto = where the model and method allow it.
SIM_BATCHED: tuple[str, ...] = ("auto", "on", "off")
#: How the simulator charges its P measured compute times (training.compute_charge).
COMPUTE_CHARGES: tuple[str, ...] = ("median", "max", "straggler")


def closest(name: str, names: Any) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``names`` to ``name``, else ``""``."""
    match = difflib.get_close_matches(str(name), sorted(names), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _number(label: str, value: Any, *, low: float, low_open: bool = False, high: float | None = None,
            high_open: bool = False, integer: bool = False) -> None:
    """TypeError / ValueError naming ``label`` unless ``value`` is a finite number in range."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise TypeError(f"{label}={value!r} has type {type(value).__name__}: expected "
                        f"{'an integer' if integer else 'a number'} or None")
    above = value > low if low_open else value >= low
    below = high is None or (value < high if high_open else value <= high)
    if not (math.isfinite(value) and above and below):
        span = f"{'>' if low_open else '>='} {low:g}" + (
            "" if high is None else f" and {'<' if high_open else '<='} {high:g}")
        raise ValueError(f"{label}={value!r} is invalid: expected a finite {'integer' if integer else 'number'} "
                         f"{span}, or None")


def _choice(label: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{label}={value!r} is invalid: expected one of {', '.join(allowed)}, or None")


def _str_dict(label: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise TypeError(f"{label}={value!r} has type {type(value).__name__}: expected a dict with str keys")
    return dict(value)


class _Options:
    """What every option group shares: built from a mapping, seen as legacy ``extra`` keys."""

    #: the RunConfig field holding this group
    FIELD: ClassVar[str] = ""
    #: attribute -> the legacy ``extra`` key it was
    LEGACY: ClassVar[dict[str, str]] = {}

    def _label(self, name: str) -> str:
        return f"{self.FIELD}.{name}"

    @classmethod
    def coerce(cls, value: Any) -> Any:
        """``value`` as this group: an instance, or a mapping of its attributes (unknown
        attributes refused naming the closest); TypeError naming the field otherwise."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"{cls.FIELD}={value!r} has type {type(value).__name__}: expected "
                            f"{cls.__name__} or a dict of its fields")
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        unknown = sorted(str(k) for k in value if k not in names)
        if unknown:
            raise ValueError(f"{cls.FIELD} has unknown key(s) {', '.join(map(repr, unknown))}"
                             f"{closest(unknown[0], names)}: expected some of {', '.join(names)}")
        return cls(**value)

    def legacy(self) -> dict[str, Any]:
        """The attributes that are set, under their legacy ``extra`` keys."""
        return {self.LEGACY[f.name]: getattr(self, f.name) for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class SimulatorOptions(_Options):
    """The simulator's settings: ``rows`` ("all": iter rows of every virtual rank, "rank0";
    None: all up to 32 ranks, else rank 0's), ``compute`` (how P measured compute times are charged: median, max or
    straggler; None: median) and ``batched`` (the P gradients in one vmapped call: on, off, or
    auto = on where the model and method allow it; None: auto)."""

    FIELD: ClassVar[str] = "simulator"
    LEGACY: ClassVar[dict[str, str]] = {"rows": "sim_rows", "compute": "sim_compute", "batched": "sim_batched"}
    rows: str | None = None
    compute: str | None = None
    batched: str | None = None

    def __post_init__(self) -> None:
        if self.rows is not None:
            _choice(self._label("rows"), self.rows, SIM_ROWS)
        if self.compute is not None:
            _choice(self._label("compute"), self.compute, COMPUTE_CHARGES)
        if self.batched is not None:
            _choice(self._label("batched"), self.batched, SIM_BATCHED)


@dataclass(frozen=True)
class ComputeOptions(_Options):
    """A fixed compute charge instead of measuring: ``compute_time_s`` (> 0) and
    ``selection_time_s`` (>= 0, needs ``compute_time_s``) per iteration, merges at
    ``merge_gamma_s_per_element`` (>= 0), ``calibration`` (a dict saying where and when they
    were measured; a study writes it). None: measured."""

    FIELD: ClassVar[str] = "compute_charge"
    LEGACY: ClassVar[dict[str, str]] = {"compute_time_s": "compute_time_s", "selection_time_s": "selection_time_s",
                                        "merge_gamma_s_per_element": "merge_gamma_s_per_element",
                                        "calibration": "compute_calibration"}
    compute_time_s: float | None = None
    selection_time_s: float | None = None
    merge_gamma_s_per_element: float | None = None
    calibration: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.compute_time_s is not None:
            _number(self._label("compute_time_s"), self.compute_time_s, low=0, low_open=True)
        for name in ("selection_time_s", "merge_gamma_s_per_element"):
            if getattr(self, name) is not None:
                _number(self._label(name), getattr(self, name), low=0)
        if self.selection_time_s is not None and self.compute_time_s is None:
            raise ValueError(f"{self._label('selection_time_s')}={self.selection_time_s!r} is invalid without "
                             "compute_time_s: expected both fixed, or compute_time_s alone (selection then measured)")
        if self.calibration is not None:
            object.__setattr__(self, "calibration", _str_dict(self._label("calibration"), self.calibration))


@dataclass(frozen=True)
class OptimiserOptions(_Options):
    """The optimiser: ``name`` (sgd or adamw; None: the method's ``options["optimizer"]``,
    else sgd), AdamW's ``betas`` (two numbers in [0, 1); None: (0.9, 0.95)) and ``eps`` (> 0;
    None: 1e-8)."""

    FIELD: ClassVar[str] = "optimiser"
    LEGACY: ClassVar[dict[str, str]] = {"name": "optimizer", "betas": "betas", "eps": "eps"}
    name: str | None = None
    betas: tuple[float, float] | None = None
    eps: float | None = None

    def __post_init__(self) -> None:
        if self.name is not None:
            _choice(self._label("name"), self.name, OPTIMIZERS)
        if self.betas is not None:
            b = self.betas
            ok = (isinstance(b, (list, tuple)) and len(b) == 2
                  and all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < 1 for x in b))
            if not ok:
                raise ValueError(f"{self._label('betas')}={b!r} is invalid: expected two numbers in [0, 1), "
                                 "e.g. [0.9, 0.95], or None")
            object.__setattr__(self, "betas", tuple(b))
        if self.eps is not None:
            _number(self._label("eps"), self.eps, low=0, low_open=True)


@dataclass(frozen=True)
class ModelOptions(_Options):
    """What the model and its data are built with: ``kwargs`` (keywords of the model factory,
    e.g. the GPT's ``n_layer``), ``tokenizer`` (byte or char, text data; None: byte) and
    ``validation_fraction`` (in (0, 1): evaluate on that part of the training set, as LR
    tuning does; None: the test split)."""

    FIELD: ClassVar[str] = "model_options"
    LEGACY: ClassVar[dict[str, str]] = {"kwargs": "model_kwargs", "tokenizer": "tokenizer",
                                        "validation_fraction": "validation_fraction"}
    kwargs: dict[str, Any] | None = None
    tokenizer: str | None = None
    validation_fraction: float | None = None

    def __post_init__(self) -> None:
        if self.kwargs is not None:
            object.__setattr__(self, "kwargs", _str_dict(self._label("kwargs"), self.kwargs))
        if self.tokenizer is not None:
            _choice(self._label("tokenizer"), self.tokenizer, TOKENIZERS)
        if self.validation_fraction is not None:
            _number(self._label("validation_fraction"), self.validation_fraction, low=0, low_open=True,
                    high=1, high_open=True)


@dataclass(frozen=True)
class OutputOptions(_Options):
    """What a run hands back: ``return_weights`` (a flat CPU copy of the final parameters in
    the rank's result) and ``warmup_iterations`` (leading rows left out of the steady
    throughput; None: min(10, max(1, n // 10)))."""

    FIELD: ClassVar[str] = "output"
    LEGACY: ClassVar[dict[str, str]] = {"return_weights": "return_weights", "warmup_iterations": "warmup_iterations"}
    return_weights: bool | None = None
    warmup_iterations: int | None = None

    def __post_init__(self) -> None:
        if self.return_weights is not None and not isinstance(self.return_weights, bool):
            raise TypeError(f"{self._label('return_weights')}={self.return_weights!r} has type "
                            f"{type(self.return_weights).__name__}: expected bool or None")
        if self.warmup_iterations is not None:
            _number(self._label("warmup_iterations"), self.warmup_iterations, low=0, integer=True)


#: RunConfig field -> its option group.
OPTION_TYPES: dict[str, type[_Options]] = {
    cls.FIELD: cls for cls in (SimulatorOptions, ComputeOptions, OptimiserOptions, ModelOptions, OutputOptions)}
#: Every RunConfig field that replaces ``extra`` (groups, then the three dicts).
OPTION_FIELDS: tuple[str, ...] = (*OPTION_TYPES, "collective_options", "method_options", "custom")
#: legacy ``extra`` key -> (RunConfig field, attribute); ``collective_options`` is a field itself.
LEGACY_KEYS: dict[str, tuple[str, str | None]] = {
    **{key: (cls.FIELD, attr) for cls in OPTION_TYPES.values() for attr, key in cls.LEGACY.items()},
    "collective_options": ("collective_options", None)}


def coerce_options(field_name: str, value: Any) -> Any:
    """``value`` as the RunConfig option field ``field_name`` (a group from a dict)."""
    return OPTION_TYPES[field_name].coerce(value)


def method_option_names() -> frozenset[str]:
    """Every option a registered method declares (``Method.options``; ``sync_every`` of
    local-steps methods), platform keys aside. O(methods)."""
    names: set[str] = set()
    for name in available_methods():
        method = get_method(name)
        names.update(str(k) for k in method.options)
        if method.local_steps:
            names.add("sync_every")
    return frozenset(names - set(LEGACY_KEYS))


def options_from_extra(extra: Any) -> dict[str, Any]:
    """The RunConfig option fields a legacy ``extra`` dict sets (see the module docstring):
    ``{"simulator": {"rows": 2}, "method_options": {...}, ...}``. A key that is neither a
    platform key nor a registered method's option raises ``ValueError`` naming it and the
    closest valid name. O(keys)."""
    if not isinstance(extra, Mapping):
        raise TypeError(f"extra={extra!r} has type {type(extra).__name__}: expected a dict (legacy options)")
    method_names = method_option_names()
    unknown = sorted(str(k) for k in extra if k not in LEGACY_KEYS and k not in method_names)
    if unknown:
        valid = set(LEGACY_KEYS) | method_names
        raise ValueError(f"extra has unknown key(s) {', '.join(map(repr, unknown))}{closest(unknown[0], valid)}: "
                         "expected a platform option or a registered method's option (settings of a "
                         "custom training function go in custom=)")
    out: dict[str, Any] = {}
    for key, value in extra.items():
        if key in method_names:
            out.setdefault("method_options", {})[key] = value
            continue
        field_name, attr = LEGACY_KEYS[key]
        if attr is None:
            out[field_name] = value
        else:
            out.setdefault(field_name, {})[attr] = value
    return out


def legacy_extra(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The legacy ``extra`` dict of the option fields in ``fields`` (instances or their
    ``to_dict`` form): every set attribute under its old key, ``collective_options`` when
    not None, the method's and custom options flat. Inverse of :func:`options_from_extra`
    (with custom keys, which it refuses, added). O(keys)."""
    out: dict[str, Any] = {}
    for field_name, cls in OPTION_TYPES.items():
        value = fields.get(field_name)
        if value is None:
            continue
        group = value if isinstance(value, cls) else cls.coerce(value)
        out.update(group.legacy())
    if fields.get("collective_options") is not None:
        out["collective_options"] = fields["collective_options"]
    out.update(fields.get("method_options") or {})
    out.update(fields.get("custom") or {})
    return out


def with_legacy_extra(kwargs: dict[str, Any], reset: bool = False, stored: bool = False) -> dict[str, Any]:
    """``kwargs`` with its legacy ``extra`` dict mapped onto the option fields
    (:func:`options_from_extra`); a field set both ways is refused. ``reset``: every option
    field (``custom`` aside) that ``extra`` does not set gets its default, as a replaced
    ``extra`` dropped the keys it lacked (``RunConfig.replace(extra=...)``). ``stored``: a
    stored config (``RunConfig.from_dict``), whose keys that are no option were a custom
    training function's: they go to ``custom`` instead of being refused."""
    kwargs = dict(kwargs)
    extra = kwargs.pop("extra")
    if stored and isinstance(extra, Mapping):
        known = set(LEGACY_KEYS) | method_option_names()
        own = {k: v for k, v in extra.items() if k not in known}
        if own:
            kwargs["custom"] = {**own, **(kwargs.get("custom") or {})}
            extra = {k: v for k, v in extra.items() if k in known}
    mapped = options_from_extra(extra)
    clash = sorted(set(mapped) & set(kwargs))
    if clash:
        raise TypeError(f"extra sets {', '.join(clash)}, given as a field too: expected one of the two")
    if reset:
        defaults: dict[str, Any] = {name: cls() for name, cls in OPTION_TYPES.items()}
        defaults.update(collective_options=None, method_options={})
        mapped = {**{k: v for k, v in defaults.items() if k not in kwargs}, **mapped}
    return {**kwargs, **mapped}


def check_option_dicts(config: Any, method: Any) -> None:
    """The three option dicts against the run's method: ``method_options`` holds only names
    some method declares, of the right types for this one (``Method.run_options``, its
    ``check_options``); ``collective_options`` builds the collective's state; ``custom``
    does not shadow a typed option. ``ValueError`` naming the field and key otherwise."""
    declared = method_option_names()
    unknown = sorted(set(config.method_options) - declared)
    if unknown:
        raise ValueError(f"method_options has unknown key(s) {', '.join(map(repr, unknown))}"
                         f"{closest(unknown[0], declared)}: expected options a registered method declares")
    method.run_options(config.method_options)  # right types, H >= 1 (ValueError naming the option)
    if method.check_options is not None:  # the method's own keys (ValueError naming one)
        method.check_options(config.method_options)
    if config.collective_options:
        make_state = method.comm.make_state
        if make_state is None:
            raise ValueError(f"collective_options={config.collective_options!r} is invalid for method "
                             f"{method.name!r}: its collective keeps no state to configure")
        try:  # the state's own checks: an unknown keyword or a bad value, now rather than at a rank
            make_state(**config.collective_options)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"collective_options={config.collective_options!r} is invalid for method "
                             f"{method.name!r}: {exc}") from None
    shadow = sorted(set(config.custom) & (set(LEGACY_KEYS) | declared))
    if shadow:
        raise ValueError(f"custom has key(s) {', '.join(map(repr, shadow))} of typed options: expected them in "
                         "their own fields (extra= maps them)")
