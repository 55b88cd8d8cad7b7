"""What a method is: a :class:`Collective` (how contributions are aggregated,
:mod:`gtopk_lab.methods.collective`, re-exported here) and a :class:`Method` (selector +
memory + collective + cadence), in GRACE's spirit (compressor / memory / communicator).

A collective is called once per synchronisation with a :class:`CommCall` describing the
call (sizes, pattern, per-rank state, parameter layout) and one rank's contribution (a
:class:`Contribution`: the compensated buffer ``acc`` and, for sparse collectives, the
selection ``values, indices``). It runs in two drivers with the same per-rank algorithm:
``run`` on real ranks over torch.distributed, ``simulate`` for P virtual ranks in one
process (one contribution and one result per rank). Both return
:class:`~gtopk_lab.comm.stats.CollectiveResult` s whose ``values/indices`` (indices None
for a dense result) hold the **sum** over ranks; the training step divides by P.

Every field has a default except the name and the collective, so a user's method is one
line; :func:`gtopk_lab.methods.registry.register_method` checks that the parts fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gtopk_lab.methods.collective import INPUTS, Collective, CommCall, Contribution

__all__ = ["Selector", "Contribution", "CommCall", "Collective", "Method", "INPUTS", "MEMORIES", "OPTION_TYPES",
           "KINDS"]

#: ``selector(x, k) -> (values, indices)``: the local selection S_i of k entries of x.
Selector = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]
#: Named residual memories; a method may also pass None (no memory) or a factory.
MEMORIES: tuple[str, ...] = ("residual",)
#: What a method is for the tables and figures: ``"sparse"`` (the run's density sets what it sends,
#: k = rho d) or ``"dense"`` (density does not apply: the whole buffer, or a compression of its own).
KINDS: tuple[str, ...] = ("sparse", "dense")
#: Types a method's option default may have (``Method.options``); a run's value must match it.
OPTION_TYPES: tuple[type, ...] = (bool, int, float, str)


def _is_hex_color(text: str) -> bool:
    return len(text) == 7 and text[0] == "#" and all(c in "0123456789abcdefABCDEF" for c in text[1:])


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is invalid: expected an integer >= 1")
    return value


@dataclass(frozen=True)
class Method:
    """Everything the platform needs to know about one method (see the module docstring).

    Minimal form: ``Method(name="my-method", selector="topk", collective="gtopk")``.

    - ``selector``: a registered selector name, a callable ``(x, k) -> (values, indices)``
      (set ``fn.exact_k = True`` when it always returns exactly k distinct indices), or None
      for collectives that take the whole buffer (``input="dense"``).
    - ``collective``: a registered collective name or alias (``"allreduce"``, ``"allgather"``,
      ``"gtopk"``, ``"oktopk"``; see ``gtopk-lab methods``) or a :class:`Collective`.
    - ``memory``: ``"residual"`` (error feedback with the run's ``residual_rule``), None (no
      memory: what is not sent is lost, or the collective keeps its own state, EF21-shaped),
      or a factory ``(numel, rule, device) -> memory`` with ``compensate(g) -> acc``,
      ``update(acc, values, indices, result)``, ``state_dict()``, ``load_state_dict(d)``
      (a factory with ``needs_world = True`` is also given ``world=P``: memories whose
      update needs the applied mean ``G / P``, e.g. PowerSGD's error feedback).
    - ``algorithm``: a fixed pattern of the collective (None: the run's ``algorithm`` when
      the collective has patterns).
    - ``sync_every`` (H) and ``outer_optimizer``: infrequent synchronisation (DiLoCo-shaped).
      With H > 1 every rank takes H local optimiser steps on its own gradients; then the
      pseudo-gradient ``anchor - w`` goes through memory, selector and collective, the
      weights return to the anchor and ``outer_optimizer(params, config)`` (default: SGD with
      lr 1, i.e. the averaged update) steps on the aggregate / P.
    - ``requires_lossless``: refuse a collective that drops entries (EF21-shaped methods).
    - ``time_s`` / ``bytes_per_rank``: override the collective's formulas (same signatures).
    - ``check_options``: ``(options) -> Any``, raises ``ValueError`` naming the key for a bad
      method option in ``RunConfig.method_options`` (called when the config is built; the collective
      reads the options from ``CommCall.options``).
    - ``preset_options``: ``(preset, model) -> options``, the collective options (keywords of
      the collective's ``make_state``) this method takes on ``model`` under ``preset`` (None
      when the run names no preset), e.g. Ok-Topk's reference warm-up ``{"warmup": 512}``
      under ``"paper"`` and the LSTM script's ``{"bands": "lstm"}`` for language models;
      ``{}`` for none. ``RunConfig`` merges them under the run's
      ``collective_options`` (the run's entries win) and the summary records the
      state's settings; None: the method takes none.
    - ``paper_selector``: the registered selector of the method's paper when ``selector`` is
      the project's own (``gaussiank``: ``"gaussiank-paper"``); the ``paper`` preset uses it
      unless the run gives a selector. None: ``selector`` is the paper's.
    - ``config_defaults``: ``RunConfig`` fields the method sets when the run gives none, over
      a preset's recipe (EF21's plain step: ``{"momentum": 0.0}``; Ok-Topk's reference
      residual rule: ``{"residual_rule": "paper"}``, which the DDP hook and overlap take too).
    - ``departures``: where the method as registered departs from its paper, as short
      phrases (``summary()`` appends them to the description; docs/beyond_papers.md
      lists them all).
    - ``options``: the method's hyper-parameters and their defaults, e.g.
      ``{"ef_decay": 0.95}``; a run overrides one with the ``config.method_options`` entry of
      the same name (:meth:`run_options`; the value must have the default's type). Declared
      names are what ``method_options`` accepts (any other key is refused). They reach the
      memory factory (keyword ``options``), the collective (``CommCall.options``) and the
      outer optimiser (``run_options(config.method_options)``). An option may also default a
      platform option (``"optimizer": "adamw"``: the default of ``config.optimiser.name``).
      Local-steps methods always have ``sync_every`` (default: the field ``sync_every``), so
      a run may set H with ``method_options={"sync_every": H}``.

    Display facts (every table, figure and listing reads them from the registered entry;
    :func:`~gtopk_lab.methods.registry.register_method` fills in the ones left unset):

    - ``family``: the family a variant belongs to (``"oktopk"`` for ``oktopk-balanced``);
      default the method's name.
    - ``color``: ``#rrggbb`` of the method in every figure; default a shade of its family's
      colour for a variant, else the next colour of a fixed cycle.
    - ``order``: position in tables and legends (smaller first; ties in registration
      order); default after every method registered before it.
    - ``kind``: ``"sparse"`` (the run's density sets what it sends) or ``"dense"`` (density
      does not apply); default ``"sparse"`` when the method selects (:attr:`selects`).
    """

    name: str
    collective: str | Collective
    selector: str | Selector | None = "topk"
    memory: str | Callable[..., Any] | None = "residual"
    algorithm: str | None = None
    sync_every: int = 1
    outer_optimizer: Callable[..., torch.optim.Optimizer] | None = None
    requires_lossless: bool = False
    time_s: Callable[..., float] | None = None
    bytes_per_rank: Callable[..., float] | None = None
    check_options: Callable[[Mapping[str, Any]], Any] | None = None
    preset_options: Callable[[str, str], Mapping[str, Any]] | None = None
    description: str = ""
    options: Mapping[str, Any] = field(default_factory=dict, compare=False)
    paper_selector: str | None = None
    config_defaults: Mapping[str, Any] = field(default_factory=dict, compare=False)
    departures: tuple[str, ...] = ()
    family: str = field(default="", compare=False)
    color: str = field(default="", compare=False)
    order: int | None = field(default=None, compare=False)
    kind: str = field(default="", compare=False)
    #: filled in by register_method: the resolved collective and selector
    resolved: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or self.name != self.name.strip():
            raise ValueError(f"name={self.name!r} is invalid: expected a non-empty string without spaces at the ends")
        if not isinstance(self.collective, (str, Collective)):
            raise TypeError(f"collective={self.collective!r} has type {type(self.collective).__name__}: "
                            "expected a registered collective name or a Collective")
        if self.selector is not None and not isinstance(self.selector, str) and not callable(self.selector):
            raise TypeError(f"selector={self.selector!r} is invalid: expected a selector name, a callable "
                            "(x, k) -> (values, indices), or None")
        if isinstance(self.memory, str) and self.memory not in MEMORIES:
            raise ValueError(f"memory={self.memory!r} is invalid: expected one of {', '.join(MEMORIES)}, "
                             "None or a factory (numel, rule, device) -> memory")
        if self.memory is not None and not isinstance(self.memory, str) and not callable(self.memory):
            raise TypeError(f"memory={self.memory!r} is invalid: expected 'residual', None or a factory")
        if self.algorithm is not None and not isinstance(self.algorithm, str):
            raise TypeError(f"algorithm={self.algorithm!r} has type {type(self.algorithm).__name__}: "
                            "expected a pattern name of the collective or None")
        for fname in ("requires_lossless",):
            if not isinstance(getattr(self, fname), bool):
                raise TypeError(f"{fname}={getattr(self, fname)!r} has type "
                                f"{type(getattr(self, fname)).__name__}: expected bool")
        if not isinstance(self.description, str):
            raise TypeError(f"description={self.description!r} has type {type(self.description).__name__}: "
                            "expected str")
        _positive_int("sync_every", self.sync_every)
        for fname in ("outer_optimizer", "time_s", "bytes_per_rank", "check_options", "preset_options"):
            value = getattr(self, fname)
            if value is not None and not callable(value):
                raise TypeError(f"{fname}={value!r} is invalid: expected a callable or None")
        if not isinstance(self.options, Mapping):
            raise TypeError(f"options={self.options!r} is invalid: expected a mapping name -> default")
        for key, default in self.options.items():
            if not isinstance(key, str) or not isinstance(default, OPTION_TYPES):
                raise ValueError(f"options[{key!r}]={default!r} is invalid: expected a str name and a "
                                 "bool, int, float or str default")
        object.__setattr__(self, "options", dict(self.options))
        if self.paper_selector is not None and not isinstance(self.paper_selector, str):
            raise TypeError(f"paper_selector={self.paper_selector!r} has type "
                            f"{type(self.paper_selector).__name__}: expected a selector name or None")
        if not isinstance(self.config_defaults, Mapping) or any(
                not isinstance(key, str) or not isinstance(value, OPTION_TYPES)
                for key, value in self.config_defaults.items()):
            raise ValueError(f"config_defaults={self.config_defaults!r} is invalid: expected a mapping of "
                             "RunConfig field names to bool, int, float or str values")
        object.__setattr__(self, "config_defaults", dict(self.config_defaults))
        if isinstance(self.departures, str) or not all(isinstance(d, str) for d in self.departures):
            raise TypeError(f"departures={self.departures!r} is invalid: expected a tuple of str")
        object.__setattr__(self, "departures", tuple(self.departures))
        self._check_display()

    def _check_display(self) -> None:
        """The display facts' types and forms (``ValueError`` / ``TypeError`` naming the field)."""
        for fname in ("family", "color", "kind"):
            if not isinstance(getattr(self, fname), str):
                raise TypeError(f"{fname}={getattr(self, fname)!r} has type "
                                f"{type(getattr(self, fname)).__name__}: expected str")
        if self.color and not _is_hex_color(self.color):
            raise ValueError(f"color={self.color!r} is invalid: expected '#rrggbb' or '' (the registry picks one)")
        if self.kind and self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r} is invalid: expected one of {', '.join(KINDS)} or ''")
        if self.order is not None and (isinstance(self.order, bool) or not isinstance(self.order, int)):
            raise TypeError(f"order={self.order!r} has type {type(self.order).__name__}: expected int or None")

    # --- the resolved parts (valid after register_method) ------------------------------------
    @property
    def comm(self) -> Collective:
        """The resolved :class:`Collective`."""
        return self.resolved["collective"]

    @property
    def select(self) -> Selector | None:
        """The resolved selector callable (None for dense-input collectives)."""
        return self.resolved["selector"]

    @property
    def exact_k(self) -> bool:
        """True when the selector always returns exactly k distinct indices."""
        return bool(self.resolved["exact_k"])

    @property
    def sparse(self) -> bool:
        """True when the collective takes every rank's selection (``input="sparse"``)."""
        return self.comm.input == "sparse"

    @property
    def selects(self) -> bool:
        """True when the method's step selects (on every rank, or on the call's leader for an
        ``input="leader"`` collective): a selector applies, and its time is charged."""
        return self.comm.input in ("sparse", "leader")

    @property
    def compresses(self) -> bool:
        """True when a rank pays a selection before the wire: its step selects
        (:attr:`selects`) or its collective compresses (``Collective.compresses``); that time
        is calibrated and charged as the rank's selection."""
        return self.selects or self.comm.compresses

    @property
    def dense(self) -> bool:
        """True when density does not apply to the method (``kind == "dense"``; tables show "-")."""
        return (self.kind or ("sparse" if self.selects else "dense")) == "dense"

    @property
    def patterns(self) -> tuple[str, ...]:
        """The message patterns a run of this method may choose (() when it fixes its own)."""
        return () if self.algorithm is not None else self.comm.algorithms

    @property
    def local_steps(self) -> bool:
        """True for infrequent synchronisation (H > 1 or an outer optimiser)."""
        return self.sync_every > 1 or self.outer_optimizer is not None

    def run_options(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The method's options for a run: each declared default, replaced by ``extra[name]``
        when present (``ValueError`` naming the entry when its type does not match; an int is
        accepted for a float). Keys of ``extra`` the method does not declare are ignored
        (``extra`` holds other settings too)."""
        declared = dict(self.options)
        if self.local_steps:
            declared.setdefault("sync_every", self.sync_every)
        extra = extra or {}
        out: dict[str, Any] = {}
        for key, default in declared.items():
            value = extra.get(key, default)
            if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if isinstance(value, bool) != isinstance(default, bool) or not isinstance(value, type(default)):
                raise ValueError(f"method_options {key}={value!r} is invalid for method {self.name!r}: expected "
                                 f"{type(default).__name__} (default {default!r})")
            if key == "sync_every":
                _positive_int("method_options sync_every", value)
            out[key] = value
        return out

    def formula_kwargs(self, options: Mapping[str, Any] | None,
                       layout: Sequence[Sequence[int]]) -> dict[str, Any]:
        """The keywords this method's formulas need beyond the model size for a run with
        ``options`` (its ``method_options``) on parameters of shapes ``layout``
        (``Collective.formula_inputs``; {} for every formula that needs none)."""
        inputs = self.comm.formula_inputs
        return {} if inputs is None else dict(inputs(dict(options or {}), layout))

    def pattern_for(self, requested: str | None) -> str | None:
        """The message pattern a run asking for ``requested`` uses: the method's own where it
        fixes one (Ok-Topk's), else ``requested`` (or the first) where its collective has
        patterns (gTop-k's), else None (Top-k's allgather); ``ValueError`` for one it lacks."""
        return self.comm.algorithm_for(self.algorithm or requested)

    def predicted_time_s(self, net: Any, numel: int, k: int, workers: int, **kwargs: Any) -> float:
        """Alpha-beta(-gamma) time of one synchronisation (the method's or its collective's)."""
        fn = self.time_s or self.comm.time_s
        kwargs.setdefault("exact_k", self.exact_k)
        kwargs["algorithm"] = self.pattern_for(kwargs.get("algorithm"))
        return fn(net, numel, k, workers, **kwargs)

    def predicted_bytes_per_rank(self, numel: int, k: int, workers: int, pair_bytes: int = 8,
                                 algorithm: str | None = None, **formula: Any) -> float:
        """Bytes one rank sends per synchronisation (payload; the method's or its collective's);
        ``formula``: what it needs beyond the model size (:meth:`formula_kwargs`)."""
        fn = self.bytes_per_rank or self.comm.bytes_per_rank
        return fn(numel, k, workers, pair_bytes, self.pattern_for(algorithm), **formula)

    def summary(self) -> dict[str, Any]:
        """One row for ``gtopk-lab methods`` and the ControlPanel."""
        sel = self.selector if isinstance(self.selector, str) or self.selector is None else getattr(
            self.selector, "__name__", "callable")
        return {"method": self.name, "selector": sel or "-", "collective": self.comm.name,
                "memory": self.memory if isinstance(self.memory, str) or self.memory is None else "custom",
                "exact_k": self.exact_k, "sync_every": self.sync_every, "options": dict(self.options),
                "patterns": ",".join(self.comm.algorithms) or "-", "description": self.described(),
                "departures": list(self.departures)}

    def described(self) -> str:
        """The description with the departures from the paper appended (what the CLI shows)."""
        if not self.departures:
            return self.description
        return f"{self.description}; departs from the paper: {'; '.join(self.departures)}"

    def with_parts(self, **resolved: Any) -> "Method":
        """A copy carrying its resolved parts (used by the registry)."""
        return dataclasses.replace(self, resolved=dict(resolved))
